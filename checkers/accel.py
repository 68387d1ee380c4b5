"""Soundness of acceleration: m decode steps as one transition, proved against the one-step relation.

A core that accelerates gives `decode_guard(s, m)` and `decode_advance(s, m)`. The unrolling
may replace m >= 2 engine steps by one transition s -> advance(s, m) when guard(s, m) holds.
That is sound when, for every reachable s (the core's invariants Inv hold) and every m >= 1:

  one-step:  Inv(s) and guard(s, 1)  =>  step(s) == advance(s, 1), and the step's record is a
             pure decode step: exactly the decoders advanced run, each within budget and batch
             cap, nothing preempted, offloaded, finished, failed or rejected, no engine error;
  peel:      Inv(s) and guard(s, m + 1)  =>  guard(s, m), guard(advance(s, m), 1), and
             advance(advance(s, m), 1) == advance(s, m + 1).

  merge:     Inv(s) and guard(s, a) and guard(advance(s, a), b)  =>  guard(s, a + b) and
             advance(advance(s, a), b) == advance(s, a + b).

By induction on m, guard(s, m) => step^m(s) == advance(s, m), and every step inside the run is
a pure decode step: it violates no record property, schedules work (so it is no no-progress
step), and strictly increases some `generated` (so no loop of states passes through it).
With merge, two runs in a row are one run, and a run that could go on is a shorter trace when it
does: so the unrolling may take every run at its longest (m maximal) and start one wherever
guard(s, 2) holds, without losing any shortest counterexample (bmc.py does, except at the last
transition, where a violation may sit mid-run).
Each obligation is one Z3 validity query over a symbolic state, symbolic knobs and workload.
It is asked first with the page count of a token count uninterpreted but monotone
(ops.MonotonePages): the obligations need only the order of page counts (a longer run never
takes fewer pages), and without the division the solver does not case-split on remainders
(trtllm_v2 on the field design: 4 slots 34 s -> 1.5 s; 6 slots from over 5 minutes to 9 s).
What that does not prove is asked again with the division.
"""

from __future__ import annotations

import time
from typing import Optional

import z3

from model.symbolic.core import Core
from model.symbolic.ops import MonotonePages, Symbolic, page_facts
from model.symbolic.slots import DECODING, RECORD_FLAGS, unfinished

from . import clock
from .budget import spent, units as budget_units
from .encode import fresh_state, int_var, state_eq
from .induction import Obligation, any_params, symbolic_knobs, workload_constraints

SYM = Symbolic()
MONOTONE = MonotonePages()

# The parametric class of the proof: every numeric knob at least 1, no upper bound.
ANY_KNOBS = {"block_size": (1, None), "num_blocks": (1, None), "max_num_tokens": (1, None),
             "max_batch_size": (1, None), "host_blocks": (0, None)}


def pure_decode(core: Core, knobs, params, pre, rec, ops=SYM) -> list:
    conds = [ops.not_(rec.error)]
    for i, (w, r) in enumerate(zip(params.slots, pre.req)):
        dec = ops.and_(w["present"], unfinished(ops, r["phase"]), r["phase"] == DECODING)
        conds.append(rec.flags["scheduled"][i] == dec)
        for f in RECORD_FLAGS:
            if f != "scheduled":
                conds.append(ops.not_(rec.flags[f][i]))
    conds += [ops.sum(rec.tokens) <= knobs.max_num_tokens, ops.count(rec.flags["scheduled"]) <= knobs.max_batch_size]
    return [c for c in conds if c is not True]


def prove_acceleration(core: Core, template, n: int, timeout: float = 300.0, knob_bounds=None,
                       assumed=None, pages: str = "monotone, then exact",
                       work: Optional[float] = None) -> list[Obligation]:
    """The obligations over n slots, any workload, knobs in `knob_bounds` (default: any), from
    a state satisfying the core's invariants (only those named in `assumed`, when given: the
    ones proved inductive for the space at hand).

    Each is asked first with page counts uninterpreted but monotone (ops.MonotonePages: a proof
    there holds for cdiv, and at 6-8 slots it is 10-100x cheaper), and only if that does not
    prove it, with the division itself (`pages`: "monotone" or "exact" asks only that one).

    `work`: all the queries together get about this many seconds of solving, counted in solver
    work (checkers/budget.py), so the verdict does not depend on the machine's load; `timeout`
    is seconds of the checkers' clock (checkers/clock.py), work as well."""
    deadline = clock.now() + timeout
    units = None if work is None else [budget_units(work)]   # what is left of it
    out = []
    exact = None
    first = SYM if pages == "exact" else MONOTONE
    for i, (action, name, query) in enumerate(_obligations(core, template, n, knob_bounds, assumed, first)):
        if clock.now() >= deadline:
            # the page facts and the exact obligations take seconds to build: none past the time-out
            out.append(Obligation(action, name, "unknown", 0.0, reason="time-out"))
            continue
        ob = _decide(action, name, query, deadline, abstract=first is MONOTONE, units=units)
        if ob.status != "proved" and pages == "monotone, then exact" and clock.now() < deadline:
            if exact is None:
                exact = _obligations(core, template, n, knob_bounds, assumed, SYM)
            t0 = ob.seconds
            ob = _decide(action, name, exact[i][2], deadline, abstract=False, units=units)
            ob.seconds += t0
        out.append(ob)
    return out


def _decide(action: str, name: str, query: tuple, deadline: float, abstract: bool,
            units: Optional[list] = None) -> Obligation:
    """One validity query: the hypotheses imply the goal. `units`: [the solver work left], spent."""
    hyps, goal = query
    t0 = time.monotonic()
    if isinstance(goal, bool):
        return Obligation(action, name, "proved" if goal else "failed", 0.0)
    if units is not None and units[0] <= 0:
        return Obligation(action, name, "unknown", 0.0, reason="work budget spent")
    solver = z3.Solver()
    clock.limit(solver, clock.until(deadline), units=None if units is None else units[0])
    solver.add(*hyps)
    if abstract:
        solver.add(*page_facts(hyps + [goal]))
    before = spent(solver)
    r = solver.check(z3.Not(goal))
    if units is not None:
        units[0] -= spent(solver) - before
    status = "proved" if r == z3.unsat else "failed" if r == z3.sat else "unknown"
    return Obligation(action, name, status, time.monotonic() - t0,
                      reason="" if status != "unknown" else clock.why_unknown(solver))


def _obligations(core: Core, template, n: int, knob_bounds, assumed, ops) -> list[tuple[str, str, tuple]]:
    """(action, name, (hypotheses, goal)) per obligation, built over `ops`."""
    knobs, kc = symbolic_knobs(template, ANY_KNOBS if knob_bounds is None else knob_bounds)
    params = any_params(n)
    pre = fresh_state(core, n, "s")
    assumptions = kc + workload_constraints(params) + \
        [c for name, c in core.invariants(ops, knobs, params, pre).items()
         if c is not True and (assumed is None or name in assumed)]
    out = []

    def add(action: str, name: str, hyps: list, goal) -> None:
        out.append((action, name, (assumptions + [h for h in hyps if h is not True], goal)))

    one = 1
    post, rec = core.step(ops, knobs, params, pre)
    adv1 = core.decode_advance(ops, knobs, params, pre, one)
    g1 = core.decode_guard(ops, knobs, params, pre, one)
    add("one-step", "step == advance(1)", [g1], ops.and_(*state_eq(post, adv1)))
    add("one-step", "pure decode record", [g1], ops.and_(*pure_decode(core, knobs, params, pre, rec, ops)))

    m = int_var("m")
    gm1 = core.decode_guard(ops, knobs, params, pre, m + 1)
    gm = core.decode_guard(ops, knobs, params, pre, m)
    mid = core.decode_advance(ops, knobs, params, pre, m)
    g_mid = core.decode_guard(ops, knobs, params, mid, one)
    last = core.decode_advance(ops, knobs, params, mid, one)
    whole = core.decode_advance(ops, knobs, params, pre, m + 1)
    add("peel", "guard(m+1) => guard(m)", [m >= 1, gm1], gm)
    add("peel", "guard(m+1) => guard(advance(m), 1)", [m >= 1, gm1], g_mid)
    add("peel", "advance(advance(m), 1) == advance(m+1)", [m >= 1, gm1], ops.and_(*state_eq(last, whole)))

    a, b = int_var("a"), int_var("b")
    ga = core.decode_guard(ops, knobs, params, pre, a)
    mid_a = core.decode_advance(ops, knobs, params, pre, a)
    gb = core.decode_guard(ops, knobs, params, mid_a, b)
    gab = core.decode_guard(ops, knobs, params, pre, a + b)
    both = core.decode_advance(ops, knobs, params, mid_a, b)
    joined = core.decode_advance(ops, knobs, params, pre, a + b)
    add("merge", "guard(a) & guard(advance(a), b) => guard(a+b)", [a >= 1, b >= 1, ga, gb], gab)
    add("merge", "advance(advance(a), b) == advance(a+b)", [a >= 1, b >= 1, ga, gb],
        ops.and_(*state_eq(both, joined)))
    return out
