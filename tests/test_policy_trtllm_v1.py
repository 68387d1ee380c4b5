"""trtllm_v1: one test per mirrored rule (S = scheduler.py@002f3cc3), the scenario expectations,
and the safety properties on seeded random workloads."""

import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401
from model.config import EngineConfig
from model.policy import POLICIES, Env, Plan
from model.policies.trtllm_v1 import Options, pool_blocks_from_max_tokens, reuse_adjusted
from model.simulator import RequestSpec, Workload, initial_state, simulate
from model.state import Phase, PrefixEntry
from properties import evaluate
from schedproof.runner import run_scenario
from schedproof.scenario import load

P = POLICIES["trtllm_v1"]
ROOT = Path(__file__).resolve().parent.parent


def cfg(num_blocks=64, max_num_tokens=256, max_batch_size=8, chunked=False, block_size=16, **opts):
    return EngineConfig("trtllm_v1", block_size, num_blocks, max_num_tokens, max_batch_size,
                        chunked_prefill=chunked, options=Options(**opts))


def start(c, specs):
    """All requests arrived, nothing scheduled yet."""
    state = initial_state(c, Workload(tuple(specs)))
    return P.arrive(c, state, range(len(specs)), Plan())


def plan_of(c, state):
    plan = Plan()
    new = P.schedule(c, state, plan)
    return new, plan


def test_pool_conversion_v1_has_no_inflation():
    assert pool_blocks_from_max_tokens(8192, 32) == 256
    assert pool_blocks_from_max_tokens(8200, 32) == 257   # ceil (unconfirmed rounding)


def test_reuse_adjusted_compute():
    assert reuse_adjusted(100, 0, 100) == 100
    assert reuse_adjusted(100, 60, 300) == 100     # non-last chunk: full size
    assert reuse_adjusted(300, 96, 300) == 204     # last chunk: remaining - reusable
    assert reuse_adjusted(10, 96, 100) == 4


def test_gne_admits_by_worst_case_blocks_and_breaks_head_of_line():
    # 18 blocks of 16: r0 reserves ceil((16+250)/16)=17, r1 needs 2 > 1 -> break; r2 (1 block)
    # would fit but stands behind r1 (head-of-line)
    c = cfg(num_blocks=18)
    state = start(c, [RequestSpec(16, 250), RequestSpec(16, 8), RequestSpec(8, 4)])
    new, plan = plan_of(c, state)
    assert [s.rid for s in plan.scheduled] == [0]
    # with room for r0's worst case plus r1's, both go (GNE reserves, not allocates)
    c2 = cfg(num_blocks=19)
    new, plan = plan_of(c2, start(c2, [RequestSpec(16, 250), RequestSpec(16, 8), RequestSpec(8, 4)]))
    assert [s.rid for s in plan.scheduled] == [0, 1]


def test_gne_generation_scheduled_unconditionally():
    c = cfg(num_blocks=18)
    state = start(c, [RequestSpec(16, 250), RequestSpec(16, 8)])
    state, _ = P.step(c, state, Env())
    assert state.req(0).phase == Phase.DECODING
    new, plan = plan_of(c, state)
    assert [s.rid for s in plan.scheduled] == [0]


def mu_state(c):
    # two decoding requests that fill the pool exactly; the next decode step needs a new block
    state = start(c, [RequestSpec(16, 40), RequestSpec(16, 40)])
    for _ in range(20):
        state, rec = P.step(c, state, Env())
        if rec.preempted:
            return state, rec
    raise AssertionError("no pause")


def test_max_utilization_pauses_last_started_request():
    c = cfg(num_blocks=4, capacity_scheduler_policy="max_utilization")
    state, rec = mu_state(c)
    assert rec.preempted == (1,)          # the newest started request, never the requester r0
    r1 = state.req(1)
    assert r1.phase == Phase.PREEMPTED and r1.blocks == 0 and r1.computed == 0
    assert r1.generated > 0 and [rid for rid, _ in rec.scheduled] == [0]


def test_max_utilization_pause_caps_replay_at_max_input_len():
    c = cfg(num_blocks=4, capacity_scheduler_policy="max_utilization", max_input_len=20)
    state, rec = mu_state(c)
    assert state.req(1).generated == 4     # 16 + generated capped at 20: later tokens dropped
    assert any("dropped at max_input_len" in n for n in rec.notes)


def test_micro_batch_breaks_at_token_budget():
    c = cfg(max_num_tokens=40)
    state = start(c, [RequestSpec(16, 4), RequestSpec(16, 4), RequestSpec(16, 4)])
    new, plan = plan_of(c, state)
    assert [s.rid for s in plan.scheduled] == [0, 1] and plan.charged == 32 and not plan.error


def test_draft_tokens_are_charged_for_generation():
    c = cfg(max_num_tokens=9, draft_len=2)
    big = cfg(max_num_tokens=18, draft_len=2)
    state = start(big, [RequestSpec(4, 100), RequestSpec(4, 100), RequestSpec(4, 100)])
    for _ in range(50):
        if all(state.req(i).phase == Phase.DECODING for i in range(3)):
            break
        state, rec = P.step(big, state, Env())
    new, plan = plan_of(c, state)
    assert [(s.rid, s.tokens, s.draft) for s in plan.scheduled] == [(0, 1, 2), (1, 1, 2), (2, 1, 2)]
    assert plan.charged == 9
    c2 = cfg(max_num_tokens=8, draft_len=2)
    new, plan = plan_of(c2, state)
    assert len(plan.scheduled) == 2 and plan.charged == 6


def with_group_prefix(c, prompt, prefix):
    """r0 of a prefix group computed its context (and donated the prefix); r1 of the group just
    arrived, nothing scheduled for it yet."""
    state = initial_state(c, Workload((RequestSpec(prompt, 50, prefix_group=1, prefix_len=prefix),
                                       RequestSpec(prompt, 50, arrival=1, prefix_group=1, prefix_len=prefix))))
    state = P.arrive(c, state, (0,), Plan())
    for _ in range(5):
        if state.req(0).phase == Phase.DECODING:
            break
        state, _ = P.step(c, state, Env())
    return P.arrive(c, state, (1,), Plan())


def test_reuse_adjusted_charge_vs_tokens_run():
    c = cfg(max_num_tokens=128, chunked=True, enable_block_reuse=True)
    state = with_group_prefix(c, 100, 96)
    assert state.prefix_cache == (PrefixEntry(1, 6, 1),)
    new, plan = plan_of(c, state)
    s = {x.rid: x for x in plan.scheduled}
    assert s[1].tokens == 100                  # the forward pass runs the whole chunk
    assert plan.charged == 1 + (100 - 96)      # r0 decode + reuse-adjusted last chunk
    assert new.req(1).shared_blocks == 6 and new.prefix_cache[0].refs == 2
    assert not plan.error


def test_reuse_overshoot_fires_engine_assert():
    c = cfg(max_num_tokens=32, chunked=True, enable_block_reuse=True)
    state = with_group_prefix(c, 50, 50)      # reusable: min(50, 49) // 16 = 3 blocks = 48 tokens
    state, rec = P.step(c, state, Env())
    assert rec.error_kind == "crash" and "total_num_tokens <= self.max_num_tokens" in rec.error
    assert rec.num_tokens == 1 + 50 and rec.charged == 1 + (50 - 48)
    assert all(r.phase == Phase.FAILED for r in state.requests)


def test_no_reuse_keeps_the_budget():
    c = cfg(max_num_tokens=32, chunked=True)
    state = with_group_prefix(c, 50, 50)
    state, rec = P.step(c, state, Env())
    assert not rec.error and rec.scheduled == ((0, 1), (1, 16))   # FCFS: 31 aligned down to 16


@pytest.mark.parametrize("name", ["trtllm-v1-reuse-budget-overshoot", "trtllm-v1-no-reuse-budget-ok",
                                  "trtllm-v1-gne-head-of-line", "trtllm-v1-draft-budget"])
def test_scenario_expectations(name):
    res = run_scenario(load(ROOT / "scenarios" / f"{name}.toml"))
    assert res.matches_expectation() == [], [v.as_dict() for v in res.evaluation.violations]
    if name == "trtllm-v1-reuse-budget-overshoot":
        assert res.evaluation.violated("SAFE-BUDGET") and res.evaluation.violated("ENGINE-ERROR")
    if name == "trtllm-v1-gne-head-of-line":   # the short ones start only once the long one is done
        first = {rid: next(rec.step for rec in res.trace.records if rid in dict(rec.scheduled)) for rid in range(7)}
        done0 = next(rec.step for rec in res.trace.records if 0 in rec.finished)
        assert all(first[rid] > done0 for rid in range(1, 7))
    if name == "trtllm-v1-draft-budget":
        assert max(rec.num_tokens for rec in res.trace.records) <= 64
        assert any(rec.num_tokens == 63 and len(rec.scheduled) == 12 for rec in res.trace.records)


@pytest.mark.parametrize("seed", range(6))
def test_safety_on_random_workloads(seed):
    rng = random.Random(seed)
    policy = ["guaranteed_no_evict", "max_utilization"][seed % 2]
    c = cfg(num_blocks=rng.randint(12, 30), max_num_tokens=rng.choice([64, 128]), chunked=seed % 3 != 0,
            capacity_scheduler_policy=policy, enable_block_reuse=seed % 4 < 2,
            draft_len=rng.choice([0, 2]), max_input_len=10_000)
    specs = tuple(RequestSpec(rng.randint(8, 60), rng.randint(2, 40), arrival=rng.randint(0, 10),
                              prefix_group=g, prefix_len=24 if g >= 0 else 0)
                  for g in (rng.choice([-1, 0, 1]) for _ in range(10)))
    trace = simulate(c, Workload(specs), max_steps=3000)
    ev = evaluate(trace, lambda rid: P.fits_alone(c, trace.states[0].requests[rid]), 20)
    bad = [v.as_dict() for v in ev.violations if v.property in ("SAFE-BLOCKS", "SAFE-REQUESTS", "SAFE-BATCH", "SAFE-NO-LEAK")]
    assert bad == []
