"""Run a policy on one concrete workload, deterministically.

The workload is the environment: when each request arrives, when it is cancelled and how
long its output really is (an early stop). The simulator turns it into one `Env` per step,
so a trace is fully determined by (configuration, workload) and replays exactly.

A run ends when every request is answered, when the engine raises, when the state repeats
once the environment has nothing left to do (a fixpoint or a cycle: the future is then
known), or at the step limit, which says so instead of claiming anything.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from .config import EngineConfig
from .policy import POLICIES, Env, Policy
from .state import Request, State, StepRecord


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    prompt: int
    max_new: int
    arrival: int = 0
    output_len: Optional[int] = None   # the real output length (EOS); None = runs to max_new
    cancel_at: Optional[int] = None    # step at which the user cancels it
    prefix_group: int = -1
    prefix_len: int = 0
    priority: int = 0


@dataclasses.dataclass(frozen=True)
class Workload:
    requests: tuple[RequestSpec, ...]

    def __post_init__(self):
        # Request ids follow submission order; a stable sort keeps file order within a step.
        ordered = tuple(sorted(self.requests, key=lambda s: s.arrival))
        object.__setattr__(self, "requests", ordered)

    def env_at(self, state: State) -> Env:
        t = state.step
        specs = self.requests
        return Env(
            arrivals=tuple(i for i, s in enumerate(specs) if s.arrival == t),
            cancels=tuple(i for i, s in enumerate(specs) if s.cancel_at == t),
            stops=tuple(i for i, s in enumerate(specs)
                        if s.output_len is not None and state.req(i).generated + 1 >= s.output_len),
        )

    def quiet_from(self) -> int:
        """First step from which the environment submits and cancels nothing more."""
        last = [s.arrival for s in self.requests] + [s.cancel_at for s in self.requests if s.cancel_at is not None]
        return max(last, default=-1) + 1


def initial_state(cfg: EngineConfig, workload: Workload) -> State:
    policy = POLICIES[cfg.policy]
    reqs = tuple(
        Request(rid=i, prompt=s.prompt, max_new=s.max_new, arrival=s.arrival,
                prefix_group=s.prefix_group, prefix_len=s.prefix_len, priority=s.priority)
        for i, s in enumerate(workload.requests)
    )
    return State(step=0, requests=reqs, free_blocks=cfg.num_blocks, free_host_blocks=cfg.host_blocks,
                 sched=policy.initial_sched(cfg))


@dataclasses.dataclass
class Trace:
    cfg: EngineConfig
    workload: Workload
    states: list[State]
    records: list[StepRecord]
    end: str = "running"              # done | error | fixpoint | cycle | limit
    cycle_start: Optional[int] = None  # index into states where the repeated state first appeared

    @property
    def final(self) -> State:
        return self.states[-1]


def simulate(cfg: EngineConfig, workload: Workload, max_steps: int = 200_000) -> Trace:
    policy: Policy = POLICIES[cfg.policy]
    states, records, end, cycle_start = run_to_end(
        initial_state(cfg, workload), lambda s: policy.step(cfg, s, workload.env_at(s)),
        done=lambda s: all(r.phase.terminal for r in s.requests), failed=lambda s: s.error is not None,
        step_of=lambda s: s.step, key=State.key, quiet=workload.quiet_from(), max_steps=max_steps)
    return Trace(cfg, workload, states, records, end, cycle_start)


def run_to_end(state, step: Callable, *, done: Callable, failed: Callable, step_of: Callable, key: Callable,
               quiet: int, max_steps: int) -> tuple[list, list, str, Optional[int]]:
    """Step from `state` until the run ends; every run of the model (this simulator, and the
    symbolic cores run concretely) ends the same ways: done (every request terminal), error,
    fixpoint or cycle (a state repeats, step counter aside, once the environment is quiet from
    step `quiet` on), or limit. (states, records, end, index where the repeated state first was)."""
    states, records = [state], []
    seen: dict[tuple, int] = {}
    for _ in range(max_steps):
        if done(state):
            return states, records, "done", None
        state, record = step(state)
        states.append(state)
        records.append(record)
        if failed(state):
            return states, records, "error", None
        if step_of(state) >= quiet:
            k = key(state)
            if k in seen:
                return states, records, "fixpoint" if seen[k] == len(states) - 2 else "cycle", seen[k]
            seen[k] = len(states) - 1
    return states, records, "limit", None
