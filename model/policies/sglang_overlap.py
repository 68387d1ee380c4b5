"""SGLang's batch at its two ends: launched by one iteration, its result processed by the same one
(`event_loop_normal`, --disable-overlap-schedule) or by the next (`event_loop_overlap`, SGLang's default).

Mirrors sglang==0.5.23 (python/sglang/srt/...; the reading is docs/engine-notes/sglang_overlap.md):
  SC  = managers/scheduler.py   event_loop_overlap (2060-2134), _reqs_finishing_inflight (4444-4457),
                                update_running_batch (4459-4474), get_next_batch_to_run's every-step filter
                                (3963-3968), is_disable_overlap_for_batch (2136-2175)
  BRP = managers/scheduler_components/batch_result_processor.py   process_batch_result_prefill (258-440),
                                process_batch_result_decode (952-1075)
  SB  = managers/schedule_batch.py   next_output_finishes_by_length (1661-1663), update_finish_state (2007),
                                owned_kv_len (1552-1564)
  AL  = mem_cache/allocation.py  alloc_for_decode (625-688): kv_committed_len advances when the slot is allocated
  CM  = mem_cache/common.py      checkpoint_kv_cache (271-281: up to extend_end), release_kv_cache (400-444)

`launch` is what scheduling a batch does to its requests at once: the KV they compute is committed
(`kv_committed_len`, the model's `computed`, with its pages) and the batch is queued with, per request, whether
the forward samples a token for it and where its extend ends. `land` is result processing: the sampled token is
appended (`generated`), the finish check runs and a finished request is released into the tree.

The normal loop lands a batch in the iteration that launched it (`Sglang.execute`). The overlap loop
(`overlap_step`) launches batch k, then lands batch k-1: the scheduling pass of k sees k-1's requests with
their last output missing, still unfinished, their KV and request rows not freed. Two rules of the pass read
the queued batch and live in the pass itself (model/policies/sglang.py `_Iteration`): the length-finish skip
(`finishing_in_flight`) and `on_idle` needing two idle iterations in a row.

Why not model/pipeline.py's `pipelined_step`: that is vLLM's batch queue (`step_with_batch_queue`: schedule only
when the scheduler has requests, return early while the queue has room, land the oldest); SGLang's loop always
schedules, launches, then lands the previous batch (a fixed one-batch lag, SC:2084-2120), and its scheduling pass
itself reads the queued batch, so the shared part would be the two calls below and nothing else.

Divergences (also docs/fidelity/sglang.md): consecutive prefills overlap as by default
(SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP false, environ.py:693; its opt-in path is not modelled); no grammar
(`launch_batch_sample_if_needed` is a no-op without `delay_sample_func`, SC:5044-5072), no speculative decoding.
"""

from __future__ import annotations

from ..config import EngineConfig, cdiv
from ..policy import Env, Plan, replace
from ..state import Phase, State, StepRecord


def launch(cfg: EngineConfig, state: State, plan: Plan) -> State:
    """run_batch: every scheduled request's KV for this batch is committed now (prepare_for_extend /
    prepare_for_decode; AL:684-686 for decode), and the batch becomes the queued one. A middle chunk (the pass's
    chunked request) samples nothing that counts (BRP:308-312, `inflight_middle_chunks`)."""
    s = state.sched
    rows = []
    for sc in plan.scheduled:
        r = state.req(sc.rid)
        computed = r.computed + sc.tokens
        if sc.rid == s.chunked:
            r = replace(r, computed=computed, phase=Phase.PREFILLING)
        else:
            r = replace(r, computed=computed, phase=Phase.DECODING,
                        blocks=cdiv(computed, cfg.block_size) - r.shared_blocks)
        state = state.with_request(r)
        rows.append((sc.rid, int(sc.rid != s.chunked), computed))
    sched = replace(s, in_flight=tuple(rows), in_flight_extend=s.last_extend is not None)
    return replace(state, sched=sched)


def land(policy, cfg: EngineConfig, state: State, rows: tuple[tuple[int, int, int], ...], extend: bool,
         stops: frozenset[int]) -> tuple[State, list[int], list[int]]:
    """process_batch_result for one batch, in its order (BRP process_batch_result_prefill / _decode): a request
    finished since its launch, or retracted since (`is_retracted`), is skipped and the token sampled for it is
    lost (BRP:343-349, 1022-1027); a middle chunk samples nothing; otherwise the token is appended and
    update_finish_state runs: an abort received meanwhile (`to_finish`, SB:2011-2014), a stop token (without
    ignore_eos) or the length cap finishes the request and releases it into the tree (BRP:387-391, 1466), and a
    prefill that is done goes into the tree up to its extend_end (checkpoint_kv_cache, BRP:393-394).
    Returns the state, the finished and the rejected (aborted at arrival: their 1-token prefill ends them)."""
    finished, rejected = [], []
    for rid, samples, end in rows:
        r = state.req(rid)
        if r.phase.terminal or r.phase == Phase.PREEMPTED or not samples:
            continue
        s = state.sched
        if rid in s.doomed and rid not in s.to_finish:
            # its 1-token prefill ran; it ends with its arrival abort, the tree keeping [0]
            state = policy.release(cfg, state, rid, keep=True)
            state = state.with_request(replace(state.req(rid), phase=Phase.REJECTED, computed=0,
                                               reason="prompt too long (the input-length check)"))
            state = replace(state, sched=replace(state.sched, doomed=tuple(x for x in s.doomed if x != rid)))
            rejected.append(rid)
            continue
        r = replace(r, generated=r.generated + 1)
        state = state.with_request(r)
        if rid in s.to_finish:
            # a cancel's FINISH_ABORT; it replaces an arrival abort's (SC abort_request sets `to_finish` on any
            # unfinished request in flight, scheduler.py:5795-5808), which only the overlap loop leaves in flight
            state = policy.release(cfg, state, rid, keep=True)
            state = state.with_request(replace(state.req(rid), phase=Phase.CANCELLED))
            state = replace(state, sched=replace(state.sched, doomed=tuple(x for x in s.doomed if x != rid),
                                                 to_finish=tuple(x for x in s.to_finish if x != rid)))
        elif (rid in stops and not cfg.options.ignore_eos) or r.generated >= s.cap(rid):
            state = policy.finish(cfg, state, rid)
            finished.append(rid)
        elif extend:
            state = policy.checkpoint_prefill(cfg, state, rid, end)
    return state, finished, rejected


def overlap_step(policy, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
    """One pass of SC event_loop_overlap's body (SC:2073-2131): ingest, get_next_batch_to_run with the last batch
    still queued, launch the new batch, then process the last batch's result. Overlap is never disabled for a
    batch here (SC:2136-2175: only with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP or grammar + spec decoding)."""
    if state.error is not None:
        return state, StepRecord(step=state.step, notes=("engine is dead",))
    plan = Plan()
    state = policy.admit_env(cfg, state, env, plan)                      # SC:2078 ingest_requests
    queued, queued_extend = state.sched.in_flight, state.sched.in_flight_extend
    state = policy.schedule(cfg, state, plan)                            # SC:2084-2089
    if plan.error is not None:
        return policy.fail_all(cfg, state, plan)
    state = launch(cfg, state, plan)                                     # SC:2108-2112, or nothing queued
    state, finished, rejected = land(policy, cfg, state, queued, queued_extend, frozenset(env.stops))   # SC:2118
    return policy.close_step(cfg, state, plan, finished, rejected)
