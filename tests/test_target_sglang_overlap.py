"""The sglang target's overlap mode (options.disable_overlap_schedule = False, SGLang's default): one step is one pass
of the real `Scheduler.event_loop_overlap` body (scheduler.py:2078-2131) on the real scheduler, with the fake forward
inside run_batch's overlap path. What the SGLang source predicts is in docs/engine-notes/sglang_overlap.md (SC =
srt/managers/scheduler.py, BRP = srt/managers/scheduler_components/batch_result_processor.py).

Each test checks the engine against itself (the normal loop on the same workload) and against the source, with the
`sglang` policy in lockstep beside the engine in both loops (model/policies/sglang_overlap.py): every step agrees.
The random workloads in lockstep are tests/test_target_sglang.py::test_conformance_in_lockstep_over_1000_workloads.
"""

from __future__ import annotations

import pytest

from model.config import EngineConfig
from model.policies.sglang import Options
from model.state import Phase
from targets.protocol import Add, Cancel, Stop
from targets.sglang import STOP_TOKEN, output_token
from test_target_sglang import drive as sglang_drive

pytestmark = pytest.mark.engine


def cfg(overlap, pool=48, page=1, prefill=64, batch=4, chunk=None, **opts):
    opts.setdefault("disable_radix_cache", True)
    return EngineConfig(policy="sglang", block_size=page, num_blocks=pool // page, max_num_tokens=prefill,
                        max_batch_size=batch, chunked_prefill=chunk is not None,
                        options=Options(chunked_prefill_size=chunk or 8192, disable_overlap_schedule=not overlap,
                                        **opts))


def drive(c, plan, steps, check=None):
    """tests/test_target_sglang.py's `drive` (timed steps, the sglang policy in lockstep), and no step errs;
    `check(t, i, obs)` after each step."""
    def each(t, i, o):
        assert o.record.error is None, o.record.error
        if check is not None:
            check(t, i, o)
    return sglang_drive(c, plan, steps, check=each)


def decodes(obs, rid):
    """How many steps scheduled rid for one token (every prompt here is longer than one token: a decode)."""
    return sum((rid, 1) in o.record.scheduled for o in obs)


def finish_step(obs, rid):
    return next(i for i, o in enumerate(obs) if rid in o.record.finished)


def all_outputs(obs):
    out = {}
    for o in obs:
        out.update(o.outputs)
    return out


def test_the_overlap_loop_runs_a_workload_to_completion_on_the_real_machinery():
    # page 2, chunked prefill (8), the radix cache on; r2 is stopped, r3 cancelled while chunking, r4 while decoding
    plan = {0: [Add(0, 10, 4), Add(1, 20, 3)], 1: [Add(2, 5, 6)], 2: [Stop(2)],
            3: [Add(3, 30, 8), Add(4, 3, 30)], 5: [Cancel(3)], 8: [Cancel(4)]}
    c = cfg(True, pool=96, page=2, chunk=8, disable_radix_cache=False)
    launched = []

    def check(t, i, o):
        s = t.sched
        if o.record.scheduled:   # the batch just launched waits in result_queue, its result unprocessed
            assert len(s.result_queue) == 1
            queued = s.result_queue[0][0]
            assert [t._rid_of[r.rid] for r in queued.reqs] == [rid for rid, _ in o.record.scheduled]
            assert s.last_batch is not None
            launched.append(i)
        else:
            assert len(s.result_queue) == 0

    t, obs = drive(c, plan, 20, check)
    s = t.sched
    # the flags event_loop_overlap and its components run on (SC:500-502, 2063; copies at SC:2502, 2667)
    assert s.enable_overlap and s.enable_skip_finishing_decode
    assert s.batch_result_processor.enable_overlap and s.dp_attn_adapter.enable_overlap
    assert s.forward_stream is not None and s.forward_stream is not s.schedule_stream
    assert launched[0] == 0
    # every request is answered
    assert not t.unanswered()
    final = obs[-1].state.requests
    assert [r.phase for r in final] == [Phase.FINISHED, Phase.FINISHED, Phase.FINISHED, Phase.CANCELLED,
                                        Phase.CANCELLED]
    outs = all_outputs(obs)
    assert outs[0] == tuple(output_token(0, i) for i in range(4))
    assert outs[1] == tuple(output_token(1, i) for i in range(3))
    assert outs[2][-1] == STOP_TOKEN and outs[2][:-1] == tuple(output_token(2, i) for i in range(len(outs[2]) - 1))
    assert t.reqs[2].finished_reason.to_json()["type"] == "stop"
    # r4's cancel, at step 8's ingest, takes effect on the result processed in step 8 (batch 7's), and step 8's own
    # batch still carries r4: the abort is not predicted (SC:5675; BRP:1022-1027 skips that row)
    assert (4, 1) in obs[8].record.scheduled and obs[8].state.requests[4].phase == Phase.CANCELLED
    # the KV pool is balanced: what is not free is the tree's evictable prompts, nothing is locked
    assert s.result_queue == type(s.result_queue)() and s.last_batch is None
    tree = s.tree_cache
    assert tree.protected_size() == 0
    assert t.pool.available_size() + tree.evictable_size() == t.capacity
    assert tree.evictable_size() > 0


def test_results_are_one_step_late():
    # max_new 1: the prefill samples the only token. The normal loop answers in the step that runs the prefill; the
    # overlap loop launches it, and its result is processed after the next step's launch (SC:2118-2120). That next
    # step launches nothing: both requests are in the queued batch and finish by length, so update_running_batch
    # drops them and the batch is empty (_reqs_finishing_inflight, SC:4444-4467)
    plan = {0: [Add(0, 4, 1), Add(1, 3, 1)], 3: [Add(2, 5, 3)]}
    tn, normal = drive(cfg(False), plan, 8)
    to, over = drive(cfg(True), plan, 8)
    assert not tn.sched.enable_overlap and tn.sched.result_queue == type(tn.sched.result_queue)()
    assert normal[0].record.scheduled == over[0].record.scheduled == ((0, 4), (1, 3))
    assert normal[0].record.finished == (0, 1)
    assert over[0].record.finished == ()                        # nothing of the launched prefill is finished
    assert [r.phase for r in over[0].state.requests] == [Phase.DECODING, Phase.DECODING]
    assert over[1].record.scheduled == () and over[1].record.finished == (0, 1)
    assert all_outputs(normal)[0] == all_outputs(over)[0] == (output_token(0, 0),)
    # a 3-token request: prefill at step 3, two decodes; the overlap loop answers one step later
    assert finish_step(over, 2) == finish_step(normal, 2) + 1
    assert decodes(over, 2) == decodes(normal, 2) == 2


def test_a_length_finish_is_not_decoded_again_but_a_stop_costs_one_more_decode():
    # r0 finishes by length (max_new 5): the overlap loop drops it from running while its last token is in flight
    # (SC:4444-4474), so it is decoded as often as in the normal loop. r1 ends on a stop token, which the scheduler
    # cannot predict: it is decoded once more (the overshoot row, ignored by BRP:1022-1027). A step's stop applies
    # to the result processed in that step, the batch launched one step earlier under overlap, so the overlap run
    # is stopped one step later to end with the same tokens.
    s = 6
    tn, normal = drive(cfg(False, pool=64), {0: [Add(0, 4, 5), Add(1, 4, 20)], s: [Stop(1)]}, 16)
    to, over = drive(cfg(True, pool=64), {0: [Add(0, 4, 5), Add(1, 4, 20)], s + 1: [Stop(1)]}, 16)
    assert all_outputs(normal) == all_outputs(over)
    assert all_outputs(over)[1] == tuple(output_token(1, i) for i in range(s)) + (STOP_TOKEN,)
    assert decodes(normal, 0) == decodes(over, 0) == 4
    assert decodes(normal, 1) == s and decodes(over, 1) == s + 1
    assert finish_step(normal, 1) == s and finish_step(over, 1) == s + 1
    assert (1, 1) in over[s + 1].record.scheduled                   # the overshoot slot, launched as r1 finishes
    assert finish_step(over, 0) == finish_step(normal, 0) + 1
    for t in (tn, to):
        assert t.pool.available_size() == t.capacity


def test_both_loops_sample_the_same_tokens_without_retraction():
    plan = {0: [Add(0, 12, 6, prefix_group=0, prefix_len=8), Add(1, 20, 4)],
            1: [Add(2, 10, 9, prefix_group=0, prefix_len=8)],
            3: [Add(3, 3, 1), Add(4, 17, 7, prefix_group=0, prefix_len=8)], 6: [Add(5, 9, 5)]}
    runs = []
    for overlap in (False, True):
        t, obs = drive(cfg(overlap, pool=160, page=2, chunk=8, batch=3, disable_radix_cache=False), plan, 30)
        assert not t.unanswered()
        assert not any(o.record.preempted for o in obs)
        runs.append(all_outputs(obs))
    normal, over = runs
    assert sorted(normal) == list(range(6))
    assert normal == over
    for rid, toks in over.items():
        assert toks == tuple(output_token(rid, i) for i in range(len(toks)))


def test_a_retraction_under_overlap_drops_the_token_in_flight():
    # two 4 + 22 requests in a 48-token pool: the decode runs out at step 22 in both loops and r1 is retracted. Under
    # overlap its token sampled in the in-flight batch is lost (the retracted row is skipped, BRP:1022-1027): it
    # re-prefills 4 + 20 tokens instead of 4 + 21, and still ends with the same 22 tokens.
    plan = {0: [Add(0, 4, 22)], 1: [Add(1, 4, 22)]}
    tn, normal = drive(cfg(False), plan, 30)
    to, over = drive(cfg(True), plan, 30)
    kn = next(i for i, o in enumerate(normal) if o.record.preempted)
    ko = next(i for i, o in enumerate(over) if o.record.preempted)
    assert normal[kn].record.preempted == over[ko].record.preempted == (1,)
    assert normal[kn].state.requests[1].generated == 21 and over[ko].state.requests[1].generated == 20
    assert (1, 25) in sum((o.record.scheduled for o in normal), ())
    assert (1, 24) in sum((o.record.scheduled for o in over), ())
    assert all_outputs(normal) == all_outputs(over)
    assert all_outputs(over)[1] == tuple(output_token(1, i) for i in range(22))
    for t in (tn, to):
        assert not t.unanswered() and t.pool.available_size() == t.capacity


# -- negative controls: the lockstep catches an overlap rule planted wrong in the model -----------------------------
SKIP = "        finishing = self.finishing_in_flight(running)\n"
PLANTED = {
    # results land in the iteration that launched them, as in the normal loop
    "synchronous timing": ("model.policies.sglang",
                           "        if cfg.options.disable_overlap_schedule:\n            return super().step(",
                           "        if True:\n            return super().step("),
    # no _reqs_finishing_inflight: a length finish is decoded once more
    "no length-finish skip": ("model.policies.sglang", SKIP, "        finishing = []\n"),
    # the retracted request's in-flight token is kept
    "retracted token kept": ("model.policies.sglang_overlap",
                             "if r.phase.terminal or r.phase == Phase.PREEMPTED or not samples:",
                             "if r.phase.terminal or not samples:"),
    # on_idle after one idle iteration
    "ratio reset at once": ("model.policies.sglang",
                            "if not ran and self.plan.error is None and not self.s.in_flight:",
                            "if not ran and self.plan.error is None:"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_overlap_bug_in_the_model_diverges(bug):
    """Each overlap rule of the model, planted wrong (proofs/plant.py: the module's source patched for the test),
    makes the lockstep against the real event_loop_overlap diverge within 400 workloads."""
    from proofs.plant import Patch, planted
    from targets.conformance import CONFORMANCE
    from targets.lockstep import conformance

    module, old, new = PLANTED[bug]
    with planted([Patch(module, old, new)]):
        result = conformance("sglang", 400, seed=0, steps=30)
    assert result.divergence is not None, "\n".join(result.lines())
    assert result.divergence.violation.property == CONFORMANCE, result.divergence.violation


def test_fuzz_says_which_loop_it_drove():
    """`fuzz --target sglang --json` names the loop it searched: SGLang's default event_loop_overlap, or `--sync`'s
    event_loop_normal."""
    from schedproof.fuzz import fuzz

    default, sync = fuzz("sglang", examples=2, seed=0), fuzz("sglang", examples=2, seed=0, sync=True)
    assert default.as_dict()["loop"].startswith("Scheduler.event_loop_overlap")
    assert sync.as_dict()["loop"].startswith("Scheduler.event_loop_normal")
    assert sync.as_dict()["command"].endswith("--sync")


def test_22518_prefill_only_requests_complete_on_the_real_overlap_loop():
    """SGLang #22518's workload (three prefill-only requests, --max-running-requests 2) on 0.5.23's real
    event_loop_overlap: the first batch is merged before its result and latches the rows full, a prefill-only
    running batch is not decoded, and the every-step filter clears the latch once the result lands; the third
    request runs one iteration later and all three finish, the model agreeing at every step. Without the resets the
    model stalls: tests/test_policy_sglang_overlap.py::test_22518_stalls_without_the_latch_resets."""
    t, obs = drive(cfg(True, pool=64, batch=2), {0: [Add(0, 4, 0), Add(1, 4, 0), Add(2, 4, 0)]}, 5)
    assert [o.record.scheduled for o in obs[:3]] == [((0, 4), (1, 4)), (), ((2, 4),)]
    assert obs[1].state.sched.batch_is_full and obs[1].state.sched.running == (0, 1)
    assert obs[1].record.finished == (0, 1) and obs[3].record.finished == (2,)
    assert not t.unanswered() and t.pool.available_size() == t.capacity
