"""The real transformers 5.19.0 engine as a target: pin, outputs, the fatal error, the time limit, the
property step checks, and conformance with the `hf_cb` model in lockstep (targets/conformance.py `Lockstep`)."""

from __future__ import annotations

import dataclasses
import os
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
from targets.transformers_cb import DEADLOCK, SUPPORTED, TransformersTarget, greedy_reference


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

    monkeypatch.setattr(transformers, "__version__", "5.18.0")
    with pytest.raises(TargetUnavailable) as exc:
        TransformersTarget(hf())
    msg = str(exc.value)
    assert "\n" not in msg and all(v in msg for v in SUPPORTED) and "found 5.18.0" in msg


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


def _workload(rng: random.Random) -> tuple[EngineConfig, list]:
    """A small seeded workload for the step checks: a configuration transformers accepts, a few requests
    (some in a prefix group), steps and a cancellation between them, then steps until done."""
    cfg = hf(block_size=rng.choice([4, 8]), num_blocks=rng.randint(4, 16), max_num_tokens=rng.randint(8, 32),
             max_batch_size=rng.randint(2, 6), scheduler_type=rng.choice(["fifo", "prefill_first"]))
    actions: list = []
    for rid in range(rng.randint(1, 5)):
        prompt = rng.randint(1, cfg.num_blocks * cfg.block_size)
        group = rng.choice([-1, -1, 0])
        actions.append(Add(rid, prompt, rng.randint(1, 8), group, rng.randint(1, prompt) if group >= 0 else 0))
        actions += [Step()] * rng.randint(0, 3)
        if rng.random() < 0.2:
            actions.append(Cancel(rng.randint(0, rid)))
    return cfg, actions + [Step()] * 60


@pytest.mark.parametrize("seed", range(6))
def test_property_step_checks_hold_on_the_engine(seed):
    cfg, actions = _workload(random.Random(f"props:{seed}"))
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
            assert t.conformance_check(obs) is None, t.conformance_check(obs).message
            prev = obs.state
            if obs.state.error or all(r.phase.terminal for r in obs.state.requests):
                break
    finally:
        t.close()


CONFORMANCE_WORKLOADS = {"ci": 100, "nightly": 1000}


def test_conformance_in_lockstep_with_the_model():
    """The `hf_cb` model beside the engine over Hypothesis workloads (targets/lockstep.py), every step compared;
    the one documented divergence is excused by its predicate, anything else fails with its shrunk actions."""
    from targets.lockstep import conformance as lockstep_run

    n = CONFORMANCE_WORKLOADS[os.environ.get("SCHEDPROOF_PROFILE", "ci")]
    result = lockstep_run("transformers", n, seed=0)
    assert result.divergence is None, "\n".join(result.lines())
    assert result.tally.workloads >= n
    for event in ("prefix-cache hit", "preemption", "cancellation", "request finished"):
        assert result.tally.covered[event] > 0, (event, result.tally.covered)


def test_documented_divergence_is_excused_by_looking_at_the_divergence():
    # docs/conformance.md HF-IDENTICAL-CONTEXT-DEDUP: the engine also de-duplicates the output blocks of two
    # requests with one whole prompt (cache_allocator.py:290-311); the model shares only the group prefix.
    cfg = hf(num_blocks=16, max_num_tokens=32)
    actions = [Add(0, 8, 10, 0, 8), Add(1, 8, 10, 0, 8)] + [Step()] * 5
    t = TransformersTarget(cfg)
    try:
        for a in actions:
            t.apply(a)
        assert t.excused == "HF-IDENTICAL-CONTEXT-DEDUP" and t.divergence is None
    finally:
        t.close()
    # the predicate looks at the divergence: r1 holding fewer blocks on the engine is it; the scheduled list,
    # r0 (no earlier twin), more blocks on the engine, or block sharing off is not
    explains = conformance.identical_context_dedup
    assert explains(cfg, actions, conformance.Divergence(4, "r1.blocks", 3, 2))
    assert not explains(cfg, actions, conformance.Divergence(4, "scheduled", ((0, 1),), ((1, 1),)))
    assert not explains(cfg, actions, conformance.Divergence(4, "r0.blocks", 3, 2))
    assert not explains(cfg, actions, conformance.Divergence(4, "r1.blocks", 2, 3))
    assert not explains(hf(num_blocks=16, max_num_tokens=32, allow_block_sharing=False), actions,
                        conformance.Divergence(4, "r1.blocks", 3, 2))
    # the same requests with distinct prompts agree step by step
    t = TransformersTarget(cfg)
    try:
        for a in [Add(0, 8, 10, 0, 6), Add(1, 8, 10, 0, 6)] + [Step()] * 20:
            obs = t.apply(a)
            assert obs is None or t.conformance_check(obs) is None
        assert t.excused is None
    finally:
        t.close()


def test_an_empty_prompt_soft_reset_loses_the_tokens_it_generated_before():
    """docs/findings/README.md, transformers 4: requests.py:288 and :347 test `_true_initial_tokens` for truth, so an
    empty prompt that is soft reset reports only the tokens generated after the reset. The target counts what the
    request produced from the prompt it submitted, so model and engine agree step by step; the output oracle
    catches the short output."""
    from targets.checking import replay

    cfg = hf(block_size=4, num_blocks=3, max_num_tokens=5, max_batch_size=2)
    t = TransformersTarget(cfg)
    try:
        result = replay(t, cfg, [Add(0, 8, 2), Step(), Add(1, 0, 2), Step(), Step(), Step()], t.greedy_output)
        assert result.violation is not None and result.violation.property == "ORACLE-GREEDY-OUTPUT"
        assert result.violation.step == 3 and "finished with 1 tokens, not max_new 2" in result.violation.message
        assert t.divergence is None and t.excused is None
    finally:
        t.close()
