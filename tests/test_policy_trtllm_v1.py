"""trtllm_v1: one test per mirrored rule (S = scheduler.py@002f3cc3), the scenario expectations,
and the safety properties on seeded random workloads."""

import dataclasses
import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401
from helpers import config as any_loop_config, decoding, req, state
from model.config import EngineConfig
from model.policy import POLICIES, Env, Plan
from model.policies import trtllm_v1
from model.policies.trtllm_v1 import Options, pool_blocks_from_max_tokens, reuse_adjusted
from model.simulator import RequestSpec, Workload, initial_state, simulate
from model.state import Phase, PrefixEntry
from properties import evaluate
from schedproof.runner import run_scenario
from schedproof.scenario import load


def config(policy, **kw):
    """helpers.config in _executor_loop (disable_overlap_scheduler), where these rules were pinned step by step;
    the overlap executor's: tests/test_policy_trtllm_overlap.py."""
    return any_loop_config(policy, **{**kw, "options": {"disable_overlap_scheduler": True, **kw.get("options", {})}})


P = POLICIES["trtllm_v1"]
ROOT = Path(__file__).resolve().parent.parent


def cfg(num_blocks=64, max_num_tokens=256, max_batch_size=8, chunked=False, block_size=16, **opts):
    opts.setdefault("disable_overlap_scheduler", True)   # the rules pinned in _executor_loop; the overlap
    # executor's: tests/test_policy_trtllm_overlap.py
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


def test_a_reused_last_chunk_forwards_only_the_uncached_tail():
    # K `add_sequence` reuses 96 cached tokens and `setPrepopulatedPromptLen(96)` moves the window:
    # the last chunk forwards the 4-token tail it was charged (resource_manager.py
    # `_request_forward_tokens`; PR #15187's test: a 19,212-token prompt with a 19,200-token hit
    # costs 12 forward tokens).
    c = cfg(max_num_tokens=128, chunked=True, enable_block_reuse=True)
    state = with_group_prefix(c, 100, 96)
    assert state.prefix_cache == (PrefixEntry(1, 6, 1),)
    new, plan = plan_of(c, state)
    s = {x.rid: x for x in plan.scheduled}
    assert s[1].tokens == 4 and plan.charged == 1 + 4
    assert new.req(1).shared_blocks == 6 and new.prefix_cache[0].refs == 2 and new.req(1).computed == 96
    assert not plan.error
    state, rec = P.step(c, state, Env())
    assert state.req(1).phase == Phase.DECODING and state.req(1).computed == 100


def test_prepopulated_window_keeps_a_non_last_chunk_block_aligned():
    # A 6-token chunk from position 0, charged in full; 8 tokens reused move it to [8, 12): its
    # end stays on a block (C++ `setPrepopulatedPromptLen`).
    assert trtllm_v1.shifted_chunk(8, 6, 15, 4) == 4
    assert trtllm_v1.shifted_chunk(8, 7, 15, 4) == 7          # reaches the end: the tail 15 - 8
    assert trtllm_v1.shifted_chunk(0, 6, 15, 4) == 6


def _estimate_above_reuse(chunked=True, trim=True):
    """Two idle cache entries (group 1: 20 blocks, the older; group 2: 10); r0 (1120 tokens, no
    prefix) and r1 (672 tokens, group 1's 640-token prefix) are admitted together. The capacity
    pass counts group 1's blocks both as free (for r0) and as reusable (for r1), and r1 is charged
    672 - 640 = 32. Allocating r0 first evicts the older entry, so r1's `add_sequence` reuses
    nothing and it forwards all 672 tokens: 1792 forwarded against 1152 charged."""
    c = config("trtllm_v1", block_size=32, num_blocks=64, max_num_tokens=1536, max_batch_size=8,
               chunked_prefill=chunked, options={"enable_block_reuse": True, "token_budget_trim": trim})
    s = state(c, req(0, 1120, 8), req(1, 672, 8, prefix_group=1, prefix_len=640))
    s = dataclasses.replace(s, prefix_cache=(PrefixEntry(1, 20, 0), PrefixEntry(2, 10, 0)), free_blocks=34)
    return c, s


def test_a_reuse_estimate_above_the_reuse_obtained_breaks_the_budget_without_the_trim():
    # #13318 as PR #15187 explains it, on a build without the trim: the forward pass asserts.
    c, s = _estimate_above_reuse(trim=False)
    s, rec = P.step(c, s, Env())
    assert rec.error_kind == "crash" and "(1792 > 1536; the scheduler charged 1152)" in rec.error
    assert all(r.phase == Phase.FAILED for r in s.requests)


def test_the_trim_shrinks_the_last_chunk_from_the_back_to_fit():
    # K `fit_token_budget`: 256 tokens over; r1, the last chunk at the back of the batch, shrinks
    # to the block-aligned 416 and is no longer last (no token sampled); nothing is deferred.
    c, s = _estimate_above_reuse()
    s, rec = P.step(c, s, Env())
    assert rec.error is None and rec.scheduled == ((0, 1120), (1, 416)) and rec.num_tokens == 1536
    assert s.req(1).phase == Phase.PREFILLING and s.req(1).computed == 416 and s.req(1).shared_blocks == 0
    assert s.req(0).phase == Phase.DECODING
    assert s.prefix_cache == ()          # both entries evicted by the two allocations


def test_the_trim_needs_chunked_prefill():
    # With chunked prefill off, fit_token_budget only warns and the forward pass asserts.
    c, s = _estimate_above_reuse(chunked=False)
    s, rec = P.step(c, s, Env())
    assert rec.error_kind == "crash" and "1792 > 1536" in rec.error


def test_the_trim_never_goes_below_one_block():
    # upstream test_token_budget_fallback.py `test_shrink_never_produces_a_zero_token_chunk`: with
    # 127 generation tokens (a run standing for them) and a 64-token last chunk under 128, the
    # chunk comes down to one 16-token block, never to 0, and the batch stays over budget.
    c = config("trtllm_v1", block_size=16, num_blocks=1000, max_num_tokens=128, max_batch_size=8,
               chunked_prefill=True)
    p = trtllm_v1._Pass(P, c, state(c, req(0, 64, 8), decoding(1, 10, 200, 1, 16)), Plan())
    runs = [[1, 127, 0, 127], [0, 64, 0, 64]]
    p.fit_token_budget(runs)
    assert runs == [[1, 127, 0, 127], [0, 16, 0, 64]]


def test_no_reuse_keeps_the_budget():
    c = cfg(max_num_tokens=32, chunked=True)
    state = with_group_prefix(c, 50, 50)
    state, rec = P.step(c, state, Env())
    assert not rec.error and rec.scheduled == ((0, 1), (1, 16))   # FCFS: 31 aligned down to 16


@pytest.mark.parametrize("name", ["trtllm-v1-reuse-budget-overshoot", "trtllm-v1-reuse-budget-trimmed",
                                  "trtllm-v1-no-reuse-budget-ok", "trtllm-v1-gne-head-of-line",
                                  "trtllm-v1-draft-budget", "trtllm-v1-reuse-trim-floor",
                                  "trtllm-v1-reuse-trim-floor-budget-ok"])
def test_scenario_expectations(name):
    res = run_scenario(load(ROOT / "scenarios" / f"{name}.toml"))
    assert res.matches_expectation() == [], [v.as_dict() for v in res.evaluation.violations]
    if name == "trtllm-v1-reuse-budget-overshoot":
        assert res.evaluation.violated("SAFE-BUDGET") and res.evaluation.violated("ENGINE-ERROR")
    if name == "trtllm-v1-reuse-budget-trimmed":   # r3's chunk shrunk to 416 at the step r2 evicted its prefix
        assert (3, 416) in res.trace.records[3].scheduled and res.trace.records[3].num_tokens == 1536
    if name == "trtllm-v1-gne-head-of-line":   # the short ones start only once the long one is done
        first = {rid: next(rec.step for rec in res.trace.records if rid in dict(rec.scheduled)) for rid in range(7)}
        done0 = next(rec.step for rec in res.trace.records if 0 in rec.finished)
        assert all(first[rid] > done0 for rid in range(1, 7))
    if name.startswith("trtllm-v1-reuse-trim-floor"):   # step 6: both context chunks at their one-block floors
        floors = next(rec for rec in res.trace.records if rec.step == 6)
        assert floors.scheduled == ((2, 4), (3, 4)) and floors.num_tokens == 8
        assert (floors.error is not None) == (name == "trtllm-v1-reuse-trim-floor")
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
