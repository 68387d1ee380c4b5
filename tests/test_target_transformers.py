"""The real transformers 5.19.0 engine as a target: pin, outputs, the fatal error, the time limit, the
property step checks, and step-by-step conformance with the `hf_cb` model (targets/conformance.py)."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from model.config import EngineConfig
from model.policies.hf_cb import DEFAULT_SAFETY_MARGIN, Options  # noqa: F401
from model.state import Phase, Request, State
from properties import REGISTRY
from targets import conformance
from targets.protocol import Add, Cancel, Step, TargetHung, TargetUnavailable
from targets.reference import ReferenceTarget
from targets.transformers_cb import DEADLOCK, PINNED, TransformersTarget, greedy_reference


def hf(block_size=4, num_blocks=8, max_num_tokens=16, max_batch_size=4, **options) -> EngineConfig:
    return EngineConfig(policy="hf_cb", block_size=block_size, num_blocks=num_blocks, max_num_tokens=max_num_tokens,
                        max_batch_size=max_batch_size, chunked_prefill=True, options=Options(**options))


def drive(target, actions, limit=400):
    """Apply the actions, then step until every request is answered (or the limit); observations."""
    obs = [o for o in (target.apply(a) for a in actions) if o is not None]
    for _ in range(limit):
        if obs and (obs[-1].state.error or all(r.phase.terminal for r in obs[-1].state.requests)):
            break
        obs.append(target.step())
    return obs


def test_version_pin_refuses_any_other_transformers(monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "5.20.0")
    with pytest.raises(TargetUnavailable) as exc:
        TransformersTarget(hf())
    msg = str(exc.value)
    assert "\n" not in msg and f"transformers=={PINNED}" in msg and "5.20.0" in msg


def test_outputs_equal_greedy_generate_through_soft_resets():
    cfg = hf(num_blocks=4, max_num_tokens=8)   # 3 requests of 5+8 tokens overflow 16 slots: soft resets
    adds = [Add(0, 5, 8), Add(1, 5, 8), Add(2, 3, 6, prefix_group=0, prefix_len=2)]
    t = TransformersTarget(cfg)
    try:
        obs = drive(t, adds + [Step()])
    finally:
        t.close()
    final = obs[-1].state
    assert [r.phase for r in final.requests] == [Phase.FINISHED] * 3
    assert any(o.record.preempted for o in obs), "the workload is meant to soft reset a request"
    outputs = {rid: toks for o in obs for rid, toks in o.outputs.items()}
    for a in adds:
        assert outputs[a.rid] == greedy_reference(a), f"r{a.rid}"
        assert final.req(a.rid).generated == a.max_new


def test_fatal_error_is_a_deadlock_record_and_fails_every_unanswered_request():
    # r0 needs 4 + 8 - 1 = 11 tokens of KV on a pool of 8: alone and starved it cannot be offloaded (OM:183),
    # r1 waits behind it: continuous_api.py:509 raises and every request still owed an answer fails.
    cfg = hf(num_blocks=2, max_num_tokens=8)
    actions = [Add(0, 4, 8), Step(), Step(), Add(1, 2, 4), Step()]
    t = TransformersTarget(cfg)
    try:
        obs = drive(t, actions)
        err = [o for o in obs if o.record.error]
        assert len(err) == 1
        rec, state = err[0].record, err[0].state
        assert rec.error == DEADLOCK and rec.error_kind == "deadlock"
        assert sorted(rec.failed) == [0, 1]
        assert all(r.phase == Phase.FAILED and r.reason == DEADLOCK and r.blocks == 0 for r in state.requests)
        assert state.error == DEADLOCK
        after = t.step()   # the engine is dead from here on, as the model's state is
        assert after.record.scheduled == () and after.state.error == DEADLOCK
    finally:
        t.close()
    ref = drive(ReferenceTarget(cfg), actions)
    assert [o.record.error_kind for o in ref] == [o.record.error_kind for o in obs]


@pytest.mark.parametrize("watchdog", ["alarm", "thread"])
def test_a_step_past_the_time_limit_raises_target_hung(monkeypatch, watchdog):
    t = TransformersTarget(hf(), step_timeout_s=0.05)
    t.watchdog = watchdog
    orig = t._engine_step
    monkeypatch.setattr(t, "_engine_step", lambda: (time.sleep(0.5), orig())[1])
    t.add(Add(0, 3, 2))
    start = time.monotonic()
    with pytest.raises(TargetHung):
        t.step()
    assert time.monotonic() - start < 0.4
    with pytest.raises(TargetHung):   # the target is unusable afterwards
        t.step()
    time.sleep(0.6)   # let the worker finish before the engine is released
    t.close()


STEP_CHECKS = [p for p in REGISTRY.values() if p.step_check is not None]


def _aligned(prev: State, cur: State) -> State:
    """Requests submitted since the previous step, in their submitted (PENDING) form."""
    extra = tuple(Request(rid=r.rid, prompt=r.prompt, max_new=r.max_new, arrival=0, prefix_group=r.prefix_group,
                          prefix_len=r.prefix_len) for r in cur.requests[len(prev.requests):])
    return dataclasses.replace(prev, requests=prev.requests + extra)


@pytest.mark.parametrize("seed", range(6))
def test_property_step_checks_hold_on_the_engine(seed):
    cfg, actions = conformance.random_actions(random.Random(f"props:{seed}"))
    t = TransformersTarget(cfg)
    try:
        prev = None
        for a in actions:
            obs = t.apply(a)
            if obs is None:
                continue
            p = _aligned(prev if prev is not None else dataclasses.replace(obs.state, requests=()), obs.state)
            for prop in STEP_CHECKS:
                msg = prop.step_check(cfg, p, obs.record, obs.state)
                if prop.id == "ENGINE-ERROR":
                    assert bool(msg) == bool(obs.record.error)
                else:
                    assert msg is None, f"{prop.id} at step {obs.record.step}: {msg}"
            prev = obs.state
            if obs.state.error or all(r.phase.terminal for r in obs.state.requests):
                break
    finally:
        t.close()


CONFORMANCE_WORKLOADS = 40


def test_conformance_with_the_model_on_random_workloads():
    unexplained = []
    for i in range(CONFORMANCE_WORKLOADS):
        cfg, actions = conformance.workload(7, i)
        d = conformance.first_divergence(cfg, actions)
        if d is not None and conformance.known_divergence(cfg, actions, d) is None:
            unexplained.append(f"workload {i}: {conformance.as_code(cfg, actions)}\n{d}")
    assert not unexplained, "\n\n".join(unexplained)


def test_documented_divergence_identical_contexts_is_still_the_only_one():
    # docs/conformance.md HF-IDENTICAL-CONTEXT-DEDUP: the engine also de-duplicates the output blocks of two
    # requests with one whole prompt (cache_allocator.py:290-311); the model shares only the group prefix.
    cfg = hf(num_blocks=16, max_num_tokens=32)
    actions = [Add(0, 8, 10, 0, 8), Add(1, 8, 10, 0, 8)] + [Step()] * 5
    d = conformance.first_divergence(cfg, actions)
    assert d is not None and d.step == 4 and d.field == "r1.blocks"
    assert conformance.known_divergence(cfg, actions, d) == "HF-IDENTICAL-CONTEXT-DEDUP"
    # the same requests with distinct prompts agree step by step
    assert conformance.first_divergence(cfg, [Add(0, 8, 10, 0, 6), Add(1, 8, 10, 0, 6)] + [Step()] * 20) is None
