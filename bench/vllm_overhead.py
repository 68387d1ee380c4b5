"""Scheduler steps per second through the `vllm` target against the bare scheduler loop, as ratios.

    .venv/bin/python bench/vllm_overhead.py [--repeats 9] [--profile LEVEL | --parts]

The bare loop is what an engineer writes to drive vLLM's V1 `Scheduler` with no harness: the scheduler built
from the same `EngineConfig` by the target's own `_build` (same vLLM configs, same block hasher; taken from a
target built untimed, its preemption recorder removed, and never stepped through the target), the same
vLLM `Request`s (`engine_prompt`, `SamplingParams(max_tokens, ignore_eos)`, arrival time = rid), then
`schedule()` -> a fake `ModelRunnerOutput` (one token, `output_token`, per scheduled request that is not
mid-prefill) -> `update_from_output()` until no request is unfinished. Adding the requests is timed on both
sides (the target adds them inside its first step).

Through the target, three levels, each a whole run of the same workload:
  1. target          `VllmTarget(cfg, lockstep=False)`: every step under its time limit (targets/timing.py),
                     the preemption record, the observation in the `vllm_v1` model's vocabulary;
  2. + checks        the same, plus `StepChecker.check` on every observation (as `replay` does);
  3. + lockstep      `VllmTarget(cfg)` with the `vllm_v1` model beside it and `conformance_check`, plus the
                     checks: how the suite runs the target.
The goal (issue 13: at least 0.8 of the bare loop's steps per second) is judged on level 1, the target
itself; levels 2 and 3 add the suite's oracles and are reported beside it.

The runs alternate (bare, 1, 2, 3, bare, ...) so drift on the machine hits all sides alike; the median of the
per-step times over the repeats is reported. All sides must take the same number of steps, schedule the same
tokens and preempt as often (asserted). `--profile 1|2|3` prints a cProfile of that level instead.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.config import EngineConfig  # noqa: E402
from model.policies.vllm_v1 import Options  # noqa: E402
from targets.checking import StepChecker  # noqa: E402
from targets.protocol import Add  # noqa: E402
from targets.vllm_v1 import VllmTarget, engine_prompt, output_token  # noqa: E402

# 16 requests, prompts 24..183 tokens, 32..64 new tokens, half of them in 4 shared-prefix groups (32 tokens);
# 16-token blocks, 24 blocks (23 usable: 368 tokens for 2,216 tokens of work), a 128-token budget with chunked
# prefill, 8 sequences at most, prefix caching on (vLLM's default): 319 steps, 8 recompute preemptions.
CFG = EngineConfig(policy="vllm_v1", block_size=16, num_blocks=24, max_num_tokens=128, max_batch_size=8,
                   chunked_prefill=True, options=Options(max_model_len=256, async_scheduling=False))
ADDS = [Add(k, 24 + (37 * k) % 160, 32 + 8 * (k % 5), prefix_group=k % 4 if k % 2 == 0 else -1, prefix_len=32)
        for k in range(16)]
LIMIT = 5000


@dataclasses.dataclass
class Run:
    seconds: float
    steps: int
    tokens: int        # scheduled tokens, all steps
    preemptions: int


def bare_run() -> Run:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    built = VllmTarget(CFG, lockstep=False)           # its `_build`: the same vLLM configs and block hasher
    sched = built.sched
    sched.__dict__.pop("_preempt_request", None)      # drop the target's preemption recorder: vLLM's own method
    steps = tokens = 0
    start = time.perf_counter()
    reqs = [Request(f"r{a.rid}", engine_prompt(a), SamplingParams(max_tokens=a.max_new, ignore_eos=True), None,
                    arrival_time=float(a.rid), priority=a.priority, block_hasher=built._hasher) for a in ADDS]
    for r in reqs:
        sched.add_request(r)
    while sched.has_unfinished_requests():
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        toks = []
        for i in ids:
            r = sched.requests[i]
            toks.append([] if r.is_prefill_chunk else [output_token(int(i[1:]), r.num_output_tokens)])
        sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                                       sampled_token_ids=toks))
        steps += 1
        tokens += so.total_num_scheduled_tokens
        if steps > LIMIT:
            raise RuntimeError("the bare loop did not finish")
    seconds = time.perf_counter() - start
    return Run(seconds=seconds, steps=steps, tokens=tokens, preemptions=sum(r.num_preemptions for r in reqs))


def target_run(level: int) -> Run:
    target = VllmTarget(CFG, lockstep=level >= 3)
    checker = StepChecker(CFG) if level >= 2 else None
    for a in ADDS:
        if checker is not None:
            checker.submitted(a)
        target.add(a)
    steps = tokens = answered = 0
    start = time.perf_counter()
    while True:
        obs = target.step()
        steps += 1
        tokens += obs.record.charged
        if checker is not None:
            v = checker.check(obs)
            assert v is None, v
        if level >= 3:
            v = target.conformance_check(obs)
            assert v is None, v
        # the loop's own test in O(1), as the bare loop's `has_unfinished_requests()` (scanning the observed
        # requests every step cost the target's side 1-3 us a step); every request FINISHED is asserted below
        answered += len(obs.record.finished) + len(obs.record.failed) + len(obs.record.rejected)
        if answered == len(ADDS):
            break
        if steps > LIMIT:
            raise RuntimeError("the target run did not finish")
    seconds = time.perf_counter() - start
    target.close()
    assert all(r.phase.name == "FINISHED" for r in obs.state.requests), obs.state.requests
    return Run(seconds=seconds, steps=steps, tokens=tokens, preemptions=sum(r.preemptions for r in obs.state.requests))


LEVELS = {1: "target (time limit + observation)", 2: "target + property checks",
          3: "target + property checks + lockstep model (as the suite runs it)"}


def profile(level: int, runs: int) -> None:
    target_run(level)   # warm-up
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        target_run(level)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


PARTS = {"_run_timed": "the step under its time limit", "_engine_step": "schedule -> output -> update_from_output",
         "_state": "the observation"}


def parts(repeats: int) -> None:
    """Where a level-1 target step's time goes: each part's wall time per step, measured by wrapping the target
    instance's methods (the wrappers' own cost, about a microsecond a call, is included)."""
    spent = dict.fromkeys(PARTS, 0.0)
    total = steps = 0
    original = VllmTarget.__init__

    def timed(target, name):
        inner = getattr(target, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        setattr(target, name, wrapper)

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for name in PARTS:
            timed(self, name)

    target_run(1)       # warm-up
    VllmTarget.__init__ = init
    try:
        for _ in range(repeats):
            run = target_run(1)
            total, steps = total + run.seconds, steps + run.steps
    finally:
        VllmTarget.__init__ = original
    step, timed_step, engine, obs = (x / steps * 1e6 for x in (total, spent["_run_timed"], spent["_engine_step"],
                                                                spent["_state"]))
    print(f"level-1 target step, {steps} steps: {step:.0f} us per step")
    print("| part | us per step |")
    print("|---|---|")
    print(f"| vLLM's step and the fake model (`_engine_step`) | {engine:.0f} |")
    print(f"| the time limit around it, arrivals and cancellations (`_run_timed` less the step) | "
          f"{timed_step - engine:.0f} |")
    print(f"| the observation (`_state`) | {obs:.0f} |")
    print(f"| the rest of `step` (record, finished requests, lockstep hook) | {step - timed_step - obs:.0f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--profile", type=int, choices=sorted(LEVELS), help="print a cProfile of one level instead")
    parser.add_argument("--parts", action="store_true", help="print where a level-1 target step's time goes instead")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.profile:
        profile(args.profile, max(args.repeats, 1))
        return
    if args.parts:
        parts(args.repeats)
        return
    bare_run(), [target_run(level) for level in LEVELS]   # warm-up: imports, ModelConfig, first steps
    per_step: dict[object, list[float]] = {"bare": [], **{level: [] for level in LEVELS}}
    runs: dict[object, Run] = {}
    for _ in range(args.repeats):
        for side in per_step:
            run = bare_run() if side == "bare" else target_run(side)
            per_step[side].append(run.seconds / run.steps)
            runs[side] = run
    b = runs["bare"]
    for side, run in runs.items():
        assert (run.steps, run.tokens, run.preemptions) == (b.steps, b.tokens, b.preemptions), \
            f"{side} did different scheduling work: steps/tokens/preemptions {run} vs bare {b}"
    med = {side: statistics.median(v) for side, v in per_step.items()}
    print(f"{len(ADDS)} requests, {b.steps} steps per run on every side, {b.tokens} tokens scheduled, "
          f"{b.preemptions} recompute preemptions; median of {args.repeats} runs each")
    print("| measure | steps/s | per step (ms) | ratio to bare |")
    print("|---|---|---|---|")
    print(f"| bare scheduler loop | {1 / med['bare']:.0f} | {med['bare'] * 1e3:.3f} | 1.00 |")
    for level, name in LEVELS.items():
        print(f"| ({level}) {name} | {1 / med[level]:.0f} | {med[level] * 1e3:.3f} | {med['bare'] / med[level]:.2f} |")
    ratio = med["bare"] / med[1]
    # the spread: the ratio of each repeat's bare run to the level-1 run right after it
    paired = sorted(b_ / t for b_, t in zip(per_step["bare"], per_step[1]))
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
    print(f"level 1, per repeat: min {paired[0]:.2f}, quartiles {quartiles[0]:.2f} / {quartiles[1]:.2f} / "
          f"{quartiles[2]:.2f}, max {paired[-1]:.2f}")
    print(f"goal (level 1, the target itself): ratio >= 0.80; measured {ratio:.2f} "
          f"({'met' if ratio >= 0.8 else 'NOT met'})")


if __name__ == "__main__":
    main()
