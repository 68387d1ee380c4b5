"""sglang in SGLang's default loop, event_loop_overlap (model/policies/sglang_overlap.py; the reading is
docs/engine-notes/sglang_overlap.md): one test per rule that differs from event_loop_normal, each beside the same
workload in the normal loop, and the safety properties on random workloads in the overlap loop. The real
scheduler in the same loop: tests/test_target_sglang_overlap.py."""

from __future__ import annotations

import random

from model.policies.sglang import Options
from model.simulator import RequestSpec, Workload, simulate
from test_policy_sglang import P, cfg_of, random_design, run, safety_violations

NORMAL, OVERLAP = True, False   # disable_overlap_schedule


def steps(trace):
    return [(dict(r.scheduled), set(r.finished)) for r in trace.records]


def test_overlap_is_the_default_and_names_its_loop():
    assert Options().disable_overlap_schedule is False                     # fields/schedule.py:193-199
    assert P.loop(Options()).startswith("Scheduler.event_loop_overlap")
    assert P.loop(Options(disable_overlap_schedule=True)).startswith("Scheduler.event_loop_normal (not ")


def test_a_result_is_processed_the_iteration_after_its_batch():
    """Rule 1-3: a batch's tokens, finishes and frees land one iteration after its launch; its KV is committed at
    launch. A length finish is not decoded again (the _reqs_finishing_inflight skip), so it costs the same decodes as
    in the normal loop and one extra, empty, iteration."""
    normal, overlap = (run(cfg_of(disable_overlap_schedule=m), (4, 3)) for m in (NORMAL, OVERLAP))
    assert steps(normal) == [({0: 4}, set()), ({0: 1}, set()), ({0: 1}, {0})]
    assert steps(overlap) == [({0: 4}, set()), ({0: 1}, set()), ({0: 1}, set()), ({}, {0})]
    launched = overlap.states[1].req(0)
    assert launched.computed == 4 and launched.generated == 0 and launched.blocks == 4   # committed, not landed
    assert overlap.states[1].sched.in_flight == ((0, 1, 4),) and overlap.states[1].sched.in_flight_extend


def test_a_stop_token_costs_one_decode_slot_more():
    """Rule 6: a stop the scheduler cannot predict is decoded once more (its row is discarded), unlike a length
    finish; the slot is freed with the request."""
    normal, overlap = (run(cfg_of(disable_overlap_schedule=m), RequestSpec(4, 5, output_len=2))
                       for m in (NORMAL, OVERLAP))
    assert steps(normal) == [({0: 4}, set()), ({0: 1}, {0})]
    assert steps(overlap) == [({0: 4}, set()), ({0: 1}, set()), ({0: 1}, {0})]
    assert overlap.final.req(0).generated == 2 and overlap.final.free_blocks == 64


def test_a_row_freed_by_a_finish_is_admitted_into_one_iteration_later():
    """Rules 5 and 7: the finishing request still holds its row in the next pass (the latch sets), leaves the running
    batch by the length skip, which clears the latch, and frees its row when its result lands after that pass."""
    cfg = {m: cfg_of(max_batch_size=1, disable_overlap_schedule=m) for m in (NORMAL, OVERLAP)}
    normal, overlap = (run(cfg[m], (4, 1), (4, 1)) for m in (NORMAL, OVERLAP))
    assert steps(normal) == [({0: 4}, {0}), ({1: 4}, {1})]
    assert steps(overlap) == [({0: 4}, set()), ({}, {0}), ({1: 4}, set()), ({}, {1})]
    assert overlap.states[2].sched.batch_is_full is False and overlap.states[2].sched.running == ()


def test_a_request_retracted_with_its_token_in_flight_loses_that_token():
    """Rule 8: retraction frees the in-flight slot too, and the retracted request's row of the queued result is
    skipped (BRP:1022-1027): it is re-queued with one output fewer than in the normal loop. (Found by a random
    search of the overlap loop for a retraction of a request in the previous batch.)"""
    workload = [(5, 4, 2), (3, 7, 0), (4, 5, 0)]
    cfg = {m: cfg_of(num_blocks=20, schedule_conservativeness=0.01, disable_overlap_schedule=m)
           for m in (NORMAL, OVERLAP)}
    normal, overlap = (run(cfg[m], *workload) for m in (NORMAL, OVERLAP))
    assert overlap.records[5].preempted == (2,) and 2 in dict(overlap.records[4].scheduled)
    assert overlap.states[6].req(2).generated == overlap.states[5].req(2).generated == 2
    assert normal.records[5].preempted == (2,) and normal.states[6].req(2).generated == 3
    assert overlap.final.req(2).generated == normal.final.req(2).generated   # both regenerate to the end


def test_the_ratio_resets_only_after_two_idle_iterations():
    """Rule 10: on_idle (the ratio's reset) runs only when this iteration and the last launched nothing
    (SC:2118-2123); the normal loop resets at its first idle iteration."""
    workload = Workload((RequestSpec(4, 2), RequestSpec(4, 2, arrival=5)))
    for mode, first_idle in ((NORMAL, 2), (OVERLAP, 2)):
        cfg = cfg_of(disable_overlap_schedule=mode)
        trace = simulate(cfg, workload, 20)
        init = cfg.options.schedule_conservativeness * 0.7
        idle = [i for i, r in enumerate(trace.records) if not r.scheduled]
        assert idle[0] == first_idle, mode
        ratios = [s.sched.ratio for s in trace.states]    # states[i + 1]: after step i
        reset_by = first_idle + (1 if mode == NORMAL else 2)
        assert all(r < init for r in ratios[first_idle:reset_by]) and ratios[reset_by] == init, (mode, ratios)


def test_random_workloads_keep_the_safety_properties_in_the_overlap_loop():
    rng = random.Random(11)
    for _ in range(300):
        cfg, reqs = random_design(rng, radix=True, stops=True, disable_overlap_schedule=OVERLAP)
        t = simulate(cfg, Workload(tuple(reqs)), 3000)
        bad = safety_violations(cfg, t)
        assert not bad, (cfg, reqs, bad)
        if all(r.phase.terminal for r in t.final.requests) and t.final.error is None:
            evictable = t.final.prefix_cache[0].blocks if t.final.prefix_cache else 0
            assert t.final.free_blocks + evictable == cfg.num_blocks, (cfg, reqs)   # nothing leaked in flight


# SGLang #22518 (prefill-only requests deadlock after the first full batch under the overlap loop): the two latch
# resets 0.5.23 has, planted out of the model (proofs/plant.py), bring the stall back on the report's workload
LATCH_RESETS = [
    # the every-step running filter's reset (SC:3963-3968)
    ("        if len(kept) < len(running):\n            full = False\n", ""),
    # an empty running batch's reset (SC:4093-4096, PR #23138)
    ("        if preempting(self.cfg) or not s.running:\n", "        if preempting(self.cfg):\n"),
]


def test_22518_stalls_without_the_latch_resets():
    """Three prefill-only requests (max_new_tokens 0, an embedding server's shape) on two request rows: under overlap
    the first batch is merged before its result, the rows are full (the latch sets) and a prefill-only batch is
    never decoded (SC:3997), so only the filter that removes the finished requests can clear the latch. 0.5.23
    completes all three (the real scheduler agrees: tests/test_target_sglang_overlap.py::test_22518_...); without
    both resets the third request waits forever, as #22518 reports."""
    from proofs.plant import Patch, planted

    cfg = cfg_of(max_batch_size=2, disable_overlap_schedule=OVERLAP)
    workload = Workload(tuple(RequestSpec(4, 0) for _ in range(3)))
    fixed = simulate(cfg, workload, 50)
    assert fixed.end == "done" and all(r.phase.name == "FINISHED" for r in fixed.final.requests)
    assert fixed.states[2].sched.batch_is_full and fixed.states[2].sched.prefill_only
    with planted([Patch("model.policies.sglang", old, new) for old, new in LATCH_RESETS]):
        stalled = simulate(cfg, workload, 50)
        # the normal loop finishes the batch before the next pass: nothing latches, with or without the resets
        normal = simulate(cfg_of(max_batch_size=2, disable_overlap_schedule=NORMAL), workload, 50)
    assert stalled.end in ("fixpoint", "cycle"), stalled.end
    assert stalled.final.sched.batch_is_full and stalled.final.sched.waiting == (2,)
    assert P.stall_reason(cfg, stalled.final).startswith("running_batch.batch_is_full is set")
    assert normal.end == "done"
