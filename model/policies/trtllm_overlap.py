"""TensorRT-LLM's overlap executor, `PyExecutor._executor_loop_overlap`: the engine's default loop
(`disable_overlap_scheduler` false) for both TensorRT-LLM policies, trtllm_v1 and trtllm_v2. Single rank only
(pp_size 1, no attention DP, no disagg, no encoder-decoder); drafts are all rejected, as in the other loop.

Mirrors NVIDIA/TensorRT-LLM, the 1.4.0rc line the policies cite (the reading, with character offsets:
docs/engine-notes/trtllm_overlap.md):
  PE1 = tensorrt_llm/_torch/pyexecutor/py_executor.py @ 002f3cc3 (the trtllm_v1 policy's commit):
        `PyExecutor.__init__` (the loop chosen: `_executor_loop` if disable_overlap_scheduler else
        `_executor_loop_overlap`, for pp_size 1), `_executor_loop_overlap`, `_update_request_states_tp`,
        `_update_generation_requests_that_will_complete_next_iteration`, `_process_previous_batch`,
        `_handle_responses`, `_terminate_requests`, `_pause_requests`, `_add_inflight_ids`
  PE2 = the same file @ 00043967 (the executor of the KV cache manager V2 the trtllm_v2 policy cites):
        `_terminate_recompute_paused_requests`, `_pause_recompute_paused_requests`
  H   = cpp/include/tensorrt_llm/batch_manager/llmRequest.h @ 00e9b8a7: `willCompleteNextIteration`, `pause`
  S1  = tensorrt_llm/_torch/pyexecutor/scheduler/scheduler.py @ 002f3cc3: `PyMicroBatchScheduler`
        (no_schedule_after_state = GENERATION_TO_COMPLETE), the capacity schedulers (range up to
        GENERATION_COMPLETE), `MaxUtilizationPolicy` `is_started_request`
  S2  = tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py @ 00746ef9: `KVCacheV2Scheduler._schedule_loop`
        (phase 1's state filter after `budget.requests_full`), `_is_recompute_pause_candidate`, `_detect_deadlock`

One model step is one iteration k of PE1 `_executor_loop_overlap` (`overlap_step`), rule by rule:
1. Schedule k (`_prepare_and_schedule_batch` -> `_schedule`) on the requests as the host sees them: batch k-1 has
   been launched (its KV written, its context cursor moved, a finished context turned generation) but its sampled
   tokens are not applied yet. The in-flight set the scheduler is given, `inflight_req_ids`, stays EMPTY at
   pp_size 1: only `_executor_loop_pp` calls `_add_inflight_ids` (PE1). So batch k-1's requests are not excluded:
   they are scheduled again (their input token is batch k-1's device tensor), and they are eligible victims. The
   schedulers' in-flight filters (S1 micro-batch `if req.request_id in inflight_request_ids: continue`, S2's
   phase-1 filter) therefore never fire in this loop; the passes take the set as an argument for the upstream
   tests that pass one (tests/fidelity/), always empty here.
2. GENERATION_TO_COMPLETE (`to_complete`): a request of batch k-1 whose sampled token is its last by length
   (H `willCompleteNextIteration`: generated + 1 >= max_new, no EOS check), marked in iteration k-1 by
   `_update_generation_requests_that_will_complete_next_iteration` (generation) or `_update_request_states_tp`
   (a last context chunk with max_new 1). The micro-batch scheduler (S1, range up to GENERATION_TO_COMPLETE) and
   V2 (S2 phase 1, after the requests_full break) skip it: no batch seat, no tokens; V1's capacity schedulers
   (range up to GENERATION_COMPLETE) count it, reserve its blocks and may pause it (MAX_UTILIZATION); V2 never makes
   it a recompute-pause or context-preemption victim and leaves it out of the deadlock detector's generation
   count, but may suspend it (S2 `_is_evictable`). The model keeps no state for it: it is read off `in_flight`
   (batch k-1's sampling requests) and the request's counts, as the engine's marker reads them.
3. Pause victims' KV is freed before the launch (PE1 `_terminate_requests(paused)` for V1, PE2
   `_terminate_recompute_paused_requests` for V2): in the pass, as in the other loop.
4. Launch k (`launch`): `prepare_resources`, `_forward_step`, `_update_request_states(k)`: the KV of the batch is
   written (`computed`), a chunk's cursor moves, a last chunk turns the request into a generation request. No
   token is appended yet (`generated` stays), so between launch and landing a generation request has
   computed = prompt + generated (one more than the other loop's prompt + generated - 1).
5. Land k-1 (`land`), after the launch: `_update_requests(previous_batch)` appends each sampled token and applies
   the stop criteria (a stop token or the length); then the pause victims: V1 `_pause_requests` ->
   H `pause(max_input_len)` on every victim, finished or not (no `is_finished` guard: a victim whose in-flight
   token finished it is put back to CONTEXT_INIT with that token in its prompt); V2
   `_pause_recompute_paused_requests` resets only a victim that is not finished (PE2), so one finished by its
   in-flight token ends; then `_process_previous_batch` -> `_handle_responses` frees every finished request's KV
   and slot. Those frees come after schedule k: they are seen by schedule k+1, one schedule later than in the other
   loop, and a stop token is seen one iteration late, so such a request is scheduled once more (one wasted decode,
   its token discarded: the sampler's `update_requests` skips a GENERATION_COMPLETE request, read in stored versions).
6. The new in-flight batch is batch k's sampling requests (last context chunks and generation requests); an empty
   schedule leaves nothing in flight (PE1: `previous_batch = None` when the batch is empty), so the pipeline drains.

Why not model/pipeline.py's `pipelined_step` (vLLM's batch queue, which returns early while the queue has room and
lands the oldest batch): TensorRT-LLM's loop always schedules, launches, then lands the previous batch, a fixed
one-batch lag, which is SGLang's shape (model/policies/sglang_overlap.py `overlap_step`). That step is not reused
either: SGLang's `launch` and `land` are its engine's (its `in_flight` rows carry extend ends for the radix tree,
its land skips a retracted request's token and knows arrival aborts), while here a paused request's token still
lands and is kept in its replay (rule 5), and the TO_COMPLETE filter lives in the schedulers' passes. What the two
share is the four calls of `overlap_step` below.

Divergences, beside the other loop's (docs/fidelity.md, "TensorRT-LLM's overlap executor"): a cancellation is
applied at the start of a step (the other loop's rule); in the engine `_handle_canceled_requests` runs in
`_process_previous_batch`, after schedule k, so a request cancelled in flight is scheduled once more there. The
executor's fetch cap, attention DP's dummy requests and speculative decoding's "may complete" reading of
GENERATION_TO_COMPLETE are not modelled, as in the other loop.
"""

from __future__ import annotations

from ..config import EngineConfig
from ..policy import Env, Plan, replace
from ..state import Phase, Request, State, StepRecord


def loop_name(options) -> str:
    """The executor loop a design of either policy runs (PE1 `PyExecutor.__init__`, pp_size 1): `Policy.loop`."""
    if options.disable_overlap_scheduler:
        return ("PyExecutor._executor_loop (not TensorRT-LLM's default _executor_loop_overlap: "
                "disable_overlap_scheduler)")
    return ("PyExecutor._executor_loop_overlap (TensorRT-LLM's default: batch k is scheduled before batch k-1's "
            "tokens are applied)")


def in_flight(state: State) -> tuple[int, ...]:
    """Batch k-1's sampling requests (empty in the other loop, whose Sched may be None)."""
    return getattr(state.sched, "in_flight", ())


def to_complete(state: State, r: Request) -> bool:
    """GENERATION_TO_COMPLETE (rule 2): in batch k-1, generating, and its token in flight is its last by length
    (H `willCompleteNextIteration`: max generated + tokens per iteration (1) >= max_new)."""
    return r.rid in in_flight(state) and r.phase == Phase.DECODING and r.generated + 1 >= r.max_new


def launch(cfg: EngineConfig, state: State, plan: Plan) -> State:
    """Rule 4: the batch's KV is written and its context states advance (PE1 `_update_request_states_tp`); the
    requests that sample a token become the batch in flight."""
    rows = []
    for sc in plan.scheduled:
        r = state.req(sc.rid)
        if r.phase == Phase.DECODING:
            r = replace(r, computed=r.computed + 1)
        else:
            computed = r.computed + sc.tokens
            if computed >= r.context_len:
                r = replace(r, computed=r.context_len, phase=Phase.DECODING)
            else:
                r = replace(r, computed=computed, phase=Phase.PREFILLING)
        state = state.with_request(r)
        if r.phase == Phase.DECODING:
            rows.append(sc.rid)
    return replace(state, sched=replace(state.sched, in_flight=tuple(rows)))


def land(policy, cfg: EngineConfig, state: State, batch: tuple[int, ...],
         stops: frozenset[int]) -> tuple[State, list[int]]:
    """Rule 5 for batch k-1: each token appended and the stop criteria applied (PE1 `_update_requests`); a pause
    victim of this iteration is handed to the policy (`paused_token_landed`: V1 pauses it anyway, V2 lets it end);
    a finished request is freed (`_handle_responses` -> `_terminate_request`). Returns the state and the finished."""
    finished = []
    for rid in batch:
        r = state.req(rid)
        if r.phase.terminal:
            continue            # cancelled, or finished by an earlier token: its token is discarded
        r = replace(r, generated=r.generated + 1)
        state = state.with_request(r)
        done = policy.finishes(cfg, r, rid in stops)
        if r.phase == Phase.PREEMPTED:
            state, ended = policy.paused_token_landed(cfg, state, rid, done)
            if ended:
                finished.append(rid)
        elif done:
            state = policy.finish(cfg, state, rid)
            finished.append(rid)
    return state, finished


def overlap_step(policy, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
    """One iteration of PE1 `_executor_loop_overlap` (rules 1-6)."""
    if state.error is not None:
        return state, StepRecord(step=state.step, notes=("engine is dead",))
    plan = Plan()
    state = policy.admit_env(cfg, state, env, plan)
    queued = in_flight(state)
    state = policy.schedule(cfg, state, plan)                # rules 1-3: `_prepare_and_schedule_batch`, the frees
    if plan.error is not None:
        return policy.fail_all(cfg, state, plan)
    state = launch(cfg, state, plan)                         # rule 4, and rule 6's new in-flight batch
    state, finished = land(policy, cfg, state, queued, frozenset(env.stops))   # rule 5
    state = policy.after_step(cfg, state, plan)
    return state, policy.record(state, plan, finished=finished)
