"""The model as a target: the `hf_cb` (or any) policy driven by the same actions as a real engine.

An `Add` or `Cancel` takes effect at the next step, as in the engines (transformers drains its
queue and applies cancellations in `prepare_next_batch`). A `Stop` is the model's `Env.stops`, passed
at every step until the request samples a token (which ends it) or is answered otherwise, as the
simulator passes a workload's `output_len` (model/simulator.py `Workload.env_at`).
"""

from __future__ import annotations

import dataclasses

import model.policies  # noqa: F401  (registers every policy)
from model.config import EngineConfig
from model.policy import POLICIES, Env
from model.state import Phase, Request, State

from .protocol import Add, Observation, Target


class ReferenceTarget(Target):
    name = "reference"
    real = False
    early_stops = True

    def __init__(self, cfg: EngineConfig, step_timeout_s: float = 10.0):
        self.cfg = cfg
        self.policy = POLICIES[cfg.policy]
        self.state = State(step=0, requests=(), free_blocks=cfg.num_blocks, free_host_blocks=cfg.host_blocks,
                           sched=self.policy.initial_sched(cfg))
        self.arrivals: list[int] = []
        self.cancels: list[int] = []
        self.stopping: set[int] = set()    # its next sampled token ends it

    def add(self, action: Add) -> None:
        assert action.rid == len(self.state.requests), "request ids are assigned in submission order"
        r = Request(rid=action.rid, prompt=action.prompt, max_new=action.max_new, arrival=self.state.step,
                    prefix_group=action.prefix_group, prefix_len=action.prefix_len, priority=action.priority)
        self.state = dataclasses.replace(self.state, requests=self.state.requests + (r,))
        self.arrivals.append(action.rid)

    def cancel(self, rid: int) -> None:
        self.cancels.append(rid)

    def stop(self, rid: int) -> None:
        self.stopping.add(rid)

    def step(self) -> Observation:
        env = Env(arrivals=tuple(self.arrivals), cancels=tuple(self.cancels), stops=tuple(sorted(self.stopping)))
        self.arrivals, self.cancels = [], []
        before = {r.rid: r.generated for r in self.state.requests}
        self.state, record = self.policy.step(self.cfg, self.state, env)
        # a stop is spent once the request samples (the token ends it) or it is answered some other way
        self.stopping = {rid for rid in self.stopping if rid >= len(self.state.requests)
                         or (not self.state.req(rid).phase.terminal and self.state.req(rid).generated == before.get(rid, 0))}
        return Observation(self.state, record)

    def unanswered(self) -> list[int]:
        return [r.rid for r in self.state.requests if not r.phase.terminal or r.phase == Phase.PENDING]
