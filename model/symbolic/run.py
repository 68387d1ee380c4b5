"""Run a core concretely: the simulator of the symbolic definition.

`run_core` executes a core's `step` with the `Concrete` ops on one workload, ended by the
simulator's own `run_to_end` (done, error, fixpoint, cycle, limit). Solver traces replay
here step for step, and tests/symbolic/ hold it to the engine-checked simulator.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..config import EngineConfig
from ..simulator import Workload, run_to_end
from .core import CORES, Core
from .ops import Concrete
from .slots import FINISHED, Knobs, Params, SlotRecord, SlotState

CONCRETE = Concrete()


@dataclasses.dataclass
class CoreTrace:
    states: list[SlotState]
    records: list[SlotRecord]
    end: str = "running"
    cycle_start: Optional[int] = None


def key(s: SlotState) -> tuple:
    """Everything but the step counter (model.state.State.key)."""
    return (tuple(tuple(sorted(r.items())) for r in s.req),
            tuple(sorted((k, v) for k, v in s.g.items() if k != "step")))


def all_terminal(p: Params, s: SlotState) -> bool:
    return all(not w["present"] or r["phase"] >= FINISHED for w, r in zip(p.slots, s.req))


def quiet_from(p: Params) -> int:
    last = [w["arrival"] for w in p.slots if w["present"]]
    last += [w["cancel_at"] for w in p.slots if w["present"] and w["cancel_at"] >= 0]
    return max(last, default=-1) + 1


def run_core(core: Core, k: Knobs, p: Params, max_steps: int = 200_000) -> CoreTrace:
    states, records, end, cycle_start = run_to_end(
        core.initial(CONCRETE, k, p), lambda s: core.step(CONCRETE, k, p, s),
        done=lambda s: all_terminal(p, s), failed=lambda s: s.g["error"], step_of=lambda s: s.g["step"],
        key=key, quiet=quiet_from(p), max_steps=max_steps)
    return CoreTrace(states, records, end, cycle_start)


def run_workload(cfg: EngineConfig, workload: Workload, max_steps: int = 200_000) -> CoreTrace:
    return run_core(CORES[cfg.policy], Knobs.of(cfg), Params.of(workload), max_steps)
