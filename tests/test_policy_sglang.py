"""sglang: one test per mirrored rule of SGLang 0.5.23's scheduler (model/policies/sglang.py, citations there),
the bundled scenarios, and the safety properties on random workloads."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401  (registers the policies)
from model.config import ConfigError, EngineConfig, build_options
from model.policies.sglang import (CLIP_MAX_NEW_TOKENS, LAST_REQUEST_OOM, Options, Ratio, arrival_max_new,
                                   max_req_input_len)
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase
from properties import evaluate
from schedproof.runner import run_scenario
from schedproof.scenario import load

P = POLICIES["sglang"]
ROOT = Path(__file__).resolve().parent.parent
R = Phase


def cfg_of(block_size=1, num_blocks=64, max_num_tokens=64, max_batch_size=4, chunked_prefill=False, **opts):
    opts.setdefault("disable_radix_cache", True)      # these tests are about the cache-off paths
    # the rules pinned step by step in event_loop_normal; the overlap loop's: tests/test_policy_sglang_overlap.py
    opts.setdefault("disable_overlap_schedule", True)
    cfg = EngineConfig("sglang", block_size, num_blocks, max_num_tokens, max_batch_size,
                       chunked_prefill=chunked_prefill, options=build_options(Options, opts))
    P.check_config(cfg)
    return cfg


def run(cfg, *reqs, steps=5000):
    return simulate(cfg, Workload(tuple(RequestSpec(*r) if isinstance(r, tuple) else r for r in reqs)), steps)


def scheduled(trace, step):
    return dict(trace.records[step].scheduled)


# -- configuration --------------------------------------------------------------------------------------

def test_refusals_name_the_field():
    with pytest.raises(ConfigError) as e:
        cfg_of(block_size=4, chunked_prefill=True, chunked_prefill_size=6)
    assert e.value.field == "engine.options.chunked_prefill_size"       # validation_hook.py:243-246
    with pytest.raises(ConfigError) as e:
        P.check_config(EngineConfig("sglang", 1, 64, 64, 4, host_blocks=2, options=Options()))
    assert e.value.field == "engine.host_blocks"
    with pytest.raises(ConfigError) as e:
        P.check_config(EngineConfig("sglang", 1, 6, 64, 4, options=Options()))
    assert e.value.field == "engine.num_blocks"                          # max_req_len - 5 <= 0


# -- arrival: the clip and the input-length abort ------------------------------------------------------

def test_arrival_clip_by_context_and_by_the_empty_pool():
    cfg = cfg_of()
    assert arrival_max_new(cfg, 30, 100) == 32                 # C - ceil_page(P) - page - 1 = 64 - 30 - 2
    assert arrival_max_new(cfg, 30, 10) == 10
    assert arrival_max_new(cfg_of(context_len=40), 30, 100) == 8     # max_req_len - P - 1 = 39 - 30 - 1
    assert arrival_max_new(cfg_of(block_size=8, num_blocks=8), 57, 16) == 0   # 64 - 64 - 8 - 1 < 0
    t = run(cfg, (30, 100))
    assert t.final.sched.cap(0) == 32 and t.final.req(0).max_new == 100      # the request keeps what it asked
    assert t.final.req(0).generated == 32 and t.final.req(0).phase == R.FINISHED


def test_a_request_clipped_to_nothing_still_samples_one_token():
    """ceil_page(50) + page + 1 > 64 - ... leaves max_new 0; admission passes (nothing left to reserve), the
    prefill samples a token and the length check ends the request after it (SB update_finish_state)."""
    cfg = cfg_of(block_size=8, num_blocks=8, ignore_eos=True)
    assert arrival_max_new(cfg, 50, 10) == 0
    t = run(cfg, (50, 10))
    assert t.final.req(0).phase == R.FINISHED and t.final.req(0).generated == 1


def test_a_prompt_at_the_input_limit_drains_as_a_one_token_prefill_and_is_rejected():
    cfg = cfg_of(num_blocks=32)
    assert max_req_input_len(cfg) == 26
    t = run(cfg, (26, 4), (4, 4))
    assert scheduled(t, 0) == {0: 1, 1: 4}        # set_finish_with_abort: origin_input_ids = [0]
    assert t.records[0].rejected == (0,)
    r = t.final.req(0)
    assert (r.phase, r.blocks, r.generated) == (R.REJECTED, 0, 0) and "too long" in r.reason
    assert t.final.req(1).phase == R.FINISHED


# -- prefill admission ----------------------------------------------------------------------------------

def test_prefill_first_and_the_first_request_may_exceed_max_prefill_tokens():
    t = run(cfg_of(max_num_tokens=16), (20, 4), (4, 4))
    assert scheduled(t, 0) == {0: 20}            # the first request is admitted past max_prefill_tokens
    assert scheduled(t, 1) == {1: 4}             # the next iteration prefills before r0 decodes
    assert scheduled(t, 2) == {0: 1, 1: 1}


def test_chunked_prefill_off_stops_a_pass_when_the_prompt_reaches_what_is_left():
    # max_prefill_tokens 16: after r0 (8), 8 is left and ceil_page(8) >= 8 is OTHER (SP _select_prefill_admission)
    t = run(cfg_of(max_num_tokens=16), (8, 10), (8, 10))
    assert scheduled(t, 0) == {0: 8} and scheduled(t, 1) == {1: 8}


def test_new_requests_are_charged_in_full_running_ones_at_the_ratio_and_no_token_latches():
    """r0 (8 + 10 + 1 = 19 < 40) is admitted at step 0; at step 1 r1 is admitted against r0's 9 remaining
    tokens x 0.7; r2 then needs 19 < 40 - 16 - (9 x 0.7 + 19) and gets NO_TOKEN: batch_is_full is set and no
    prefill is attempted until a request leaves the running batch."""
    t = run(cfg_of(num_blocks=40, max_num_tokens=16), (8, 10), (8, 10, 1), (8, 10, 1))
    assert scheduled(t, 1) == {1: 8}
    assert t.states[2].sched.batch_is_full
    full = [s.sched.batch_is_full for s in t.states[2:12]]
    assert all(full)
    assert 2 in scheduled(t, 11) and not t.states[12].sched.batch_is_full   # cleared by r0, r1 leaving
    assert all(r.phase == R.FINISHED for r in t.final.requests)


def test_the_latch_is_cleared_when_requests_leave_the_running_batch():
    """r2 is latched out at step 1; r0 and r1 are cancelled at step 4: they decode once more and end at that
    result, the next iteration's filter drops them, which clears the latch, and r2 is admitted."""
    cfg = cfg_of(num_blocks=40, max_num_tokens=16)
    t = run(cfg, (8, 10, 0, None, 4), (8, 10, 1, None, 4), (8, 10, 1))
    assert t.states[2].sched.batch_is_full and scheduled(t, 4) == {0: 1, 1: 1}
    assert t.states[5].req(0).phase == R.CANCELLED and t.states[5].sched.batch_is_full
    assert scheduled(t, 5) == {2: 8} and not t.states[6].sched.batch_is_full


def test_allocatable_rows_latch_without_memory_pressure():
    t = run(cfg_of(max_batch_size=1), (4, 4), (4, 4))
    assert scheduled(t, 0) == {0: 4}
    assert t.states[1].sched.batch_is_full           # SC:4121-4126: no request row left
    assert scheduled(t, 4) == {1: 4}                 # r0 finished at step 3 and was filtered at step 4


def test_ignore_eos_admission_refuses_what_the_clip_allows():
    """SP add_one_req_ignore_eos: free - paged_input - tokens_left must exceed 1 token; the clip lets
    max_new reach C - P - 2 on a page-1 pool, where this is exactly 1."""
    stall = run(cfg_of(ignore_eos=True), (30, 100), (4, 4))
    assert stall.end == "fixpoint" and not any(rec.scheduled for rec in stall.records)
    ok = run(cfg_of(ignore_eos=True), (30, 31), (4, 4))
    assert ok.end == "done" and all(r.phase == R.FINISHED for r in ok.final.requests)
    # without ignore_eos the same request is admitted: 30 + 32 + 1 < 64
    assert run(cfg_of(), (30, 100), (4, 4)).end == "done"


def test_ignore_eos_admission_keeps_sglangs_insertion_order():
    """The second admission of a pass inserts its (tokens left, occupied) before the first entry with at least as
    many tokens left, or, past every entry, before the last one (SP add_req_state); the check then runs over
    that order. Here the order decides: r1 (left 20) lands before r0 (left 4), so the batch that finishes r0
    first is simulated with r1's 20 tokens charged at batch size 2."""
    cfg = cfg_of(num_blocks=60, max_num_tokens=60, ignore_eos=True)
    t = run(cfg, (10, 4), (10, 20))
    assert scheduled(t, 0) == {0: 10}            # r1 refused in the pass that admitted r0
    assert t.states[1].sched.batch_is_full


# -- chunked prefill --------------------------------------------------------------------------------------

def test_one_chunked_request_continues_first_in_page_aligned_chunks():
    t = run(cfg_of(block_size=2, num_blocks=32, chunked_prefill=True, chunked_prefill_size=4), (11, 2), (3, 2))
    assert scheduled(t, 0) == {0: 4}
    assert t.states[1].req(0).phase == R.PREFILLING and t.states[1].sched.chunked == 0
    assert scheduled(t, 1) == {0: 4}
    assert scheduled(t, 2) == {0: 3}             # the last chunk; the budget left (1) does not fit r1's page
    assert t.states[3].sched.chunked == -1 and t.states[3].req(0).generated == 1
    assert all(r.phase == R.FINISHED for r in t.final.requests)


# -- decode: ratio, retraction ----------------------------------------------------------------------------

def test_the_ratio_decays_every_decode_step_and_resets_only_when_fully_idle():
    cfg = cfg_of()
    ratio = Ratio.of(cfg.options)
    assert ratio.init == 0.7 and ratio.min == pytest.approx(0.098)
    t = run(cfg, (4, 6), (4, 2, 12))          # r0: a prefill and 5 decode steps; r1 arrives at step 12
    assert t.states[6].sched.ratio == pytest.approx(0.7 - 5 * ratio.decay)
    # step 6 filters the finished r0 and runs nothing: fully idle already (the engine's last_batch is the
    # running batch, filtered empty in place), so the ratio is reset
    assert not t.records[6].scheduled and t.states[7].sched.ratio == 0.7
    assert t.states[14].sched.ratio == pytest.approx(0.7 - ratio.decay)


def test_decode_out_of_memory_retracts_the_least_preferred_to_the_tail_keeping_outputs():
    """Two requests admitted on the ratio's discount outgrow the pool; the one with fewer outputs is retracted,
    re-queued at the tail with its outputs kept; the ratio jumps to the estimate over what is kept."""
    cfg = cfg_of(num_blocks=60, schedule_conservativeness=1.0)
    t = run(cfg, (4, 30), (4, 30))
    k = next(i for i, rec in enumerate(t.records) if rec.preempted)
    before, after = t.states[k], t.states[k + 1]
    assert before.free_blocks < 2                          # check_decode_mem: a token for each of two
    assert t.records[k].preempted == (1,)                  # fewer outputs: retracted first
    r1 = after.req(1)
    assert (r1.phase, r1.blocks, r1.computed, r1.generated) == (R.PREEMPTED, 0, 0, before.req(1).generated)
    assert after.sched.waiting[-1] == 1 and after.sched.running == (0,)
    g0 = before.req(0).generated
    assert after.sched.ratio == pytest.approx(min(1.0, (g0 + 20) / (30 + 1)))
    assert all(r.phase == R.FINISHED and r.generated == 30 for r in t.final.requests)


def test_the_last_request_is_aborted_when_even_it_does_not_fit():
    """Constructed state: one running request whose next token needs a page the pool does not have (no
    workload of the plain model reaches it: the arrival clip keeps every lone request within the pool, and no
    chunk can be in flight while a request decodes)."""
    import dataclasses

    from model.policy import Env
    from model.state import Request, State
    cfg = cfg_of(num_blocks=16)
    r0 = Request(0, 4, 12, 0, phase=R.DECODING, computed=10, generated=7, blocks=10)
    sched = P.initial_sched(cfg)
    state = State(0, (r0,), free_blocks=0, free_host_blocks=0,
                  sched=dataclasses.replace(sched, running=(0,)))
    state2, rec = P.step(cfg, state, Env())
    assert rec.failed == (0,) and rec.error is None and not rec.scheduled
    assert state2.req(0).phase == R.FAILED and state2.req(0).reason == LAST_REQUEST_OOM
    # the ratio's estimate over nothing kept is 0, and on_idle of the same iteration, now fully idle, resets it
    assert state2.free_blocks == 10 and state2.sched.running == () and state2.sched.ratio == 0.7


# -- cancellation ---------------------------------------------------------------------------------------

def test_a_cancelled_queued_request_leaves_at_once_and_one_in_flight_at_its_next_result():
    t = run(cfg_of(), (4, 8), (4, 8, 0, None, 0), (4, 8, 0, None, 2))
    assert t.states[1].req(1).phase == R.CANCELLED and 1 not in scheduled(t, 0)
    assert t.states[3].req(2).phase == R.CANCELLED and 2 in scheduled(t, 2)   # ran once more, then ended
    assert t.states[3].req(2).blocks == 0


# -- scenarios and properties ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("sglang-*.toml")), ids=lambda p: p.stem)
def test_bundled_scenario_meets_its_expectation(path):
    sc = load(path)
    result = run_scenario(sc)
    assert result.verdict == sc.expect.verdict
    assert result.completed == sc.expect.completed and result.failed == sc.expect.failed


def random_design(rng: random.Random, radix: bool = False, stops: bool = False, **options):
    """A random small design and workload: with `radix` the cache on or off at random (else off), with `stops` some
    requests ending early on a stop token."""
    page = rng.choice([1, 2, 4])
    knobs = dict(block_size=page, num_blocks=rng.randint(8, 32), max_num_tokens=rng.randint(4, 40),
                 max_batch_size=rng.randint(1, 4), chunked_prefill=rng.random() < 0.5,
                 chunked_prefill_size=page * rng.randint(1, 4), ignore_eos=rng.random() < 0.5,
                 schedule_conservativeness=rng.choice([0.3, 1.0]))
    if radix:
        knobs["disable_radix_cache"] = rng.random() < 0.5
    reqs = []
    for _ in range(rng.randint(1, 5)):
        prompt, max_new, arrival = rng.randint(1, 20), rng.randint(1, 30), rng.randint(0, 4)
        output_len = rng.choice([None, None, rng.randint(1, 6)]) if stops else None
        reqs.append(RequestSpec(prompt, max_new, arrival, output_len=output_len,
                                cancel_at=rng.choice([None, None, None, rng.randint(0, 10)])))
    return cfg_of(**knobs, **options), reqs


def safety_violations(cfg, trace) -> list:
    start = trace.states[0].requests
    return [v for v in evaluate(trace, lambda rid: P.fits_alone(cfg, start[rid]), 100).violations
            if v.property.startswith("SAFE")]


def test_random_workloads_keep_the_safety_properties():
    rng = random.Random(7)
    for _ in range(300):
        cfg, reqs = random_design(rng)
        bad = safety_violations(cfg, simulate(cfg, Workload(tuple(reqs)), 3000))
        assert not bad, (cfg, reqs, bad)


def test_the_stall_is_explained_by_the_refusal_at_the_head():
    stall = load(ROOT / "scenarios" / "sglang-ignore-eos-clip-stall.toml")
    t = simulate(stall.cfg, stall.workload, 100)
    reason = P.stall_reason(stall.cfg, t.final)
    assert "add_one_req_ignore_eos" in reason and "leave 1" in reason and "reach 32" in reason
    assert [f for f, _ in P.stall_changes(stall.cfg, t.final)] == [{"engine.options.context_len": 63}]
    rounding = load(ROOT / "scenarios" / "sglang-page-rounding-stall.toml")
    t = simulate(rounding.cfg, rounding.workload, 100)
    assert "needs 72 tokens" in P.stall_reason(rounding.cfg, t.final)
    assert [f for f, _ in P.stall_changes(rounding.cfg, t.final)] == [{"engine.num_blocks": 9}]
    default = load(ROOT / "scenarios" / "sglang-page-rounding-stall-default-cache.toml")    # the radix cache on
    t = simulate(default.cfg, default.workload, 100)
    assert "needs 65 tokens (57 to prefill, 0 to generate, a page of 8)" in P.stall_reason(default.cfg, t.final)
    assert "fewer than the 64 free and evictable" in P.stall_reason(default.cfg, t.final)
    assert [f for f, _ in P.stall_changes(default.cfg, t.final)] == [{"engine.num_blocks": 9}]
    ok = load(ROOT / "scenarios" / "sglang-ignore-eos-below-clip.toml")
    reasons = [P.stall_reason(ok.cfg, s) for s in simulate(ok.cfg, ok.workload, 100).states]
    assert not any(r and "head of the queue" in r for r in reasons)     # only the latch, while r0 runs


def test_an_empty_prompt_is_refused_before_the_scheduler():
    t = run(cfg_of(), (0, 4), (4, 4))
    assert t.records[0].rejected == (0,) and t.final.req(0).phase == R.REJECTED
    assert t.final.req(0).reason == "input_ids cannot be empty." and t.final.req(1).phase == R.FINISHED


# -- priority scheduling ------------------------------------------------------------------------------

def admission_order(trace) -> list[int]:
    return [rid for rec in trace.records for rid, _ in rec.scheduled if trace.states[rec.step].req(rid).computed == 0]


@pytest.mark.parametrize("low_first, order", [(False, [2, 0, 1]), (True, [0, 1, 2])])
def test_priority_sorts_the_queue_by_priority_then_queue_entry(low_first, order):
    """schedule_policy.py _sort_by_priority_and_fcfs: (priority x sign, wait_queue_entry_time); one request row,
    so each is admitted alone when the one before finishes."""
    cfg = cfg_of(max_batch_size=1, enable_priority_scheduling=True, schedule_low_priority_values_first=low_first,
                 disable_priority_preemption=True)
    t = run(cfg, RequestSpec(4, 2), RequestSpec(4, 2), RequestSpec(4, 2, priority=11))
    assert admission_order(t) == order
    assert not any(rec.preempted for rec in t.records)


@pytest.mark.parametrize("priorities, victim", [((11, 0), 1), ((0, 0), 1), ((0, 11), 0)])
def test_priority_preemption_takes_the_lowest_priority_newest_first(priorities, victim):
    """preempt_to_schedule sorts the running by (priority, newest queue entry first); one offset covers r2's
    charge here, so one request is preempted: released, re-queued at the tail with its outputs kept."""
    cfg = cfg_of(max_batch_size=2, enable_priority_scheduling=True)
    t = run(cfg, RequestSpec(4, 20, priority=priorities[0]), RequestSpec(4, 20, priority=priorities[1]),
            RequestSpec(4, 3, arrival=2, priority=33))
    k = next(i for i, rec in enumerate(t.records) if rec.preempted)
    assert t.records[k].preempted == (victim,) and dict(t.records[k].scheduled) == {2: 4}
    after = t.states[k + 1]
    r = after.req(victim)
    assert (r.phase, r.computed, r.preemptions) == (R.PREEMPTED, 0, 1) and r.generated > 0
    assert after.sched.waiting == (victim,) and after.sched.preempted_for_priority == (victim,)
    assert all(rr.phase == R.FINISHED for rr in t.final.requests)


def test_priority_preemption_is_tried_only_on_full_request_rows():
    """SGLang #14872's mechanism: with rows free, a request refused for memory stops the pass (NO_TOKEN) and
    waits, though preempting the lower-priority running request would make room."""
    cfg = cfg_of(num_blocks=40, max_batch_size=4, enable_priority_scheduling=True, schedule_conservativeness=1.0)
    t = run(cfg, RequestSpec(4, 30), RequestSpec(4, 11, arrival=1, priority=33))
    assert not any(rec.preempted for rec in t.records)
    assert admission_order(t) == [0, 1]
    finish = next(i for i, rec in enumerate(t.records) if rec.finished == (0,))
    assert all(t.states[i + 1].req(1).phase == R.WAITING for i in range(1, finish + 1))
