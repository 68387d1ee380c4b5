"""The vllm_v1 model's default loop, async scheduling (model/pipeline.py, model/policies/vllm_v1_async.py), on its
own: no engine needed. The real AsyncScheduler's agreement is tests/test_target_vllm_async.py's and the lockstep
campaigns'; here the rules each step applies, cited in the module."""

from __future__ import annotations

import dataclasses

from helpers import config
from model.pipeline import Launched
from model.policy import POLICIES, Env
from model.simulator import RequestSpec, Workload, initial_state, simulate
from model.state import Phase

P = POLICIES["vllm_v1"]


def cfg_of(**options):
    options = {"max_model_len": 32, "enable_prefix_caching": False, **options}
    return config("vllm_v1", block_size=4, num_blocks=9, max_num_tokens=16, max_batch_size=4, chunked_prefill=True,
                  options=options)


def test_async_scheduling_is_the_default_as_in_vllm():
    assert cfg_of().options.async_scheduling is True


def test_a_batch_is_processed_one_call_after_it_is_scheduled():
    """EC:754-759: the first call only queues its batch; from the second on, each call schedules one batch and
    processes the previous one, so a request's tokens land a call after they were scheduled."""
    cfg = cfg_of()
    state = initial_state(cfg, Workload((RequestSpec(3, 2),)))
    state, rec = P.step(cfg, state, Env(arrivals=(0,)))
    r = state.req(0)
    assert rec.scheduled == ((0, 3),) and r.computed == 3 and r.generated == 0 and r.phase == Phase.DECODING
    assert state.sched.in_flight == ((Launched(0, 3, samples=True),),)
    assert state.sched.flight == ((0, 1, 3, 0),)         # one placeholder, 3 tokens in flight, none stale
    state, rec = P.step(cfg, state, Env())
    r = state.req(0)
    # the decode of the token still in flight is scheduled (num_tokens + placeholders - computed = 1), then the
    # prefill's token lands
    assert rec.scheduled == ((0, 1),) and r.computed == 4 and r.generated == 1
    assert state.sched.flight == ((0, 1, 1, 0),)


def test_no_token_is_scheduled_past_max_tokens():
    """S:664-677: once the last token is in flight the request is skipped; it finishes when that token lands."""
    cfg = cfg_of()
    trace = simulate(cfg, Workload((RequestSpec(3, 2),)), max_steps=20)
    assert [rec.scheduled for rec in trace.records][:3] == [((0, 3),), ((0, 1),), ()]
    assert trace.records[2].finished == (0,) and trace.final.req(0).generated == 2
    assert sum(rec.num_tokens for rec in trace.records) == 3 + 2 - 1


def test_a_finished_request_keeps_the_loop_scheduling_once_more():
    """S:2813-2830 `has_requests`: a request finished since the last schedule is still to be reported, so the next
    call schedules (an empty batch) although nothing is unfinished; the call after it has nothing to do."""
    cfg = cfg_of()
    trace = simulate(cfg, Workload((RequestSpec(3, 1),)), max_steps=20)
    assert trace.end == "done"
    state = trace.final
    assert state.sched.finished_pending and not state.sched.running
    state, rec = P.step(cfg, state, Env())
    assert rec.scheduled == () and not state.sched.finished_pending and state.sched.in_flight == ((),)
    state, rec = P.step(cfg, state, Env())
    assert state.sched.in_flight == () and rec.notes == ()
    state, rec = P.step(cfg, state, Env())
    assert rec.notes == ("idle step",)


def test_a_fresh_token_with_no_placeholder_left_is_the_engines_assertion():
    """AS:67-68: landing a token that is not stale on a request with no placeholder fails `num_output_placeholders
    >= 0` and kills the engine; the model raises it as a crash (no workload of the 0.32 rules reaches it: the
    planted mutants of tests/test_target_vllm_async.py do)."""
    cfg = cfg_of()
    state = initial_state(cfg, Workload((RequestSpec(3, 4),)))
    state, _ = P.step(cfg, state, Env(arrivals=(0,)))
    state = dataclasses.replace(state, sched=dataclasses.replace(state.sched, flight=((0, 0, 3, 0),)))
    state, rec = P.step(cfg, state, Env())
    assert rec.error_kind == "crash" and "num_output_placeholders >= 0" in rec.error
    assert state.req(0).phase == Phase.FAILED


def test_the_batch_in_flight_is_part_of_the_state():
    """Two states that differ only in what is in flight behave differently, so cycle detection must see it."""
    cfg = cfg_of()
    state = initial_state(cfg, Workload((RequestSpec(3, 2),)))
    state, _ = P.step(cfg, state, Env(arrivals=(0,)))
    drained = dataclasses.replace(state, sched=dataclasses.replace(state.sched, in_flight=()))
    assert state.key() != drained.key()


def test_the_synchronous_loop_is_unchanged():
    """async_scheduling = false: `Policy.step`, and none of the async memory is kept."""
    cfg = cfg_of(async_scheduling=False)
    trace = simulate(cfg, Workload((RequestSpec(3, 2),)), max_steps=20)
    assert [rec.scheduled for rec in trace.records] == [((0, 3),), ((0, 1),)]
    assert all(s.sched.in_flight == () and s.sched.flight == () and not s.sched.finished_pending
               for s in trace.states)


def test_the_claims_say_which_loop_they_are_decided_in():
    """`prove` lists each claim with its loop: the vLLM claims are about the synchronous Scheduler (their designs
    set async_scheduling = false, which the symbolic core requires), and they say vLLM's default is not decided."""
    from proofs.claims import CLAIMS
    from proofs.run import ProofEvent
    from schedproof.provereport import event_lines, loop

    vllm = [c for c in CLAIMS if c.policy == "vllm_v1"]
    assert vllm and all(c.design.options.async_scheduling is False for c in vllm)
    assert loop(vllm[0]) == "Scheduler under EngineCore.step (synchronous, not vLLM's default async scheduling)"
    overlapping = [c for c in CLAIMS if c.policy in ("sglang", "trtllm_v1", "trtllm_v2")]
    assert overlapping and all("(not " in loop(c) and "default" in loop(c) for c in overlapping)
    assert event_lines(ProofEvent("claim", vllm[0]))[1] == f"  loop: {loop(vllm[0])}"
