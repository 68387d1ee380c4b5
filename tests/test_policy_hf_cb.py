"""hf_cb: transformers 5.19.0 continuous batching. One test per mirrored rule, a ground-truth trace
from the real engine (docs/engine-notes/hf_cb.md §7), the acceptance sweep, and the scenario files."""

import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401
from model.config import ConfigError, EngineConfig, build_options
from model.policy import POLICIES, Env
from model.policies.hf_cb import ANON, ERROR, Options, Sched
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase, PrefixEntry, Request, State
from properties.registry import REGISTRY
from schedproof.runner import run_scenario
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parent.parent
POL = POLICIES["hf_cb"]


def cfg(nb=4, ps=4, mbt=8, mrb=1024, **opts):
    c = EngineConfig("hf_cb", ps, nb, mbt, mrb, chunked_prefill=True, options=build_options(Options, opts))
    POL.check_config(c)
    return c


def wl(*reqs):
    return Workload(tuple(RequestSpec(*r) if isinstance(r, tuple) else r for r in reqs))


def steps(c, w):
    """[(scheduled, free, cached, block_new)] per step."""
    t = simulate(c, w)
    return t, [(list(rec.scheduled), st.free_blocks, st.cached_blocks, st.sched.block_new)
               for rec, st in zip(t.records, t.states[1:])]


def state(c, reqs, free=None, **sched):
    """A State built directly; reqs are Request objects with rid = index."""
    return State(step=0, requests=tuple(reqs), free_blocks=c.num_blocks if free is None else free,
                 free_host_blocks=0, sched=Sched(**sched))


def one_step(c, st, env=Env()):
    return POL.step(c, st, env)


# -- configuration ---------------------------------------------------------------------------

def test_page_size_minimum_is_4():
    with pytest.raises(ConfigError, match="page_size must be at least 4"):
        cfg(ps=3)
    cfg(ps=4)


def test_chunked_prefill_must_be_on_and_host_blocks_zero():
    c = EngineConfig("hf_cb", 4, 4, 8, 8, chunked_prefill=False, options=Options())
    with pytest.raises(ConfigError) as e:
        POL.check_config(c)
    assert e.value.field == "engine.chunked_prefill"
    c = EngineConfig("hf_cb", 4, 4, 8, 8, host_blocks=4, chunked_prefill=True, options=Options())
    with pytest.raises(ConfigError) as e:
        POL.check_config(c)
    assert e.value.field == "engine.host_blocks"


def test_options_validated_in_transformers_names():
    with pytest.raises(ConfigError):
        build_options(Options, {"scheduler_type": "lifo"})
    with pytest.raises(ConfigError):
        build_options(Options, {"safety_margin": 1.5})
    with pytest.raises(ConfigError):
        build_options(Options, {"safety_margin": -0.1})
    o = build_options(Options, {"scheduler_type": "prefill_first", "safety_margin": 0.5, "allow_block_sharing": False})
    assert (o.scheduler_type, o.safety_margin, o.allow_block_sharing) == ("prefill_first", 0.5, False)


def test_fits_alone_is_prompt_plus_max_new_minus_one():
    c = cfg(nb=2, ps=4)
    assert POL.fits_alone(c, Request(0, 8, 1, 0))
    assert not POL.fits_alone(c, Request(0, 8, 2, 0))
    assert POL.fits_alone(c, Request(0, 1, 8, 0))
    assert not POL.fits_alone(c, Request(0, 9, 1, 0))


# -- rules -------------------------------------------------------------------------------------

def test_R2_fifo_decodes_before_prefills_then_waiting():
    c = cfg(nb=8, mbt=16)
    reqs = [Request(0, 9, 4, 0, phase=Phase.PREFILLING, computed=4, blocks=1),
            Request(1, 4, 4, 0, phase=Phase.DECODING, computed=4, generated=1, blocks=1),
            Request(2, 3, 4, 0, phase=Phase.WAITING)]
    st, rec = one_step(c, state(c, reqs, free=6, active=(0, 1), waiting=(2,)))
    assert list(rec.scheduled) == [(1, 1), (0, 5), (2, 3)]


def test_R3_prefill_first_prefills_before_decodes():
    c = cfg(nb=8, mbt=16, scheduler_type="prefill_first")
    reqs = [Request(0, 4, 4, 0, phase=Phase.DECODING, computed=4, generated=1, blocks=1),
            Request(1, 9, 4, 0, phase=Phase.PREFILLING, computed=4, blocks=1)]
    st, rec = one_step(c, state(c, reqs, free=6, active=(0, 1)))
    assert list(rec.scheduled) == [(1, 5), (0, 1)]


def test_R5_R6_fifo_out_of_margin_stops_at_first_prefill():
    # free 0 of 3 < 0.15: r0 decodes, r1 (PREFILLING) ends the loop: not starved, no offload (notes trace c, nb=3)
    c = cfg(nb=3)
    _, s = steps(c, wl((5, 4), (5, 4)))
    assert s[1] == ([(0, 1)], 0, 0, False)
    assert s[3] == ([(0, 1)], 1, 1, False)   # r0 finishes: 1 hashed block cached, its last block freed
    assert s[4] == ([(1, 2)], 0, 1, False)


def test_R5_safety_margin_evicts_cached_blocks():
    c = cfg(nb=4)
    reqs = [Request(0, 3, 4, 0, phase=Phase.DECODING, computed=3, generated=1, blocks=1)]
    st = state(c, reqs, free=0, active=(0,))
    st = State(0, st.requests, 0, 0, st.sched, prefix_cache=(PrefixEntry(-1, 3, 0),))
    st2, rec = one_step(c, st)
    assert st2.free_blocks == 3 and st2.cached_blocks == 0 and any("evicted 3" in n for n in rec.notes)
    # prefill_first (margin 0.0) never evicts from the margin check
    c = cfg(nb=4, scheduler_type="prefill_first")
    st2, rec = one_step(c, State(0, st.requests, 0, 0, st.sched, prefix_cache=(PrefixEntry(-1, 3, 0),)))
    assert st2.free_blocks == 0 and st2.cached_blocks == 3


def test_R5_user_margin_overrides_default():
    c = cfg(nb=4, scheduler_type="prefill_first", safety_margin=0.5)
    reqs = [Request(0, 4, 4, 0, phase=Phase.DECODING, computed=4, generated=1, blocks=2),
            Request(1, 3, 4, 0, phase=Phase.WAITING), Request(2, 3, 4, 0, phase=Phase.WAITING)]
    # free 1/4 < 0.5: r0 decodes, then waiting r1 (not DECODING) ends the loop
    _, rec = one_step(c, state(c, reqs, free=1, active=(0,), waiting=(1, 2)))
    assert list(rec.scheduled) == [(0, 1)]


def test_R7_R10_token_budget_splits_prefill():
    c = cfg(nb=8, mbt=8)
    _, s = steps(c, wl((5, 2), (6, 2)))
    assert s[0][0] == [(0, 5), (1, 3)]
    assert s[1][0] == [(0, 1), (1, 3)]


def test_R11_max_requests_per_batch_capped_by_max_batch_tokens():
    c = cfg(nb=16, mbt=2, mrb=8)
    _, s = steps(c, wl((1, 3), (1, 3), (1, 3)))
    assert s[0][0] == [(0, 1), (1, 1)]
    c = cfg(nb=16, mbt=16, mrb=1)
    _, s = steps(c, wl((1, 3), (1, 3)))
    assert s[0][0] == [(0, 1)]


def test_R8_R9_all_or_nothing_allocation_skips_and_continues():
    # r0 (waiting, needs 2 blocks) fails, r1 (needs 1) is still scheduled behind it
    c = cfg(nb=4, mbt=16, scheduler_type="prefill_first")
    reqs = [Request(0, 3, 4, 0, phase=Phase.DECODING, computed=3, generated=1, blocks=3),
            Request(1, 8, 4, 0, phase=Phase.WAITING), Request(2, 2, 4, 0, phase=Phase.WAITING)]
    st, rec = one_step(c, state(c, reqs, free=1, active=(0,), waiting=(1, 2)))
    assert list(rec.scheduled) == [(0, 1), (2, 2)]
    assert st.req(1).phase == Phase.WAITING and st.req(1).blocks == 0


def test_R13_none_triggers_offload_of_newest_starved_and_block_new():
    # trace c2 step 4: r0 and r1 decode at a block boundary with 0 free: r1 (newest) is NOT reset,
    # r0 is: both starved, the loop pops the LAST starved (r1 is first in candidates? no: r0 first)
    c = cfg(nb=4)
    reqs = [Request(0, 5, 8, 0, phase=Phase.DECODING, computed=8, generated=4, blocks=2),
            Request(1, 5, 8, 0, phase=Phase.DECODING, computed=8, generated=4, blocks=2),
            Request(2, 5, 8, 0, phase=Phase.WAITING)]
    st, rec = one_step(c, state(c, reqs, free=0, active=(1, 0), waiting=(2,)))
    assert rec.preempted == (0,)
    assert list(rec.scheduled) == [(1, 1)]
    r0 = st.req(0)
    assert (r0.phase, r0.computed, r0.blocks, r0.generated, r0.context_len) == (Phase.PREEMPTED, 0, 0, 4, 9)
    assert st.sched.block_new and st.sched.waiting == (2, 0) and st.sched.active == (1,)
    assert st.free_blocks == 1


def test_R16_offload_keeps_last_active_request_and_R17_error():
    c = cfg(nb=1, ps=4)
    t = simulate(c, wl((4, 2), (1, 1, 5)))
    assert t.end == "error" and t.final.error == ERROR
    rec = t.records[-1]
    assert rec.error_kind == "deadlock" and rec.step == 1
    assert all(r.phase == Phase.FAILED and r.reason == ERROR for r in t.final.requests)


def test_R16_offload_stops_when_remaining_starved_fit():
    # three decodes each need 1 block, 1 free: popping r2 frees 1 -> 2 free, r0 and r1 fit -> stop
    c = cfg(nb=7, mbt=16, scheduler_type="prefill_first")
    reqs = [Request(i, 4, 8, 0, phase=Phase.DECODING, computed=8, generated=5, blocks=2) for i in range(3)]
    st, rec = one_step(c, state(c, reqs, free=1, active=(0, 1, 2)))
    # first pass: r0 gets the block; r1, r2 starved -> second offload pass (API:519) pops r2, then r1 fits
    assert list(rec.scheduled) == [(0, 1)]
    assert rec.preempted == (2,)
    assert st.req(1).phase == Phase.DECODING and st.free_blocks == 2


def test_R14_R20_finish_clears_block_new_and_caches_hashed_blocks():
    c = cfg(nb=4)
    reqs = [Request(0, 5, 2, 0, phase=Phase.DECODING, computed=5, generated=1, blocks=2),
            Request(1, 3, 2, 0, phase=Phase.PREEMPTED, generated=1)]
    st = state(c, reqs, free=2, active=(0,), waiting=(1,), block_new=True, hashed=((0, 1),))
    st, rec = one_step(c, st)
    assert rec.finished == (0,) and list(rec.scheduled) == [(0, 1)]   # r1 blocked this step
    assert not st.sched.block_new and st.cached_blocks == 1 and st.free_blocks == 3
    st, rec = one_step(c, st)
    assert list(rec.scheduled) == [(1, 4)]


def test_R15_last_token_never_written():
    c = cfg(nb=1, ps=4)
    t = simulate(c, wl((1, 4)))
    assert t.end == "done" and t.final.req(0).phase == Phase.FINISHED
    assert max(s.requests[0].blocks for s in t.states) == 1


def test_R23_allow_block_sharing_false_caches_nothing():
    c = cfg(nb=4, allow_block_sharing=False)
    _, s = steps(c, wl((5, 4), (5, 4), (5, 4)))
    assert all(cached == 0 for _, _, cached, _ in s)


def test_R20_cancel_does_not_clear_block_new_idle_forever():
    """Read from the code (notes §3): cancelling the last active request right after a soft reset leaves
    block_new_requests set, so the reset request is never a candidate again: schedule_batch returns []."""
    c = cfg(nb=4)
    t = simulate(c, wl(RequestSpec(5, 8), RequestSpec(5, 8, cancel_at=5)))
    offs = [rec.step for rec in t.records if rec.preempted]
    assert offs and offs[0] < 5
    assert t.end == "fixpoint" and t.final.sched.block_new
    assert any(r.phase == Phase.PREEMPTED for r in t.final.requests)


# -- block sharing between the requests of a prefix group (R21-R23) -----------------------------

def g(prompt, max_new, arrival=0, group=0, plen=8, **kw):
    return RequestSpec(prompt, max_new, arrival, prefix_group=group, prefix_len=plen, **kw)


def unreferenced(st):
    """The engine's `len(ledger.cached_blocks)`: hashed blocks no request references."""
    return sum(e.blocks for e in st.prefix_cache if e.group == ANON) + \
        sum(1 for _, slots in st.sched.slots for x in slots if x == 0)


def shared_refs(st):
    """The engine's `ledger.shared_ref_counts` values (only blocks referenced by 2+ requests), sorted."""
    return sorted(x for _, slots in st.sched.slots for x in slots if x >= 2)


def test_R21_pending_request_matches_hashed_prefix_blocks():
    """SCH `_infer_request_tokens` :118-139, CA `match_prefix_blocks` :268-280: r1 arrives after r0 hashed the 2
    blocks of their shared 8-token prefix; it starts at position 8 and prefills only its own 2 tokens."""
    t, s = steps(cfg(nb=6, mbt=16), wl(g(10, 3), g(10, 3, arrival=1)))
    assert s[1][0] == [(0, 1), (1, 2)]
    st = t.states[2]
    assert (st.req(1).computed, st.req(1).blocks, st.req(1).shared_blocks) == (10, 1, 2)
    assert st.prefix_cache == (PrefixEntry(0, 2, 2),) and shared_refs(st) == [2, 2]


def test_R21_match_never_covers_the_whole_prompt():
    """CA:275: at most (len(prompt) - 1) // page blocks are matched, so an all-prefix 8-token prompt matches 1 block."""
    t, s = steps(cfg(nb=6, mbt=16), wl(g(8, 3), g(8, 3, arrival=1)))
    assert s[1][0] == [(0, 1), (1, 4)]
    assert t.states[2].req(1).computed == 8 and t.states[2].req(1).shared_blocks == 2   # 2nd block de-duplicated


def test_R22_simultaneous_prefills_deduplicate_on_hashing():
    """CA `mark_complete_blocks` :290-311: two requests prefill the same prefix in one step; the second one's
    copies are de-duplicated after the forward (it adopts the first one's blocks, its own go back to the pool)."""
    t, s = steps(cfg(nb=8, mbt=32), wl(g(10, 3), g(10, 3)))
    assert s[0][0] == [(0, 10), (1, 10)] and s[0][1] == 8 - 4
    st = t.states[1]
    assert [(r.blocks, r.shared_blocks) for r in st.requests] == [(1, 2), (1, 2)] and shared_refs(st) == [2, 2]


def test_R23_offloading_a_request_whose_blocks_are_all_shared_frees_nothing():
    """seeds.md 1 mechanism, OM `offload_requests` :156-242 with CA `BlockLedger.release` :66-93: r2 matches the two
    shared blocks (refs 3), cannot get its third block and is soft reset; the release only drops its references."""
    t, s = steps(cfg(nb=5, mbt=16), wl(g(10, 6), g(10, 6, arrival=2), g(10, 6, arrival=3)))
    before, after = t.states[3], t.states[4]
    assert t.records[3].preempted == (2,) and "r2 prefix match: 2 shared block(s)" in t.records[3].notes
    assert after.req(2).phase == Phase.PREEMPTED and after.req(2).shared_blocks == 0
    assert after.free_blocks == 0 and before.free_blocks == 1   # r0's decode took the last free block; r2 gave none
    assert shared_refs(after) == [2, 2]


def test_R23_last_release_caches_group_blocks_then_eviction_frees_them():
    t, s = steps(cfg(nb=6, mbt=16), wl(g(9, 2), g(9, 2, arrival=1)))
    assert t.end == "done" and t.final.prefix_cache and all(e.refs == 0 for e in t.final.prefix_cache)
    assert unreferenced(t.final) == t.final.cached_blocks == 6 - t.final.free_blocks


def test_allow_block_sharing_false_ignores_prefix_groups():
    _, s = steps(cfg(nb=6, mbt=16, allow_block_sharing=False), wl(g(10, 3), g(10, 3, arrival=1)))
    assert s[1][0] == [(0, 1), (1, 10)] and all(cached == 0 for _, _, cached, _ in s)


# -- ground truth from the real engine ---------------------------------------------------------
# Traces of the real transformers 5.19.0 engine (tiny random Llama, greedy, page 4; prompts as targets/protocol.py
# `prompt_tokens` makes them), as data: the configuration (`cfg` keywords), the workload (`wl` arguments) and per
# step the batch [(rid, query len)], free blocks, cached blocks (`len(ledger.cached_blocks)`: hashed blocks no
# request references), block_new_requests and, with block sharing, the sorted values of `ledger.shared_ref_counts`;
# `resets`: the rids soft reset, in order. The tests below pin the model to them; the engine's side is re-derived
# on every run by tests/test_scenarios_on_engines.py::test_pinned_traces_on_transformers, which drives the real
# engine through the same workloads and asserts the same lists. The C traces are those of the notes §7 (c)
# (out_c.txt / out_c2.txt, docs/engine-notes/hf_cb.md).

_C2_SCHEDULED = [[(0, 5), (1, 3)], [(0, 1), (1, 2)], [(0, 1), (1, 1)], [(0, 1), (1, 1)]] + [[(1, 1)]] * 5 \
    + [[(2, 5)], [(2, 1), (0, 7)]] + [[(2, 1)]] * 6 + [[(0, 8)]] + [[(0, 1)]] * 4
_C2_FKB = [
    (1, 0, False), (0, 0, False), (0, 0, False), (0, 0, False), (2, 0, True), (1, 0, True), (1, 0, True),
    (1, 0, True), (2, 2, False), (0, 2, False), (0, 0, False), (0, 0, False), (0, 0, False), (1, 0, True),
    (1, 0, True), (1, 0, True), (2, 2, False), (0, 2, False), (1, 0, False), (1, 0, False), (1, 0, False),
    (2, 2, False)]
ENGINE_TRACES = {
    "c_fifo": dict(
        cfg=dict(nb=4), workload=((5, 4), (5, 4), (5, 4)),
        scheduled=[[(0, 5), (1, 3)], [(0, 1), (1, 2)], [(0, 1), (1, 1)], [(0, 1), (1, 1)], [(1, 1)], [(2, 5)],
                   [(2, 1)], [(2, 1)], [(2, 1)]],
        free=[1, 0, 0, 1, 2, 0, 2, 2, 3], cached=[0, 0, 0, 1, 2, 2, 0, 0, 1], block_new=[False] * 9, resets=[]),
    "c_prefill_first": dict(
        cfg=dict(nb=4, scheduler_type="prefill_first"), workload=((5, 4), (5, 4), (5, 4)),
        scheduled=[[(0, 5), (1, 3)], [(1, 2), (0, 1)], [(0, 1), (1, 1)], [(0, 1), (1, 1)], [(1, 1)], [(2, 5)],
                   [(2, 1)], [(2, 1)], [(2, 1)]],
        free=[1, 0, 0, 1, 2, 0, 0, 0, 1], cached=[0, 0, 0, 1, 2, 2, 2, 2, 3], block_new=[False] * 9, resets=[]),
    "c_three_blocks": dict(
        cfg=dict(nb=3), workload=((5, 4), (5, 4)),
        scheduled=[[(0, 5), (1, 3)], [(0, 1)], [(0, 1)], [(0, 1)], [(1, 2)], [(1, 1)], [(1, 1)], [(1, 1)]],
        free=[0, 0, 0, 1, 0, 1, 1, 2], cached=[0, 0, 0, 1, 1, 0, 0, 1], block_new=[False] * 8, resets=[]),
    "c2_soft_resets": dict(
        cfg=dict(nb=4), workload=((5, 8), (5, 8), (5, 8)), scheduled=_C2_SCHEDULED,
        free=[f for f, _, _ in _C2_FKB], cached=[k for _, k, _ in _C2_FKB], block_new=[b for _, _, b in _C2_FKB],
        resets=[0, 0]),
    # Shared prefixes, FIFO. A: 6 blocks, 9-token prompts with an 8-token prefix; r1 and r2 arrive at step 2 and
    # match 2 blocks (r2 is PREFILLING at 8 but waits for a block until r0 finishes).
    "shared_prefix_a": dict(
        cfg=dict(nb=6, mbt=16), workload=(g(9, 6), g(9, 6, arrival=2), g(9, 6, arrival=2)),
        scheduled=[[(0, 9)], [(0, 1)]] + [[(0, 1), (1, 1)]] * 4 + [[(1, 1), (2, 1)]] * 2 + [[(2, 1)]] * 4,
        free=[3, 3, 2, 2, 1, 2, 0, 2, 2, 2, 1, 2], cached=[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 4],
        shared_refs=[[], [], [3, 3], [3, 3], [3, 3], [2, 2], [2, 2]] + [[]] * 5, resets=[]),
    # B: 5 blocks, 10-token prompts with an 8-token prefix; r2 matches at step 3, is starved and soft reset (freeing
    # nothing: all its blocks are shared), matches again at step 6 and finishes.
    "shared_prefix_b": dict(
        cfg=dict(nb=5, mbt=16), workload=(g(10, 6), g(10, 6, arrival=2), g(10, 6, arrival=3)),
        scheduled=[[(0, 10)], [(0, 1)], [(0, 1), (1, 2)]] + [[(0, 1)]] * 3 + [[(1, 1), (2, 2)]] + [[(1, 1)]] * 4
        + [[(2, 1)]] * 5,
        free=[2, 2, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 2], cached=[0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 3],
        shared_refs=[[], [], [2, 2], [2, 2], [2, 2], [], [2, 2], [2, 2], [2, 2], [2, 2]] + [[]] * 6,
        block_new=[False] * 3 + [True] * 2 + [False] * 11, resets=[2]),
    # C: 8 blocks, max_batch_tokens 8: r0's 13-token prompt (12-token prefix) is chunked 8 + 5; r1 matches 2 blocks
    # at step 1 and de-duplicates its third after step 2; r2 has no group; r3 matches 3 blocks at step 5.
    "shared_prefix_c": dict(
        cfg=dict(nb=8, mbt=8), workload=(g(13, 4, plen=12), g(13, 4, arrival=1, plen=12), RequestSpec(6, 3, 1),
                                         g(13, 4, arrival=5, plen=12)),
        scheduled=[[(0, 8)], [(0, 5), (1, 3)], [(0, 1), (1, 2), (2, 5)], [(0, 1), (1, 1)], [(0, 1), (1, 1)],
                   [(1, 1), (2, 1), (3, 1)], [(2, 1), (3, 1)], [(2, 1), (3, 1)], [(3, 1)]],
        free=[6, 3, 1, 1, 2, 2, 2, 3, 4], cached=[0, 0, 0, 0, 0, 0, 0, 1, 4],
        shared_refs=[[], [2, 2], [2, 2, 2], [2, 2, 2]] + [[]] * 5, resets=[]),
}


def engine_trace(name):
    """The simulator's run of a pinned engine trace's workload, and per step (scheduled, free, cached, block_new,
    shared refs) in the fields the trace pins."""
    e = ENGINE_TRACES[name]
    t = simulate(cfg(**e["cfg"]), wl(*e["workload"]))
    return t, {"scheduled": [list(rec.scheduled) for rec in t.records],
               "free": [st.free_blocks for st in t.states[1:]],
               "cached": [unreferenced(st) for st in t.states[1:]],
               "block_new": [st.sched.block_new for st in t.states[1:]],
               "shared_refs": [shared_refs(st) for st in t.states[1:]],
               "resets": [rid for rec in t.records for rid in rec.preempted]}


def assert_matches_engine(name):
    t, got = engine_trace(name)
    for field, want in ENGINE_TRACES[name].items():
        if field not in ("cfg", "workload"):
            assert got[field] == want, field
    return t


def test_trace_c_fifo_matches_engine():
    t = assert_matches_engine("c_fifo")
    assert t.end == "done"


def test_trace_c_prefill_first_matches_engine():
    t = assert_matches_engine("c_prefill_first")
    assert t.end == "done"


def test_trace_c_three_blocks_matches_engine():
    t = assert_matches_engine("c_three_blocks")
    assert t.end == "done"


def test_trace_c2_soft_resets_match_engine():
    t = assert_matches_engine("c2_soft_resets")
    assert t.end == "done" and all(r.generated == 8 for r in t.final.requests)


def test_trace_shared_prefix_a_matches_engine():
    t = assert_matches_engine("shared_prefix_a")
    assert t.end == "done" and not any(rec.preempted for rec in t.records)


def test_trace_shared_prefix_b_offload_frees_nothing_matches_engine():
    """Real: 1 soft reset (r2), which frees nothing."""
    t = assert_matches_engine("shared_prefix_b")
    assert t.end == "done" and all(r.generated == 6 for r in t.final.requests)


def test_trace_shared_prefix_c_chunked_matches_engine():
    t = assert_matches_engine("shared_prefix_c")
    assert t.end == "done" and not any(rec.preempted for rec in t.records)


# -- acceptance: the engine error exactly when one request alone cannot fit --------------------

@pytest.mark.parametrize("nb,ps,mbt", [(1, 4, 8), (2, 4, 8), (2, 4, 3), (3, 4, 16), (2, 8, 5), (4, 4, 4)])
def test_single_request_boundary(nb, ps, mbt):
    c = cfg(nb=nb, ps=ps, mbt=mbt)
    cap = nb * ps
    for p, n in [(cap, 1), (cap, 2), (cap + 1, 1), (cap - 1, 2), (cap - 1, 3), (1, cap), (1, cap + 1),
                 (2, cap - 1), (2, cap)]:
        t = simulate(c, wl((p, n)))
        over = p + n - 1 > cap
        assert (t.end == "error") == over, (p, n)
        assert (t.final.error == ERROR) == over
        if not over:
            assert t.final.req(0).phase == Phase.FINISHED


def _random_spec(rng, cap):
    """Mostly requests that fit alone (prompt + max_new - 1 <= cap), 1 in 12 just over or far over."""
    if rng.random() < 1 / 12:
        total = rng.randint(cap + 1, cap + 6)
    else:
        total = rng.randint(1, cap)
    prompt = rng.randint(1, total)
    group = rng.choice([-1, 0, 0, 1])   # most requests in a prefix group, some without
    plen = rng.randint(0, prompt) if group >= 0 else 0
    return RequestSpec(prompt, total - prompt + 1, rng.randint(0, 6), prefix_group=group, prefix_len=plen)


def test_random_sweep_error_iff_some_request_does_not_fit():
    rng = random.Random(20250519)
    counts = {"done": 0, "error": 0}
    resets = matches = 0
    for i in range(300):
        nb, ps = rng.randint(1, 6), rng.choice([4, 8])
        c = cfg(nb=nb, ps=ps, mbt=rng.choice([1, 2, 3, 5, 8, 16, 64]), mrb=rng.choice([1, 2, 4, 1024]),
                scheduler_type=rng.choice(["fifo", "prefill_first"]),
                allow_block_sharing=rng.random() < 0.8)
        cap = nb * ps
        specs = [_random_spec(rng, cap) for _ in range(rng.randint(1, 8))]
        w = Workload(tuple(specs))
        t = simulate(c, w, max_steps=5000)
        bad = any(s.prompt + s.max_new - 1 > cap for s in specs)
        counts[t.end] += 1
        resets += any(rec.preempted for rec in t.records)
        assert t.end in ("done", "error"), (i, t.end, c, specs)
        assert (t.end == "error") == bad, (i, c, specs)
        if not bad:
            assert all(r.phase == Phase.FINISHED for r in t.final.requests), (i, c, specs)
        for prev, rec, cur in zip(t.states, t.records, t.states[1:]):
            for pid in ("SAFE-BLOCKS", "SAFE-NO-LEAK"):
                assert REGISTRY[pid].step_check(c, prev, rec, cur) is None, (i, pid, rec.step, c, specs)
            for group, slots in cur.sched.slots:   # per-block refs = requests referencing that block
                users = [r.shared_blocks for r in cur.requests if r.prefix_group == group]
                assert list(slots) == [sum(1 for u in users if u > b) if x >= 0 else -1
                                       for b, x in enumerate(slots)], (i, rec.step, c, specs)
        matches += sum(1 for rec in t.records for n in rec.notes if "prefix match" in n)
    # the sweep exercises both outcomes, the offloading manager and prefix matches
    assert counts["done"] >= 100 and counts["error"] >= 50 and resets >= 30 and matches >= 30, (counts, resets, matches)


# -- scenarios ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("hf-*.toml")), ids=lambda p: p.name)
def test_scenarios_match_expectation(path):
    res = run_scenario(load(path))
    assert res.matches_expectation() == []


def test_a_batch_of_only_empty_prompts_crashes_like_the_engine():
    """Finding 2 of docs/findings/README.md: the forward pass of zero query tokens raises; with another
    request in the batch the empty prompt is scheduled with a 0-token query and decodes."""
    from targets.protocol import Add
    from targets.reference import ReferenceTarget

    cfg = EngineConfig(policy="hf_cb", block_size=4, num_blocks=8, max_num_tokens=16, max_batch_size=4,
                       chunked_prefill=True, options=Options())
    alone = ReferenceTarget(cfg)
    alone.add(Add(0, 0, 3))
    obs = alone.step()
    assert obs.record.error_kind == "crash" and "cannot reshape tensor of 0 elements" in obs.record.error
    mixed = ReferenceTarget(cfg)
    mixed.add(Add(0, 0, 3))
    mixed.add(Add(1, 3, 3))
    obs = mixed.step()
    assert obs.record.error is None and obs.record.scheduled == ((0, 0), (1, 3))
