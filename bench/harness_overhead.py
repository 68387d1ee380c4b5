"""Harness overhead per engine step: the bare transformers step against the same step through the
`transformers` target (observation in the model's vocabulary) and the property checks, and against
that with the `hf_cb` policy in lockstep beside the engine (the target's default since 2026-12-02),
side by side in one run, as ratios.

    .venv/bin/python bench/harness_overhead.py [--repeats 7]

All sides run the same workload on engines built from the same configuration; the runs alternate
(bare, harness, harness with lockstep, bare, ...) so drift on the machine hits both alike; the median of the per-step
times over the repeats is reported. The greedy output oracle (`model.generate` per finished
request) is timed apart: it is a per-request cost, not a per-step one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.config import EngineConfig  # noqa: E402
from model.policies import hf_cb  # noqa: E402
from targets.checking import StepChecker  # noqa: E402
from targets.protocol import Add, prompt_tokens  # noqa: E402
from targets.transformers_cb import VOCAB, TransformersTarget, greedy_reference, tiny_model  # noqa: E402

CFG = EngineConfig(policy="hf_cb", block_size=8, num_blocks=24, max_num_tokens=64, max_batch_size=8,
                   chunked_prefill=True, options=hf_cb.Options())
ADDS = [Add(k, 12 + 7 * k, 16) for k in range(8)]     # 8 requests; the pool forces a few soft resets


def bare_run() -> tuple[float, int]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    manager = tiny_model().init_continuous_batching(
        generation_config=GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=-1, pad_token_id=0),
        continuous_batching_config=ContinuousBatchingConfig(
            num_blocks=CFG.num_blocks, page_size=CFG.block_size, max_batch_tokens=CFG.max_num_tokens,
            max_requests_per_batch=CFG.max_batch_size, cpu_offload_space=0.0, seed=0))
    bp = manager.batch_processor = manager._create_batch_processor()
    for a in ADDS:
        manager.add_request(prompt_tokens(a, VOCAB), request_id=f"r{a.rid}", max_new_tokens=a.max_new)
    steps, start = 0, time.perf_counter()
    while bp.prepare_next_batch() or bp.scheduler.has_pending_requests():
        if bp.inputs_and_outputs.requests_in_batch:
            bp._generation_step(manager.model)
            bp.update_batch()
        steps += 1
        if steps > 2000:
            raise RuntimeError("bare engine did not finish")
    return time.perf_counter() - start, steps


def harness_run(lockstep: bool) -> tuple[float, int]:
    target = TransformersTarget(CFG, lockstep=lockstep)
    checker = StepChecker(CFG)
    for a in ADDS:
        checker.submitted(a)
        target.add(a)
    steps, start = 0, time.perf_counter()
    while True:
        obs = target.step()
        steps += 1
        assert checker.check(obs) is None
        if all(r.phase.terminal for r in obs.state.requests):
            break
        if steps > 2000:
            raise RuntimeError("harness run did not finish")
    elapsed = time.perf_counter() - start
    target.close()
    return elapsed, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    tiny_model()
    bare_run(), harness_run(False), harness_run(True)   # warm-up: imports, first forward passes
    bare, harness, lockstep = [], [], []
    for _ in range(args.repeats):
        t, n = bare_run()
        bare.append(t / n)
        t, m = harness_run(False)
        harness.append(t / m)
        t, m = harness_run(True)
        lockstep.append(t / m)
    start = time.perf_counter()
    for a in ADDS:
        greedy_reference(a)
    oracle = (time.perf_counter() - start) / len(ADDS)
    b, h, x = statistics.median(bare), statistics.median(harness), statistics.median(lockstep)
    print(f"steps per run: bare {n}, harness {m}")
    print("| measure | per step (ms) | ratio to bare |")
    print("|---|---|---|")
    print(f"| bare engine step | {b * 1e3:.3f} | 1.00 |")
    print(f"| target step + observation + property checks | {h * 1e3:.3f} | {h / b:.2f} |")
    print(f"| the same with the hf_cb policy in lockstep | {x * 1e3:.3f} | {x / b:.2f} |")
    print(f"| greedy oracle, per finished request | {oracle * 1e3:.3f} | {oracle / b:.2f} |")


if __name__ == "__main__":
    main()
