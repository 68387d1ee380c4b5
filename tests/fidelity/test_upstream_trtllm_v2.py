"""Fidelity: TensorRT-LLM's own KVCacheV2Scheduler unit tests, expressed in our model.

Upstream file: NVIDIA/TensorRT-LLM
  tests/unittest/_torch/executor/kv_cache/test_kv_cache_v2_scheduler.py
  @ 00746ef9992943a9bb604dbf1ecf00c64af58c32 (the same commit as the scheduler_v2.py the
  `trtllm_v2` policy mirrors; "UP" below stands for that file at that commit).

Upstream drives the real scheduler against a mocked KVCacheManagerV2 whose allocator answers
are scripted. Here each test builds a model state whose page arithmetic gives the same
answers (a refused allocation is a full pool, a victim whose suspension must free pages sits
above a host tier with room, one whose suspension must free nothing sits on a GPU-only pool
or above a host tier too small for it, a refused resume is a pool above
`max_util_for_resume`), runs whole passes with `step`, and asserts what upstream asserts.
Only the assertions are translated; no upstream code is copied.

Vocabulary: upstream `generation_requests` / `context_requests` are our record's
`scheduled`; `paused_requests` (suspended) is `offloaded`; `recompute_paused_requests` is
`preempted`; the RuntimeError "V2 scheduler deadlock" is `record.error` with
`error_kind == "deadlock"`, and `_DEADLOCK_STALL_ITERS` is the `stall_limit` option. Model
request ids are list positions, so an upstream id like 99 is renamed (each docstring says how).

Reading the results: a test marked `xfail(strict=True)` is one where the model disagrees with
upstream's expectation. It keeps asserting upstream's expectation, so CI goes red if the model
starts agreeing (turn the marker off then). The reason, and the upstream code that decides
it, is in the marker and in docs/fidelity/trtllm_v2_upstream_tests.md (the per-test verdict table,
also listing the upstream tests that are outside the model and have no test here).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import Phase, config, decoding, replace, req, state, step  # noqa: E402


# -- builders ---------------------------------------------------------------------------------

def cfg(**kw):
    """make_scheduler's defaults: max_batch_size 100, max_num_tokens 1024."""
    # the scheduler's own tests: the executor's loop is not theirs (each passes its in-flight set and states);
    # _executor_loop keeps the model's step as the pass alone
    options = {"disable_overlap_scheduler": True, **kw.pop("options", {})}
    base = dict(block_size=4, num_blocks=64, max_num_tokens=1024, max_batch_size=100)
    base.update(kw)
    return config("trtllm_v2", options=options, **base)


def at_boundary(rid, **kw):
    """A decoding request with 8 tokens of KV in 2 full 4-token pages: its next step needs a page."""
    return decoding(rid, 8, 100, 1, 4, **kw)


def roomy(rid, **kw):
    """A decoding request with 6 tokens of KV in 2 pages: its next step needs no new page."""
    return decoding(rid, 6, 100, 1, 4, **kw)


def small(rid, **kw):
    """A decoding request holding 1 page (3 tokens of KV), room for its next token."""
    return decoding(rid, 3, 100, 1, 4, **kw)


def continuation(rid, prompt=104, computed=4, blocks=1, **kw):
    """A started context (not a first chunk): `computed` tokens of KV, the rest still to run."""
    return req(rid, prompt, 100, Phase.PREFILLING, computed=computed, blocks=blocks, **kw)


def rids(rec):
    return [rid for rid, _ in rec.scheduled]


# =============================================================================================
# TestConstruction
# =============================================================================================

def test_chunk_unit_no_alignment():
    """UP::TestConstruction::test_chunk_unit_no_alignment @ 00746ef9: a chunk unit of 100 with
    64-token pages is used as is (chunk_unit_size == 100). Asserted through its effect: a
    250-token budget gives a 200-token chunk (2 units), not a page multiple."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=100, max_num_tokens=250)
    _, rec = step(c, state(c, req(0, 1000, 10)))
    assert rec.scheduled == ((0, 200),)


def test_chunk_unit_already_aligned():
    """UP::TestConstruction::test_chunk_unit_already_aligned @ 00746ef9: unit 128 stays 128;
    through its effect, a 300-token budget gives a 256-token chunk."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=128, max_num_tokens=300)
    _, rec = step(c, state(c, req(0, 1000, 10)))
    assert rec.scheduled == ((0, 256),)


# =============================================================================================
# TestTokenBudget
# =============================================================================================

def test_gen_budget_exhausted():
    """UP::TestTokenBudget::test_gen_budget_exhausted @ 00746ef9: 5 generations, budget 3 ->
    exactly [0, 1, 2] scheduled."""
    c = cfg(max_num_tokens=3)
    _, rec = step(c, state(c, *[roomy(i) for i in range(5)]))
    assert rids(rec) == [0, 1, 2]


def test_ctx_budget_exhausted():
    """UP::TestTokenBudget::test_ctx_budget_exhausted @ 00746ef9: a 200-token context under a
    100-token budget is not scheduled."""
    c = cfg(max_num_tokens=100)
    _, rec = step(c, state(c, req(0, 200, 10)))
    assert rec.scheduled == ()


def test_gen_with_draft_tokens():
    """UP::TestTokenBudget::test_gen_with_draft_tokens @ 00746ef9: two generations of 1+3
    tokens under budget 5 -> only request 0."""
    c = cfg(max_num_tokens=5, options={"draft_len": 3})
    _, rec = step(c, state(c, roomy(0), roomy(1)))
    assert rids(rec) == [0]


def test_ctx_with_draft_no_chunk():
    """UP::TestTokenBudget::test_ctx_with_draft_no_chunk @ 00746ef9: context 80 + draft 5 = 85
    fits budget 100 -> scheduled."""
    c = cfg(max_num_tokens=100, options={"draft_len": 5})
    _, rec = step(c, state(c, req(0, 80, 10)))
    assert rec.scheduled == ((0, 85),)


def test_mixed_gen_ctx_budget():
    """UP::TestTokenBudget::test_mixed_gen_ctx_budget @ 00746ef9: generation (1) + context
    (100) under 110 -> one of each scheduled."""
    c = cfg(max_num_tokens=110)
    _, rec = step(c, state(c, roomy(0), req(1, 100, 10)))
    assert rec.scheduled == ((0, 1), (1, 100))


def test_budget_exactly_full():
    """UP::TestTokenBudget::test_budget_exactly_full @ 00746ef9: 3 generations, budget 3 -> 3."""
    c = cfg(max_num_tokens=3)
    _, rec = step(c, state(c, *[roomy(i) for i in range(3)]))
    assert len(rec.scheduled) == 3


def test_batch_size_limit():
    """UP::TestTokenBudget::test_batch_size_limit @ 00746ef9: max_batch_size 2, 3 generations -> 2."""
    c = cfg(max_batch_size=2)
    _, rec = step(c, state(c, *[roomy(i) for i in range(3)]))
    assert len(rec.scheduled) == 2


def test_combined_batch_and_budget():
    """UP::TestTokenBudget::test_combined_batch_and_budget @ 00746ef9: batch 3, budget 2,
    5 generations -> 2 (the token budget binds first)."""
    c = cfg(max_batch_size=3, max_num_tokens=2)
    _, rec = step(c, state(c, *[roomy(i) for i in range(5)]))
    assert len(rec.scheduled) == 2


# =============================================================================================
# TestDraftTokenBudget (non-chunked: context + draft is one unit)
# =============================================================================================

@pytest.mark.parametrize("upstream_test, prompt, draft, scheduled", [
    ("test_ctx_fits_draft_exceeds_budget", 80, 30, False),
    ("test_ctx_fits_exactly_draft_pushes_over", 100, 5, False),
    ("test_ctx_plus_draft_fits_exactly", 80, 20, True),
    ("test_ctx_alone_exceeds_budget", 200, 5, False),
])
def test_draft_token_budget_non_chunked(upstream_test, prompt, draft, scheduled):
    """UP::TestDraftTokenBudget::{test_ctx_fits_draft_exceeds_budget (80+30 > 100: not
    scheduled), test_ctx_fits_exactly_draft_pushes_over (100+5 > 100: not scheduled),
    test_ctx_plus_draft_fits_exactly (80+20 == 100: scheduled), test_ctx_alone_exceeds_budget
    (200+5: not scheduled)} @ 00746ef9, budget 100, 64-token pages."""
    c = cfg(block_size=64, max_num_tokens=100, options={"draft_len": draft})
    _, rec = step(c, state(c, req(0, prompt, 10)))
    assert rec.scheduled == (((0, prompt + draft),) if scheduled else ())


def test_gen_with_draft_exceeds_budget():
    """UP::TestDraftTokenBudget::test_gen_with_draft_exceeds_budget @ 00746ef9: a generation of
    1 + 5 drafts under budget 3 is not scheduled."""
    c = cfg(max_num_tokens=3, options={"draft_len": 5})
    _, rec = step(c, state(c, roomy(0)))
    assert rec.scheduled == ()


# =============================================================================================
# TestKVCacheFailuresGen
# =============================================================================================

def test_gen_alloc_succeeds():
    """UP::TestKVCacheFailuresGen::test_gen_alloc_succeeds @ 00746ef9: 3 generations that can
    allocate are all scheduled."""
    c = cfg(max_num_tokens=100)
    _, rec = step(c, state(c, *[at_boundary(i) for i in range(3)]))
    assert len(rec.scheduled) == 3


def test_gen_alloc_fails_no_victim():
    """UP::TestKVCacheFailuresGen::test_gen_alloc_fails_no_victim @ 00746ef9: gen0 allocates,
    gen1 is refused and the only request behind it is a first-chunk context (no victim) ->
    generation_requests == [0]. One free page, GPU-only pool."""
    c = cfg(num_blocks=5, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), at_boundary(1), req(2, 10, 10)))
    assert rids(rec) == [0]


def test_gen_alloc_fails_evict_succeeds():
    """UP::TestKVCacheFailuresGen::test_gen_alloc_fails_evict_succeeds @ 00746ef9: gen1 is
    refused, the started tail request (upstream 99, here 2) is suspended, gen1's retry succeeds
    -> generation [0, 1], paused [99], suspend called once on it. The retry can only succeed
    if suspension frees pages, i.e. with a host tier with room."""
    c = cfg(num_blocks=6, host_blocks=4, max_num_tokens=100)
    s2, rec = step(c, state(c, at_boundary(0), at_boundary(1), small(2)))
    assert rids(rec) == [0, 1]
    assert rec.offloaded == (2,) and rec.preempted == ()
    assert s2.req(2).suspended


def test_gen_alloc_fails_evict_insufficient():
    """UP::TestKVCacheFailuresGen::test_gen_alloc_fails_evict_insufficient @ 00746ef9: the
    victim (upstream 99, here 2) is suspended, the retry still fails, gen1 suspends itself ->
    generation [0], paused {1, 99}. GPU-only pool: suspension frees nothing, and a request
    suspended in this pass may not be recompute-paused in it."""
    c = cfg(num_blocks=6, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), at_boundary(1), small(2)))
    assert rids(rec) == [0]
    assert set(rec.offloaded) == {1, 2} and rec.preempted == ()


def test_secondary_tier_recompute_pause_retries_immediately():
    """UP::TestKVCacheFailuresGen::test_secondary_tier_recompute_pause_retries_immediately @
    00746ef9 (can_evict): gen1 is refused, its ordinary victim (upstream 99, here 2) is
    suspended without helping, then upgraded to a recompute pause in the same pass and gen1's
    immediate retry succeeds -> generation [0, 1], paused [], recompute_paused [99], the victim
    freed. Host tier of 1 page: the victim's 2 pages cannot move down, only a free helps."""
    c = cfg(num_blocks=7, host_blocks=1, max_num_tokens=100)
    s2, rec = step(c, state(c, at_boundary(0), at_boundary(1), decoding(2, 8, 100, 1, 4)))
    assert rids(rec) == [0, 1]
    assert rec.offloaded == ()
    assert rec.preempted == (2,)
    assert s2.req(2).phase == Phase.PREEMPTED and s2.req(2).blocks == 0


def test_recompute_pause_gate_stops_destructive_fallback():
    """UP::TestKVCacheFailuresGen::test_recompute_pause_gate_stops_destructive_fallback @
    00746ef9: with enable_recompute_pause=False ordinary suspension is the last fallback ->
    generation [0], paused {1, 99}, recompute_paused [], nothing freed."""
    c = cfg(num_blocks=7, host_blocks=1, max_num_tokens=100, options={"enable_recompute_pause": False})
    s2, rec = step(c, state(c, at_boundary(0), at_boundary(1), decoding(2, 8, 100, 1, 4)))
    assert rids(rec) == [0]
    assert set(rec.offloaded) == {1, 2}
    assert rec.preempted == ()
    assert all(r.phase == Phase.DECODING for r in s2.requests)


def test_recompute_frontier_survives_ordinary_frontier_shrink():
    """UP::TestKVCacheFailuresGen::test_recompute_frontier_survives_ordinary_frontier_shrink @
    00746ef9 (can_evict): [gen0, gen1, active victim 2, suspended tail 3]. gen0's retry succeeds
    after suspending 2 (which shrinks the ordinary range to index 2); gen1 then recompute-pauses
    the suspended tail 3, still inside the recompute frontier -> generation [0, 1], paused [2],
    recompute_paused [3], suspend called only on 2, free only on 3. Request 3 was suspended in
    an earlier pass with its page still on the GPU; 2's page moves to the 1-page host tier."""
    c = cfg(num_blocks=6, host_blocks=1, max_num_tokens=100)
    s = state(c, at_boundary(0), at_boundary(1), small(2), small(3, suspended=True))
    s2, rec = step(c, s)
    assert rids(rec) == [0, 1]
    assert rec.offloaded == (2,)
    assert rec.preempted == (3,)
    assert s2.req(3).phase == Phase.PREEMPTED


def test_recompute_pause_does_not_shrink_scheduling_range():
    """UP::TestKVCacheFailuresGen::test_recompute_pause_does_not_shrink_scheduling_range @
    00746ef9: [gen0, suspended victim 1, first-chunk context 2]. gen0 recompute-pauses 1 and
    succeeds; only the victim is skipped, the trailing context is still scheduled ->
    generation [0], paused [], recompute_paused [1], context [2], and the victim is never
    tried as a generation. GPU-only pool; 1 holds 3 pages."""
    c = cfg(num_blocks=5, max_num_tokens=100)
    s = state(c, at_boundary(0), decoding(1, 12, 100, 1, 4, suspended=True), req(2, 8, 10))
    assert s.free_blocks == 0
    _, rec = step(c, s)
    assert rec.scheduled == ((0, 1), (2, 8))
    assert rec.offloaded == ()
    assert rec.preempted == (1,)


def test_multiple_evictions_needed():
    """UP::TestKVCacheFailuresGen::test_multiple_evictions_needed @ 00746ef9: gen1 needs two
    victims (upstream 99 then 98, here 3 then 2) before its retry succeeds -> generation
    [0, 1], two paused. 3 holds 2 pages that the 1-page host tier cannot take; 2's page can."""
    c = cfg(num_blocks=8, host_blocks=1, max_num_tokens=100)
    s = state(c, at_boundary(0), at_boundary(1), small(2), decoding(3, 8, 100, 1, 4))
    _, rec = step(c, s)
    assert rids(rec) == [0, 1]
    assert len(rec.offloaded) == 2


def test_gen_fail_does_not_break_immediately():
    """UP::TestKVCacheFailuresGen::test_gen_fail_does_not_break_immediately @ 00746ef9: gen0
    allocates, gen1 fails with no victim -> generation [0]."""
    c = cfg(num_blocks=5, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), at_boundary(1)))
    assert rids(rec) == [0]


def test_suspended_request_not_evictable():
    """UP::TestKVCacheFailuresGen::test_suspended_request_not_evictable @ 00746ef9: the tail
    request (upstream 99, here 2) is already suspended, so it is no eviction victim; gen1's
    allocation keeps failing -> generation [0], 99 not in paused. To keep gen1 failing after
    the suspended tail's single page is released by a recompute pause (upstream's pass does
    that too), each generation step needs 2 pages (4 drafts)."""
    c = cfg(num_blocks=7, max_num_tokens=100, options={"draft_len": 4})
    s = state(c, at_boundary(0), at_boundary(1), small(2, suspended=True))
    _, rec = step(c, s)
    assert rids(rec) == [0]
    assert 2 not in rec.offloaded


# =============================================================================================
# TestKVCacheFailuresCtx / TestKVCacheFailuresCtxChunked
# =============================================================================================

def _gate_refuses(chunked):
    # One roomy generation holds every page: utilisation 1.0 > max_util_for_resume, so the
    # context's fresh cache (born suspended) is refused its first resume: prepare_context fails.
    c = cfg(num_blocks=20, max_num_tokens=1000, chunked_prefill=chunked,
            **({"block_size": 64} if chunked else {}))
    holder = decoding(0, 78, 100, 1, 4) if not chunked else decoding(0, 1250, 100, 1, 64)
    return c, state(c, holder, req(1, 100, 10))


def test_ctx_prepare_fails():
    """UP::TestKVCacheFailuresCtx::test_ctx_prepare_fails @ 00746ef9: prepare_context refused ->
    no context scheduled. Refused here by the resume gate of a full pool (the holder is a
    generation request, scheduled as usual)."""
    c, s = _gate_refuses(chunked=False)
    assert s.free_blocks == 0
    _, rec = step(c, s)
    assert 1 not in rids(rec)


def test_chunked_prepare_fails():
    """UP::TestKVCacheFailuresCtxChunked::test_chunked_prepare_fails @ 00746ef9: same, chunked."""
    c, s = _gate_refuses(chunked=True)
    assert s.free_blocks == 0
    _, rec = step(c, s)
    assert 1 not in rids(rec)


def test_ctx_resize_fails_continue():
    """UP::TestKVCacheFailuresCtx::test_ctx_resize_fails_continue @ 00746ef9: [context 1000 whose
    resize fails, generation] -> no context, the generation scheduled. Host tier (upstream's
    mock default: no page preemption). Budget 1001 so the context fails on pages, not on the
    budget left after the generation's token."""
    c = cfg(num_blocks=20, host_blocks=4, max_num_tokens=1001)
    _, rec = step(c, state(c, req(0, 1000, 10), roomy(1)))
    assert rec.scheduled == ((1, 1),)


@pytest.mark.parametrize("upstream_test", ["TestKVCacheFailuresCtx::test_ctx_resize_fail_then_gen_succeeds",
                                           "TestMixedOrdering::test_ctx_fail_gen_after_succeeds"])
def test_ctx_resize_fail_then_gen_succeeds(upstream_test):
    """UP::TestKVCacheFailuresCtx::test_ctx_resize_fail_then_gen_succeeds and
    UP::TestMixedOrdering::test_ctx_fail_gen_after_succeeds @ 00746ef9 (same setup): [context
    500 whose resize fails, generation 1] -> context [], generation [1]."""
    c = cfg(num_blocks=20, host_blocks=4, max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 500, 10), roomy(1)))
    assert rec.scheduled == ((1, 1),)


def test_ctx_resize_fail_then_smaller_ctx():
    """UP::TestKVCacheFailuresCtx::test_ctx_resize_fail_then_smaller_ctx @ 00746ef9: context
    1000 fails its resize (SKIP, not STOP), context 100 behind it -> context [1]."""
    c = cfg(num_blocks=30, host_blocks=4, max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 1000, 10), req(1, 100, 10)))
    assert rec.scheduled == ((1, 100),)


def test_ctx_fail_budget_preserved():
    """UP::TestMixedOrdering::test_ctx_fail_budget_preserved @ 00746ef9: [context 50 whose
    resize fails, generation] under budget 100 -> generation [1]."""
    c = cfg(num_blocks=10, host_blocks=4, max_num_tokens=100)
    _, rec = step(c, state(c, req(0, 50, 10), roomy(1)))
    assert rec.scheduled == ((1, 1),)


def test_chunked_fail_then_gen():
    """UP::TestKVCacheFailuresCtxChunked::test_chunked_fail_then_gen @ 00746ef9: chunked
    context 500 fails its resize, generation behind it -> context [], generation [1]."""
    c = cfg(block_size=64, chunked_prefill=True, num_blocks=4, host_blocks=4, max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 500, 10), decoding(1, 10, 100, 1, 64)))
    assert rec.scheduled == ((1, 1),)


# =============================================================================================
# TestEviction
# =============================================================================================

def _tail_victim():
    # gen0 needs a page, the pool is full, the started tail (upstream 99, here 1) holds one page
    # that the host tier can take: the retry after suspending it succeeds.
    c = cfg(num_blocks=3, host_blocks=4, max_num_tokens=100)
    return c, state(c, at_boundary(0), small(1))


def test_evict_gen_from_tail():
    """UP::TestEviction::test_evict_gen_from_tail @ 00746ef9: gen0 refused, the tail generation
    suspended, retry succeeds -> generation [0], paused [99]."""
    c, s = _tail_victim()
    _, rec = step(c, s)
    assert rids(rec) == [0] and rec.offloaded == (1,)


def test_evicted_in_paused_requests():
    """UP::TestEviction::test_evicted_in_paused_requests @ 00746ef9: the victim is in paused."""
    c, s = _tail_victim()
    _, rec = step(c, s)
    assert 1 in rec.offloaded


def test_suspend_called_on_victim():
    """UP::TestEviction::test_suspend_called_on_victim @ 00746ef9: suspend called exactly once
    on the victim."""
    c, s = _tail_victim()
    s2, rec = step(c, s)
    assert rec.offloaded.count(1) == 1 and s2.req(1).suspended


def test_evict_nonfirst_ctx_chunk():
    """UP::TestEviction::test_evict_nonfirst_ctx_chunk @ 00746ef9: a started context (not a
    first chunk; upstream 99, here 1) is an eviction victim -> generation [0], paused [99]."""
    c = cfg(num_blocks=3, host_blocks=4, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), continuation(1)))
    assert rec.scheduled == ((0, 1),) and rec.offloaded == (1,)


def test_first_chunk_ctx_not_evictable():
    """UP::TestEviction::test_first_chunk_ctx_not_evictable @ 00746ef9: the only request behind
    a refused generation is a first-chunk context -> no generation, paused [0] (self-eviction),
    and the STOP keeps the context from being tried."""
    c = cfg(num_blocks=2, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), req(1, 100, 10)))
    assert rec.scheduled == () and rec.offloaded == (0,)


def test_eviction_clears_request_runtime_state():
    """UP::TestEviction::test_eviction_clears_request_runtime_state @ 00746ef9, partly: a lone
    refused generation -> paused [0]. (Its py_batch_idx reset has no model counterpart.)"""
    c = cfg(num_blocks=2, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0)))
    assert rec.offloaded == (0,)


def test_multiple_evictions_order():
    """UP::TestEviction::test_multiple_evictions_order @ 00746ef9: [gen0, v1 (98), v2 (99)]: v2
    is suspended first (higher index), the retry fails, then v1, the retry succeeds ->
    generation [0], both paused. Here v1 = 1 (1 page, fits the 1-page host tier) and v2 = 2
    (2 pages, does not)."""
    c = cfg(num_blocks=5, host_blocks=1, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), small(1), decoding(2, 8, 100, 1, 4)))
    assert rids(rec) == [0]
    assert rec.offloaded == (2, 1)


def test_req_it_end_shrinks_after_eviction():
    """UP::TestEviction::test_req_it_end_shrinks_after_eviction @ 00746ef9: [gen0, generation
    victim (upstream 5, here 1), first-chunk context (upstream 6, here 2)]: the search skips the
    unevictable context and suspends 1 -> generation [0], paused [5]; nothing after the victim
    is visited."""
    c = cfg(num_blocks=3, host_blocks=4, max_num_tokens=100)
    _, rec = step(c, state(c, at_boundary(0), small(1), req(2, 100, 10)))
    assert rec.scheduled == ((0, 1),)
    assert rec.offloaded == (1,)


@pytest.mark.parametrize("upstream_test, extra", [
    ("TestEviction::test_self_eviction_on_alloc_fail", 0),
    ("TestEviction::test_self_eviction_no_started_in_range", 2),
    ("TestMixedOrdering::test_gen_fail_self_evicts_then_breaks", 1),
])
def test_self_eviction(upstream_test, extra):
    """UP::TestEviction::test_self_eviction_on_alloc_fail ([gen0]),
    UP::TestEviction::test_self_eviction_no_started_in_range ([gen0, ctx 50, ctx 50]) and
    UP::TestMixedOrdering::test_gen_fail_self_evicts_then_breaks ([gen0, ctx 100]) @ 00746ef9:
    the refused generation suspends itself (paused [0]), nothing is scheduled, and the STOP
    keeps the contexts behind it from being tried."""
    c = cfg(num_blocks=2, max_num_tokens=200)
    ctx = [req(1 + k, 50 if extra == 2 else 100, 10) for k in range(extra)]
    _, rec = step(c, state(c, at_boundary(0), *ctx))
    assert rec.scheduled == () and rec.offloaded == (0,)


# =============================================================================================
# TestContextPreemption (no cache tier below the GPU)
# =============================================================================================

def _preemptible(num_blocks=25, *head, chunked=False, options=None):
    # A new 100-token context (25 pages) finds 24 free; a started context (upstream 99) holds 1.
    c = cfg(num_blocks=num_blocks, max_num_tokens=1000, chunked_prefill=chunked, options=options or {})
    reqs = list(head) or [req(0, 100, 10)]
    reqs.append(continuation(len(reqs)))
    return c, state(c, *reqs)


def test_out_of_pages_preempts_started_request():
    """UP::TestContextPreemption::test_out_of_pages_preempts_started_request @ 00746ef9: the
    blocked context preempts the started one (preempt_request called once on it),
    recompute_paused [99], and the blocked context is deferred to the next pass."""
    c, s = _preemptible()
    s2, rec = step(c, s)
    assert rec.preempted == (1,)
    assert rec.scheduled == ()
    assert s2.req(1).phase == Phase.PREEMPTED and s2.req(1).blocks == 0


def test_preempted_victim_not_scheduled_in_the_same_pass():
    """UP::TestContextPreemption::test_preempted_victim_not_scheduled_in_the_same_pass @
    00746ef9: the victim is not re-admitted in the pass that preempted it: context []."""
    c, s = _preemptible()
    _, rec = step(c, s)
    assert rec.scheduled == ()


def test_blocked_request_is_admitted_after_the_executor_recomputes():
    """UP::TestContextPreemption::test_blocked_request_is_admitted_after_the_executor_recomputes
    @ 00746ef9: pass 1 schedules no context and recompute-pauses 99; after the executor's reset
    (folded into the model's step), pass 2 schedules the blocked request 0."""
    c, s = _preemptible()
    s1, first = step(c, s)
    assert first.scheduled == () and first.preempted == (1,)
    _, second = step(c, s1)
    assert 0 in rids(second)


def test_disagg_generation_worker_never_preempts():
    """UP::TestContextPreemption::test_disagg_generation_worker_never_preempts @ 00746ef9: with
    enable_recompute_pause=False there is no page preemption."""
    c, s = _preemptible(options={"enable_recompute_pause": False})
    _, rec = step(c, s)
    assert rec.preempted == ()


def test_freed_pages_are_reserved_for_the_request_that_preempted():
    """UP::TestContextPreemption::test_freed_pages_are_reserved_for_the_request_that_preempted
    @ 00746ef9: [blocked 100, later 10, victim]: the later request would fit in the released
    pages but the STOP keeps it out -> recompute_paused [99], context []."""
    c, s = _preemptible(25, req(0, 100, 10), req(1, 10, 10))
    _, rec = step(c, s)
    assert rec.preempted == (2,)
    assert rec.scheduled == ()


def test_a_failed_preemption_still_lets_the_pass_continue():
    """UP::TestContextPreemption::test_a_failed_preemption_still_lets_the_pass_continue @
    00746ef9: only first chunks (no victim): no preemption, and the pass continues -> context [1]."""
    c = cfg(num_blocks=10, max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 100, 10), req(1, 10, 10)))
    assert rec.preempted == ()
    assert rec.scheduled == ((1, 10),)


def test_generation_scheduled_before_a_preemption_is_unaffected():
    """UP::TestContextPreemption::test_generation_scheduled_before_a_preemption_is_unaffected @
    00746ef9: [gen0, blocked 100, later 10, victim] -> generation [0], recompute_paused [99],
    context []."""
    c, s = _preemptible(27, roomy(0), req(1, 100, 10), req(2, 10, 10))
    _, rec = step(c, s)
    assert rec.scheduled == ((0, 1),)
    assert rec.preempted == (3,)


def test_skipped_when_a_cache_tier_exists_below_gpu():
    """UP::TestContextPreemption::test_skipped_when_a_cache_tier_exists_below_gpu @ 00746ef9:
    with a host tier no page preemption happens; the blocked context is skipped and the started
    one behind it (99, here 1) is scheduled -> context [99]. 64-token pages: the new 100-token
    context needs 2 pages, the started one (28 of 128 tokens done) 1 more; 1 is free."""
    c = cfg(block_size=64, num_blocks=2, host_blocks=4, max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 100, 10), continuation(1, prompt=128, computed=28, blocks=1)))
    assert rec.preempted == ()
    assert rec.scheduled == ((1, 100),)


def test_never_preempts_a_scheduled_request():
    """UP::TestContextPreemption::test_never_preempts_a_scheduled_request @ 00746ef9: the
    generation scheduled in phase 1 is protected -> generation [0], no preemption."""
    c = cfg(num_blocks=7, max_num_tokens=1000)
    _, rec = step(c, state(c, roomy(0), req(1, 100, 10)))
    assert rec.scheduled == ((0, 1),) and rec.preempted == ()


def test_never_preempts_itself():
    """UP::TestContextPreemption::test_never_preempts_itself @ 00746ef9: a started context whose
    resize fails does not preempt itself."""
    c = cfg(num_blocks=5, max_num_tokens=1000)
    _, rec = step(c, state(c, continuation(0)))
    assert rec.preempted == ()


def test_never_preempts_a_first_chunk_or_suspended_request():
    """UP::TestContextPreemption::test_never_preempts_a_first_chunk_or_suspended_request @
    00746ef9: [blocked, first chunk (98, here 1), suspended started context (99, here 2)]:
    neither is a victim -> no preemption."""
    c = cfg(num_blocks=10, max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 100, 10), req(1, 100, 10), continuation(2, suspended=True)))
    assert rec.preempted == ()


def test_chunked_context_out_of_pages_preempts():
    """UP::TestContextPreemption::test_chunked_context_out_of_pages_preempts @ 00746ef9: chunked
    (unit 64), a 500-token context out of pages preempts the started one -> recompute_paused [99]."""
    c = cfg(num_blocks=10, max_num_tokens=1000, chunked_prefill=True, chunk_unit=64)
    _, rec = step(c, state(c, req(0, 500, 10), continuation(1)))
    assert rec.preempted == (1,)


# =============================================================================================
# TestDeadlockDetection
# =============================================================================================

def test_raises_after_repeated_stalls_with_context_candidates():
    """UP::TestDeadlockDetection::test_raises_after_repeated_stalls_with_context_candidates @
    00746ef9: a started context whose resize always fails, GPU-only, stall limit 3: passes 1
    and 2 do not raise, pass 3 raises "V2 scheduler deadlock"."""
    c = cfg(num_blocks=5, max_num_tokens=1000, options={"stall_limit": 3})
    s = state(c, continuation(0))
    for _ in range(2):
        s, rec = step(c, s)
        assert rec.error is None
    s, rec = step(c, s)
    assert rec.error_kind == "deadlock" and rec.error.startswith("V2 scheduler deadlock")


@pytest.mark.xfail(strict=True, reason=(
    "model resumes the lone suspended generation request each pass (M try_allocate_generation "
    "resumes before it resizes and does not re-suspend when the resize fails), so S "
    "_try_schedule_generation self-suspends it again: progress every pass, no deadlock error; "
    "upstream's mock refuses the whole allocation without resuming"))
def test_raises_after_repeated_stalls_with_generation_candidates():
    """UP::TestDeadlockDetection::test_raises_after_repeated_stalls_with_generation_candidates @
    00746ef9 (can_evict, allocation always refused, stall limit 3): pass 1 self-suspends the
    lone generation request (progress); afterwards it stays inactive and nothing can be
    reclaimed, so passes 1-3 do not raise and pass 4 raises "V2 scheduler deadlock".
    Model: a host tier, the request needs a page and holds every GPU page."""
    c = cfg(num_blocks=2, host_blocks=4, max_num_tokens=100, options={"stall_limit": 3})
    s = state(c, at_boundary(0))
    for _ in range(3):
        s, rec = step(c, s)
        assert rec.error is None
    s, rec = step(c, s)
    assert rec.error_kind == "deadlock" and rec.error.startswith("V2 scheduler deadlock")


def test_transient_stall_does_not_raise():
    """UP::TestDeadlockDetection::test_transient_stall_does_not_raise @ 00746ef9: resize fails
    on every other pass for 10 passes, stall limit 3 -> never raises (progress resets the
    counter). The mock's toggle is realised by alternating a full pool and one with room,
    carrying the scheduler's stall counter across."""
    c = cfg(num_blocks=5, max_num_tokens=1000, options={"stall_limit": 3})
    blocked = state(c, continuation(0))
    roomy_pool = replace(c, num_blocks=30)
    free = state(roomy_pool, continuation(0))
    sched = blocked.sched
    for k in range(10):
        cc, s = (c, blocked) if k % 2 == 0 else (roomy_pool, free)
        s2, rec = step(cc, replace(s, sched=sched))
        assert rec.error is None
        sched = s2.sched
        assert sched.stalls <= 1


def test_idle_scheduler_never_raises():
    """UP::TestDeadlockDetection::test_idle_scheduler_never_raises @ 00746ef9: no requests, stall
    limit 2, 5 passes -> never raises, nothing scheduled."""
    c = cfg(max_num_tokens=1000, options={"stall_limit": 2})
    s = state(c)
    for _ in range(5):
        s, rec = step(c, s)
        assert rec.error is None and rec.scheduled == ()


# =============================================================================================
# TestChunkedContext
# =============================================================================================

@pytest.mark.parametrize("upstream_test, unit, budget, prompt, chunk", [
    ("test_budget_enough_for_all", 64, 200, 100, 100),
    ("test_budget_limits_chunk", 64, 300, 1000, 256),
    ("test_min_budget_check", 64, 50, 1000, None),
    ("test_last_chunk_no_rounding", 128, 200, 100, 100),
    ("test_has_chunking_flag_set", 64, 100, 1000, 64),
    ("test_chunk_rounding_non_last", 128, 200, 1000, 128),
    ("test_has_chunking_flag_not_set", 64, 500, 100, 100),
    ("test_max_context_length_caps_chunk", 64, 500, 2000, 448),
    ("test_chunk_rounds_to_zero", 128, 100, 1000, None),
])
def test_chunk_size(upstream_test, unit, budget, prompt, chunk):
    """UP::TestChunkedContext::{test_budget_enough_for_all (100), test_budget_limits_chunk
    (300 // 64 * 64 = 256; its draft-pool resize is not modelled), test_min_budget_check
    (budget 50 < unit 64: not scheduled), test_last_chunk_no_rounding (100), test_has_chunking_
    flag_set (scheduled, 64), test_chunk_rounding_non_last (128), test_has_chunking_flag_not_set
    (100), test_max_context_length_caps_chunk (448), test_chunk_rounds_to_zero (not scheduled)}
    @ 00746ef9: the context_chunk_size each asserts (64-token pages)."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=unit, max_num_tokens=budget)
    _, rec = step(c, state(c, req(0, prompt, 10)))
    assert rec.scheduled == (() if chunk is None else ((0, chunk),))


def test_multiple_ctx_share_budget():
    """UP::TestChunkedContext::test_multiple_ctx_share_budget @ 00746ef9: two 200-token
    contexts under 500 -> both scheduled, 200 each."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=500)
    _, rec = step(c, state(c, req(0, 200, 10), req(1, 200, 10)))
    assert rec.scheduled == ((0, 200), (1, 200))


def test_chunk_fail_flows_budget():
    """UP::TestChunkedContext::test_chunk_fail_flows_budget @ 00746ef9: the first chunked
    context fails its resize and the budget flows to the next -> context [1]. Upstream's two
    requests are equal (200 each) and the mock refuses only the first; page arithmetic refuses
    the larger one, so the first here is 1000 tokens (a 448-token chunk, 7 pages, 5 free) and
    the second 200 (4 pages), which needs the budget the failed chunk did not take."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=500,
            num_blocks=5, host_blocks=4)
    _, rec = step(c, state(c, req(0, 1000, 10), req(1, 200, 10)))
    assert rec.scheduled == ((1, 200),)


def test_subsequent_chunk_non_first():
    """UP::TestChunkedContext::test_subsequent_chunk_non_first @ 00746ef9: a continuing
    prefill with 200 tokens left under 500 -> scheduled."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=500)
    _, rec = step(c, state(c, continuation(0, prompt=264, computed=64, blocks=1)))
    assert rec.scheduled == ((0, 200),)


# =============================================================================================
# TestDraftTokenFitting (chunked, last chunk carries the full draft length)
# =============================================================================================

@pytest.mark.parametrize("upstream_test, budget, prompt, draft", [
    ("test_draft_fits_in_page_remainder", 200, 100, 5),
    ("test_draft_exceeds_page_remainder", 200, 128, 5),
    ("test_draft_partially_fits", 200, 100, 30),
    ("test_budget_limits_draft_space", 110, 100, 20),
    ("test_max_context_length_limits_draft", 110, 100, 20),
])
def test_last_chunk_carries_full_draft(upstream_test, budget, prompt, draft):
    """UP::TestDraftTokenFitting::{test_draft_fits_in_page_remainder (100+5, budget 200),
    test_draft_exceeds_page_remainder (128+5), test_draft_partially_fits (100+30),
    test_budget_limits_draft_space (100+20 under a 110 budget), test_max_context_length_limits_
    draft (same numbers)} @ 00746ef9: the context is scheduled (context_requests == [0]) and the
    drafts are never trimmed (discard_draft_tokens not called): the forward pass runs the whole
    chunk plus every draft. For the 110-budget cases that is 120 tokens, and upstream's
    docstring says the budget tracks 120: the chunked path adds the drafts after sizing the
    chunk from the budget and does not re-check it."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=budget,
            options={"draft_len": draft})
    _, rec = step(c, state(c, req(0, prompt, 10)))
    assert rec.scheduled == ((0, prompt + draft),)
    assert rec.charged == prompt + draft
    # Beyond upstream's assertions: the forward pass carries the last chunk's drafts
    # (resource_manager.py `_request_forward_tokens`), so 120 tokens under 110 trip
    # model_engine.py's `total_num_tokens <= max_num_tokens` assert (docs/fidelity.md).
    assert (rec.error_kind == "crash") == (prompt + draft > budget)


def test_draft_tokens_add_to_batch_budget():
    """UP::TestDraftTokenFitting::test_draft_tokens_add_to_batch_budget @ 00746ef9: [context 100
    with 5 drafts, generation] under 200 -> both scheduled. (The model's draft length is one
    engine-wide option, so the generation also carries 5 drafts: 106 + 6 still fits.)"""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=200,
            options={"draft_len": 5})
    _, rec = step(c, state(c, req(0, 100, 10), decoding(1, 10, 100, 1, 64)))
    assert sorted(rids(rec)) == [0, 1]


def test_non_last_chunk_no_draft_fitting():
    """UP::TestDraftTokenFitting::test_non_last_chunk_no_draft_fitting @ 00746ef9: a non-last
    chunk (1000 tokens, budget 200) is scheduled without drafts."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=200,
            options={"draft_len": 5})
    _, rec = step(c, state(c, req(0, 1000, 10)))
    assert rec.scheduled == ((0, 192),)


# =============================================================================================
# TestStateFiltering / TestSorting / TestSchedulerOutput / TestEdgeCases
# =============================================================================================

def test_gen_complete_filtered():
    """UP::TestStateFiltering::test_gen_complete_filtered @ 00746ef9: a completed request is
    outside the schedulable states -> num_fitting_requests == 0."""
    c = cfg()
    done = replace(roomy(0), phase=Phase.FINISHED, blocks=0)
    _, rec = step(c, state(c, done))
    assert rec.scheduled == ()


def test_context_init_passes():
    """UP::TestStateFiltering::test_context_init_passes @ 00746ef9: a CONTEXT_INIT request of 100
    under 1000 is scheduled."""
    c = cfg(max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 100, 10)))
    assert len(rec.scheduled) == 1


def test_gen_in_progress_passes():
    """UP::TestStateFiltering::test_gen_in_progress_passes @ 00746ef9: a GENERATION_IN_PROGRESS
    request is scheduled."""
    c = cfg(max_num_tokens=100)
    _, rec = step(c, state(c, roomy(0)))
    assert len(rec.scheduled) == 1


def test_no_lora_stable_order():
    """UP::TestSorting::test_no_lora_stable_order @ 00746ef9: without LoRA the generation order
    is the list order [0, 1, 2]."""
    c = cfg(max_num_tokens=100)
    _, rec = step(c, state(c, *[roomy(i) for i in range(3)]))
    assert rids(rec) == [0, 1, 2]


def test_output_fields_correct():
    """UP::TestSchedulerOutput::test_output_fields_correct @ 00746ef9, without its disagg request:
    [generation, context 100] -> one context, one generation, recompute_paused [], 2 fitting."""
    c = cfg(max_num_tokens=1000)
    _, rec = step(c, state(c, roomy(0), req(1, 100, 10)))
    assert rec.scheduled == ((0, 1), (1, 100))
    assert rec.preempted == ()


def test_num_fitting_requests():
    """UP::TestSchedulerOutput::test_num_fitting_requests @ 00746ef9: 2 contexts of 100 and 3
    generations under 1000 -> 5 fitting."""
    c = cfg(max_num_tokens=1000)
    _, rec = step(c, state(c, req(0, 100, 10), req(1, 100, 10), roomy(2), roomy(3), roomy(4)))
    assert len(rec.scheduled) == 5


@pytest.mark.parametrize("upstream_test", ["TestSchedulerOutput::test_empty_output",
                                           "TestEdgeCases::test_empty_active_requests"])
def test_empty(upstream_test):
    """UP::TestSchedulerOutput::test_empty_output and UP::TestEdgeCases::test_empty_active_requests
    @ 00746ef9: no active requests -> nothing fitting."""
    c = cfg(max_num_tokens=100)
    _, rec = step(c, state(c))
    assert rec.scheduled == () and rec.error is None


def test_single_request_each_type():
    """UP::TestEdgeCases::test_single_request_each_type @ 00746ef9, without its encoder part: a
    lone generation is scheduled; a lone context of 100 is scheduled."""
    c = cfg(max_num_tokens=1000)
    _, rec = step(c, state(c, roomy(0)))
    assert len(rec.scheduled) == 1
    _, rec = step(c, state(c, req(0, 100, 10)))
    assert len(rec.scheduled) == 1


def test_very_large_batch():
    """UP::TestEdgeCases::test_very_large_batch @ 00746ef9: 1000 generations, batch 2000, budget
    2000 -> all 1000 scheduled."""
    c = cfg(max_batch_size=2000, max_num_tokens=2000, num_blocks=2000)
    _, rec = step(c, state(c, *[roomy(i) for i in range(1000)]))
    assert len(rec.scheduled) == 1000


# =============================================================================================
# TestMixedOrdering
# =============================================================================================

def test_mixed_gen_ctx_order():
    """UP::TestMixedOrdering::test_mixed_gen_ctx_order @ 00746ef9: [gen, ctx 100, gen, ctx 100]
    under 300 -> 2 generations and 2 contexts."""
    c = cfg(max_num_tokens=300)
    _, rec = step(c, state(c, roomy(0), req(1, 100, 10), roomy(2), req(3, 100, 10)))
    assert sorted(rids(rec)) == [0, 1, 2, 3]


def test_budget_builds_across_types():
    """UP::TestMixedOrdering::test_budget_builds_across_types @ 00746ef9: [gen, ctx 100, gen]
    under 102 -> 2 generations and 1 context."""
    c = cfg(max_num_tokens=102)
    _, rec = step(c, state(c, roomy(0), req(1, 100, 10), roomy(2)))
    assert sorted(rids(rec)) == [0, 1, 2]


def test_multiple_gen_after_gen_fail():
    """UP::TestMixedOrdering::test_multiple_gen_after_gen_fail @ 00746ef9 (no lower tier):
    gen0 always refused; it suspends 2 then 1 (newest first), still fails, suspends itself ->
    no generation, paused {0, 1, 2}."""
    c = cfg(num_blocks=6, max_num_tokens=1000)
    _, rec = step(c, state(c, at_boundary(0), roomy(1), roomy(2)))
    assert rec.scheduled == ()
    assert set(rec.offloaded) == {0, 1, 2}


def test_secondary_tier_recompute_pause_multiple_victims():
    """UP::TestMixedOrdering::test_secondary_tier_recompute_pause_multiple_victims @ 00746ef9
    (can_evict): gen0 always refused; its suspended victims 2 and 1 are upgraded to recompute
    pauses before it suspends itself -> no generation, paused [0], recompute_paused {1, 2}.
    gen0's step needs 3 pages (8 drafts) and the two victims hold one each."""
    c = cfg(num_blocks=4, host_blocks=4, max_num_tokens=1000, options={"draft_len": 8})
    _, rec = step(c, state(c, at_boundary(0), small(1), small(2)))
    assert rec.scheduled == ()
    assert rec.offloaded == (0,)
    assert set(rec.preempted) == {1, 2}


# =============================================================================================
# TestPrefixAwareSkip (budget parts only) / TestMirrorAdmissionPreview (resume gate)
# =============================================================================================

def test_generation_exhausts_context_budget_before_any_probe():
    """UP::TestPrefixAwareSkip::test_generation_exhausts_context_budget_before_any_probe @
    00746ef9, scheduling part: budget 1, chunked: [gen, ctx 128, ctx 128] -> generation [0], no
    context. (The probe / prepare call counts are not modelled.)"""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=1)
    _, rec = step(c, state(c, decoding(0, 10, 100, 1, 64), req(1, 128, 10), req(2, 128, 10)))
    assert rec.scheduled == ((0, 1),)


def test_budget_skip_preserves_existing_context_claim():
    """UP::TestPrefixAwareSkip::test_budget_skip_preserves_existing_context_claim @ 00746ef9,
    cache part: budget 1 taken by the generation; the started context (64 of 192 tokens done)
    is skipped for budget without being freed or suspended: its pages, cursor and remaining
    length are unchanged, and no context is scheduled."""
    c = cfg(block_size=64, chunked_prefill=True, chunk_unit=64, max_num_tokens=1, num_blocks=8)
    started = continuation(1, prompt=192, computed=64, blocks=1)
    s2, rec = step(c, state(c, decoding(0, 10, 100, 1, 64), started, req(2, 128, 10)))
    assert rec.scheduled == ((0, 1),)
    r = s2.req(1)
    assert (r.phase, r.blocks, r.computed, r.suspended, r.remaining_context) == (Phase.PREFILLING, 1, 64, False, 128)
    assert rec.offloaded == () and rec.preempted == ()


@pytest.mark.parametrize("held, admitted", [(96, False), (95, True)])
def test_resume_gate_preview_matches_the_resume_comparison(held, admitted):
    """UP::TestMirrorAdmissionPreview::test_resume_gate_preview_matches_the_resume_comparison @
    00746ef9, the comparison part: with max_util_for_resume 0.95, utilisation 0.96 refuses a
    resume and 0.95 (at the gate, not above it) does not. Asserted through a fresh context's
    admission (its cache is born suspended) in a 100-page pool with `held` pages in use."""
    c = cfg(num_blocks=100, max_num_tokens=1000)
    holder = decoding(0, 4 * held - 3, 100, 1, 4)
    s = state(c, holder, req(1, 8, 10))
    assert c.num_blocks - s.free_blocks == held
    _, rec = step(c, s)
    assert (1 in rids(rec)) is admitted


# =============================================================================================
# The in-flight set and GENERATION_TO_COMPLETE (the overlap executor's states)
# =============================================================================================
# Upstream passes `inflight_request_ids` to `schedule_request`; the executor's set is empty at pp_size 1
# (model/policies/trtllm_overlap.py, rule 1), so the model's step never passes one and these tests give it to the
# pass (`trtllm_v2._Pass`'s `inflight`). GENERATION_TO_COMPLETE is a request of the batch in flight
# (`Sched.in_flight`) whose token there is its last by length; those tests run whole steps of the overlap executor.

def inflight_pass(c, s, ids):
    """One S `schedule_request` call with `inflight_request_ids = ids`: the plan and the state after it."""
    from model.policies.trtllm_v2 import _Pass
    from model.policy import Plan
    plan = Plan()
    return _Pass(c, s, plan, inflight=frozenset(ids)).run(), plan


def overlap_cfg(**kw):
    """cfg in TensorRT-LLM's default loop, the overlap executor (disable_overlap_scheduler false)."""
    return cfg(**{**kw, "options": {**kw.get("options", {}), "disable_overlap_scheduler": False}})


def completing(rid, **kw):
    """GENERATION_TO_COMPLETE: in the batch in flight, with its 3rd and last token there (2 of max_new 3 applied;
    in the overlap executor its KV is one token ahead of them: 5 tokens in 2 pages)."""
    return replace(decoding(rid, 3, 3, 2, 4, blocks=2, **kw), computed=5)


def in_flight(*rids):
    from model.policies.trtllm_v2 import Sched
    return Sched(in_flight=tuple(rids))


def test_inflight_skipped():
    """UP::TestStateFiltering::test_inflight_skipped @ 00746ef9: gen0 and gen1, in flight {0} -> only gen1 is
    scheduled."""
    c = cfg()
    _, plan = inflight_pass(c, state(c, roomy(0), roomy(1)), {0})
    assert [s.rid for s in plan.scheduled] == [1]


def test_inflight_does_not_count_toward_batch():
    """UP::TestStateFiltering::test_inflight_does_not_count_toward_batch @ 00746ef9: max_batch_size 1, gen0 in
    flight, gen1 -> gen1 is scheduled (the in-flight request took no seat)."""
    c = cfg(max_batch_size=1)
    _, plan = inflight_pass(c, state(c, roomy(0), roomy(1)), {0})
    assert [s.rid for s in plan.scheduled] == [1]


def test_all_inflight():
    """UP::TestEdgeCases::test_all_inflight @ 00746ef9: both generation requests in flight ->
    num_fitting_requests == 0."""
    c = cfg()
    _, plan = inflight_pass(c, state(c, roomy(0), roomy(1)), {0, 1})
    assert plan.scheduled == []


def test_never_preempts_an_inflight_request():
    """UP::TestContextPreemption::test_never_preempts_an_inflight_request @ 00746ef9: GPU-only, ctx0 runs out of
    pages and the only preemptable request (a started context, upstream 99, here 1) is in flight ->
    preempt_request is never called."""
    c, s = _preemptible()
    _, plan = inflight_pass(c, s, {1})
    assert plan.preempted == [] and plan.scheduled == []


def test_all_candidates_inflight_never_raises():
    """UP::TestDeadlockDetection::test_all_candidates_inflight_never_raises @ 00746ef9: resize always fails,
    stall limit 2, the only context request (a started one) is in flight: 5 passes, no deadlock error (an
    in-flight request is counted by neither of the detector's counts)."""
    c = cfg(num_blocks=5, max_num_tokens=1000, options={"stall_limit": 2})
    s = state(c, continuation(0))
    for _ in range(5):
        s, plan = inflight_pass(c, s, {0})
        assert plan.error is None and s.sched.stalls == 0


def test_gen_to_complete_filtered():
    """UP::TestStateFiltering::test_gen_to_complete_filtered @ 00746ef9: one GENERATION_TO_COMPLETE request ->
    no context and no generation request scheduled. Model: the overlap executor's step; the request's last token
    lands in the same step and it finishes."""
    c = overlap_cfg()
    s2, rec = step(c, state(c, completing(0), sched=in_flight(0)))
    assert rec.scheduled == ()
    assert rec.finished == (0,) and s2.req(0).generated == 3 and s2.free_blocks == c.num_blocks


def test_recompute_pause_skips_generation_to_complete_victim():
    """UP::TestKVCacheFailuresGen::test_recompute_pause_skips_generation_to_complete_victim @ 00746ef9: every
    generation allocation fails; gen0 is current, gen1 is GENERATION_TO_COMPLETE with a suspended KV cache -> no
    generation scheduled, paused == [0] (gen0 suspends itself), no recompute-pause, free_resources not called by
    the pass. Model: a
    GPU-only pool with no free page, gen0 at a page boundary; the overlap executor's step (gen1's last token
    lands after the pass, and it finishes then)."""
    c = overlap_cfg(num_blocks=4, max_num_tokens=100)
    s = state(c, at_boundary(0), completing(1, suspended=True), sched=in_flight(1))
    s2, rec = step(c, s)
    assert rec.scheduled == () and rec.offloaded == (0,) and rec.preempted == ()
    assert s2.req(0).blocks == 2 and s2.req(0).suspended and s2.req(0).phase == Phase.DECODING
