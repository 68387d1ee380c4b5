"""Inductive invariants: one Z3 query per (action, invariant) obligation.

For a core and a class of designs (knobs symbolic within bounds, any workload), an invariant set
Inv is inductive when
- init:       the initial state satisfies every invariant, and
- step:       Inv(s) and s' = step(s)          imply each invariant at s',
- decode-run: Inv(s) and guard(s, m), s' = advance(s, m) imply each invariant at s'
              (for cores that accelerate).
Then Inv holds in every reachable state of every design in the class, at every depth. A failed
obligation comes with a counterexample to induction: the pre-state and post-state.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import z3

from model.symbolic.core import Core
from model.symbolic.ops import Symbolic
from model.symbolic.slots import Knobs, Params, SlotState
from properties.symbolic import Transition, violations

from . import clock
from .budget import units as work_units
from .encode import evaluate_state, fresh_params_slots, fresh_state, int_var, state_eq

SYM = Symbolic()


@dataclasses.dataclass
class Obligation:
    action: str
    invariant: str
    status: str                      # proved | failed | unknown
    seconds: float
    cti: Optional[tuple[SlotState, SlotState]] = None
    reason: str = ""

    def line(self) -> str:
        return f"{self.status:8s} {self.action:10s} {self.invariant}  ({self.seconds:.2f} s)"


def workload_constraints(params: Params) -> list:
    """Any workload: present slots first, in arrival order, with sane field values."""
    out = []
    for i, w in enumerate(params.slots):
        out += [w["prompt"] >= 1, w["max_new"] >= 1, w["arrival"] >= 0, w["prefix_len"] >= 0,
                w["prefix_len"] <= w["prompt"],
                z3.Or(w["output_len"] == 0, z3.And(w["output_len"] >= 1, w["output_len"] <= w["max_new"])),
                z3.Or(w["cancel_at"] == -1, w["cancel_at"] >= w["arrival"])]
        if i:
            prev = params.slots[i - 1]
            out += [z3.Implies(w["present"], prev["present"]),
                    z3.Implies(w["present"], prev["arrival"] <= w["arrival"])]
    return out


def check_obligations(core: Core, knobs: Knobs, params: Params, assumptions: list,
                      invariants: Callable[[object, Knobs, Params, SlotState], dict],
                      timeout: float, wanted: Optional[list[str]] = None,
                      per_obligation: Optional[float] = None, batch: bool = False) -> list[Obligation]:
    """Init, step and decode-run obligations of `invariants` (a function of the state).

    `timeout` and `per_obligation` (which caps each query: an obligation over it is `unknown`) are
    seconds of the checkers' clock (checkers/clock.py: solver work, not wall-clock time). With `batch`,
    each action first asks for all its obligations in one query and splits them only when that one
    does not succeed: the same verdicts, far fewer queries when (as usual) all hold."""
    n = len(params.slots)
    out: list[Obligation] = []
    deadline = clock.now() + timeout

    def left() -> float:
        return clock.until(deadline)

    def cap(solver) -> None:
        clock.limit(solver, left(), units=None if per_obligation is None else work_units(per_obligation))

    def run(action: str, facts: list, post: SlotState, pre: Optional[SlotState]):
        solver = z3.Solver()
        solver.add(*assumptions, *facts)
        inv_post = {name: cond for name, cond in invariants(SYM, knobs, params, post).items()
                    if wanted is None or name in wanted}
        if batch and inv_post:
            t0 = time.monotonic()
            if left() > 0:
                cap(solver)
                conds = [c for c in inv_post.values() if c is not True]
                if not conds or solver.check(SYM.not_(SYM.and_(*conds))) == z3.unsat:
                    secs = time.monotonic() - t0
                    out.extend(Obligation(action, name, "proved", secs / len(inv_post)) for name in inv_post)
                    return
        for name, cond in inv_post.items():
            t0 = time.monotonic()
            if left() <= 0:
                out.append(Obligation(action, name, "unknown", 0.0, reason="time-out"))
                continue
            cap(solver)
            r = solver.check(SYM.not_(cond)) if not isinstance(cond, bool) else (z3.unsat if cond else z3.sat)
            secs = time.monotonic() - t0
            if r == z3.unsat:
                out.append(Obligation(action, name, "proved", secs))
            elif r == z3.sat:
                cti = None
                if pre is not None and not isinstance(cond, bool):
                    m = solver.model()
                    cti = (evaluate_state(m, pre), evaluate_state(m, post))
                out.append(Obligation(action, name, "failed", secs, cti))
            else:
                out.append(Obligation(action, name, "unknown", secs, reason=clock.why_unknown(solver)))

    init = core.initial(SYM, knobs, params)
    run("init", [], init, None)
    pre = fresh_state(core, n, "pre")
    inv_pre = [c for c in invariants(SYM, knobs, params, pre).values() if c is not True]
    post, _ = core.step(SYM, knobs, params, pre)
    fresh = fresh_state(core, n, "post")
    run("step", inv_pre + state_eq(fresh, post), fresh, pre)
    if core.accelerates_in(knobs):
        m = int_var("m")
        guard = core.decode_guard(SYM, knobs, params, pre, m)
        adv = core.decode_advance(SYM, knobs, params, pre, m)
        fresh2 = fresh_state(core, n, "adv")
        run("decode-run", inv_pre + [m >= 2, guard] + state_eq(fresh2, adv), fresh2, pre)
    return out


def symbolic_knobs(template, bounds: dict) -> tuple[Knobs, list]:
    """Knobs of `template`'s structure with every numeric knob symbolic in `bounds` (name -> (lo, hi|None))."""
    base = Knobs.of(template)
    terms, cons = {}, []
    for name in Knobs.NUMERIC:
        b = bounds.get(name)
        if b is None:
            terms[name] = getattr(template, name)
            continue
        if b[0] == b[1]:
            terms[name] = b[0]      # a fixed knob is a constant, as in a space's encoding (space._ranged)
            continue
        t = int_var(f"knob.{name}")
        cons.append(t >= b[0])
        if b[1] is not None:
            cons.append(t <= b[1])
        terms[name] = t
    return Knobs(**{**base.__dict__, **terms}), cons


def any_params(n: int) -> Params:
    return Params(fresh_params_slots(n))


@dataclasses.dataclass
class OneStep:
    """The view of one transition that properties.symbolic.violations reads: the design, the
    workload, the core and the transition (no earlier states, so no lasso: a livelock is not a
    one-step property and is refused by `property_obligation`)."""
    knobs: Knobs
    params: Params
    core: Core
    transitions: list
    states: list

    @property
    def enc(self):
        return self


ONE_STEP_PROPERTIES = ("LIVE-NO-PROGRESS", "ENGINE-ERROR", "SAFE-BUDGET", "SAFE-BATCH", "SAFE-BLOCKS",
                       "SAFE-NO-LEAK", "SAFE-REQUESTS")


def property_obligation(core: Core, knobs: Knobs, params: Params, assumptions: list,
                        invariants: Callable[[object, Knobs, Params, SlotState], dict],
                        timeout: float, prop: str = "LIVE-NO-PROGRESS") -> Obligation:
    """`prop` from the invariants alone: no state satisfying them has a step that violates it, with
    the property's condition exactly as the bounded search states it (properties/symbolic.py) on
    that one step. For LIVE-NO-PROGRESS: no such state, with the environment quiet and work
    unfinished, has a step that schedules nothing and changes no request. Every step of every run
    starts in a reachable state, where the invariants hold once they are inductive, so this holds at
    every depth."""
    if prop not in ONE_STEP_PROPERTIES:
        raise ValueError(f"{prop} is not a property of one step")
    n = len(params.slots)
    pre = fresh_state(core, n, "pre")
    post, rec = core.step(SYM, knobs, params, pre)
    t = Transition(0, pre, post, rec, True, 1)
    bad = violations(SYM, OneStep(knobs, params, core, [t], [pre, post]), t)[prop][0]
    solver = z3.Solver()
    clock.limit(solver, timeout)
    solver.add(*assumptions, *[c for c in invariants(SYM, knobs, params, pre).values() if c is not True])
    t0 = time.monotonic()
    r = solver.check(bad)
    secs = time.monotonic() - t0
    if r == z3.unsat:
        return Obligation("step", prop, "proved", secs)
    if r == z3.sat:
        m = solver.model()
        return Obligation("step", prop, "failed", secs, (evaluate_state(m, pre), evaluate_state(m, post)))
    return Obligation("step", prop, "unknown", secs, reason=clock.why_unknown(solver))
