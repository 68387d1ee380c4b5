"""Replay a solver counterexample before anyone reads it.

Two replays, both must agree with the solver state for state:
1. the core, run concretely (`Concrete` ops), transition by transition, an accelerated decode
   run expanded into its single steps: every field of every state and every step record;
2. the engine-checked simulator (model/policies/ via `simulate`) on the same configuration and
   workload: the abstraction of its state at each transition boundary equals the solver's, and
   evaluating the registry on its whole run reports the same property.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import model.symbolic.cores  # noqa: F401  (registers every core)
from model.policy import POLICIES
from model.simulator import Trace, simulate
from model.symbolic.core import CORES
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import Knobs, Params, diff, diff_record, record_of
from properties import evaluate

from .bmc import Counterexample


@dataclasses.dataclass
class Replay:
    ok: bool
    message: str
    trace: Optional[Trace] = None
    evaluation: object = None


def replay(cex: Counterexample, max_overtakes: Optional[int] = None) -> Replay:
    cfg, wl = cex.cfg, cex.workload
    core = CORES[cfg.policy]
    n = len(cex.states[0])
    knobs, params = Knobs.of(cfg), Params.of(wl).padded(n)
    state = core.initial(CONCRETE, knobs, params)
    d = diff(state, cex.states[0])
    if d:
        return Replay(False, f"the initial state differs from the solver's: {d}")
    boundaries = [0]
    for t, m in enumerate(cex.macro):
        for _ in range(m):
            state, rec = core.step(CONCRETE, knobs, params, state)
        if m == 1 and cex.records[t] is not None:
            d = diff_record(rec, cex.records[t])
            if d:
                return Replay(False, f"transition {t + 1}: the core's step record differs from the solver's: {d}")
        d = diff(state, cex.states[t + 1])
        if d:
            return Replay(False, f"transition {t + 1}: the core's state differs from the solver's: {d}")
        boundaries.append(boundaries[-1] + m)

    horizon = boundaries[-1] + 10_000
    trace = simulate(cfg, wl, max_steps=horizon)
    for t, step in enumerate(boundaries):
        if step >= len(trace.states):
            return Replay(False, f"the simulator's run ended ({trace.end}) after {len(trace.records)} steps, "
                                 f"before the solver's trace (transition {t})", trace)
        d = diff(core.abstract(cfg, trace.states[step], n), cex.states[t])
        if d:
            return Replay(False, f"after transition {t}: the simulator's state differs from the solver's: {d}")
        if t < len(cex.macro) and cex.macro[t] == 1 and step < len(trace.records):
            d = diff_record(record_of(trace.records[step], n), cex.records[t])
            if d:
                return Replay(False, f"transition {t + 1}: the simulator's step differs from the solver's: {d}")
    policy = POLICIES[cfg.policy]
    reqs = {r.rid: r for r in trace.states[0].requests}
    ev = evaluate(trace, lambda rid: policy.fits_alone(cfg, reqs[rid]),
                  cfg.max_batch_size if max_overtakes is None else max_overtakes)
    if not ev.violated(cex.property):
        found = ", ".join(sorted({v.property for v in ev.violations})) or "nothing"
        return Replay(False, f"the simulator's run does not violate {cex.property} (it violates {found})", trace, ev)
    # The solver's trace stops where the property is violated; the simulator runs the same workload on
    # to the run's end (the engine's own stall detector, a fixpoint), hence usually more steps: say so.
    return Replay(True, f"replayed: the simulator reproduces the {boundaries[-1]} engine steps of the trace and "
                        f"runs on to the end of the run ({trace.end}, {len(trace.records)} steps in all), verdict "
                        f"{ev.verdict}", trace, ev)


def transitions(cfg, workload, last_step: int) -> list[int]:
    """Engine steps 0..last_step of the core's concrete run on `workload`, split as the BMC's
    unrolling splits a trace (bmc.Unrolling._normalise): a decode run that can start is one
    transition taken at its longest (`decode_guard`), anything else one step. Their number is
    the depth at which the BMC meets a violation at engine step `last_step`, so a trace found by
    another search (the simulator's, Hypothesis's) can be measured in the BMC's units."""
    core = CORES[cfg.policy]
    knobs, params = Knobs.of(cfg), Params.of(workload)
    states = run_core(core, knobs, params, max_steps=last_step + 1).states
    if len(states) <= last_step:
        raise ValueError(f"the run ends after {len(states) - 1} steps, before step {last_step}")
    out, i = [], 0
    while i <= last_step:
        m = 1
        if core.accelerates_in(knobs) and core.decode_guard(CONCRETE, knobs, params, states[i], 2):
            m = 2
            while i + m < last_step and core.decode_guard(CONCRETE, knobs, params, states[i], m + 1):
                m += 1
        out.append(m)
        i += m
    return out
