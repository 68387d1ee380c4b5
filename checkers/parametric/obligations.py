"""The proof for every n: each micro-step of model/symbolic/cores/trtllm_v2_micro.py, from the invariant of its program point to the
invariant of the next, as one quantifier-free Z3 query.

For a step from point P to point P' (cursors c, j symbolic within their loop bounds, n symbolic):
  hypotheses  Inv_P's per-index conditions at each index of the instantiation set I, the scalar
              ones, the workload and class at I, the ghost-sum lemmas (invariants.sum_lemmas) at I
  goal        Inv_P' of the post-state at a Skolem index g (any index: nothing else is known of it)
              and its scalar conditions.
I = {g, c, j, u, the sum witnesses}. The hypotheses hold at every index, so at these; leaving the
others out only weakens the hypotheses, and g is arbitrary, so unsat proves the goal at every index,
for every n (docs/symbolic.md, "Any number of requests"). No quantifier reaches the solver.

Page counts are `ops.MonotonePages` (uninterpreted, monotone, PAGES(0) = 0) plus PAGES(t) >= 1 for
t >= 1; cdiv(., b) for every b >= 1 is such a function (tests/symbolic/test_parametric.py proves
the last fact of it), so these proofs hold for every block size.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import z3

from model.symbolic.cores.trtllm_v2_micro import V2ArrayModel, fresh, initial
from model.symbolic.ops import MonotonePages
from model.symbolic.slots import Knobs, unfinished

from .. import clock
from .invariants import Point, per_index, scalars, sum_lemmas, workload_at


@dataclasses.dataclass
class Result:
    step: str              # the micro-step (or "init")
    status: str            # proved | failed | unknown
    seconds: float
    failed: list = dataclasses.field(default_factory=list)   # names of the goal conditions refuted
    cti: Optional[dict] = None                                # values at g and c in a counterexample
    reason: str = ""

    def line(self) -> str:
        extra = f"  fails: {', '.join(self.failed)}" if self.failed else ""
        return f"{self.status:8s} {self.step:10s} ({self.seconds:.2f} s){extra}"


@dataclasses.dataclass(frozen=True)
class MicroStep:
    name: str
    pre: Callable          # (c, j, n) -> Point
    post: Callable
    run: Callable          # (model, st, c, j) -> st
    bounds: Callable       # (c, j, n) -> list of constraints
    cursors: tuple = ()    # which of c, j the step uses


def _ident(m, st, c, j):
    return st


def chain() -> list[MicroStep]:
    """The program of `V2ArrayModel.step` (trtllm_v2_micro.py), as steps between loop heads."""
    P = Point
    one = lambda c, j, n: [c >= 0, c < n]
    two = lambda c, j, n: [c >= 0, c < j, j < n]
    return [
        MicroStep("start", lambda c, j, n: P("P0"), lambda c, j, n: P("ARR", 0), lambda m, st, c, j: m.start(st),
                  lambda c, j, n: []),
        MicroStep("arrive", lambda c, j, n: P("ARR", c), lambda c, j, n: P("ARR", c + 1),
                  lambda m, st, c, j: m.arrive(st, c), one, ("c",)),
        MicroStep("snap", lambda c, j, n: P("ARR", n), lambda c, j, n: P("GEN", 0),
                  lambda m, st, c, j: m.snap(st), lambda c, j, n: []),
        MicroStep("gen_a", lambda c, j, n: P("GEN", c), lambda c, j, n: P("EV", c, n - 1),
                  lambda m, st, c, j: m.gen_a(st, c), one, ("c",)),
        MicroStep("evict", lambda c, j, n: P("EV", c, j), lambda c, j, n: P("EV", c, j - 1),
                  lambda m, st, c, j: m.evict(st, c, j), two, ("c", "j")),
        MicroStep("ev-exit", lambda c, j, n: P("EV", c, c), lambda c, j, n: P("RP", c, n - 1), _ident, one, ("c",)),
        MicroStep("rpause", lambda c, j, n: P("RP", c, j), lambda c, j, n: P("RP", c, j - 1),
                  lambda m, st, c, j: m.rpause(st, c, j), two, ("c", "j")),
        MicroStep("gen_b", lambda c, j, n: P("RP", c, c), lambda c, j, n: P("GEN", c + 1),
                  lambda m, st, c, j: m.gen_b(st, c), one, ("c",)),
        MicroStep("gen-exit", lambda c, j, n: P("GEN", n), lambda c, j, n: P("CTX", 0), _ident, lambda c, j, n: []),
        MicroStep("ctx_a", lambda c, j, n: P("CTX", c), lambda c, j, n: P("PFP", c, n - 1),
                  lambda m, st, c, j: m.ctx_a(st, c), one, ("c",)),
        MicroStep("pfp", lambda c, j, n: P("PFP", c, j), lambda c, j, n: P("PFP", c, j - 1),
                  lambda m, st, c, j: m.pfp(st, c, j), lambda c, j, n: [c >= 0, c < n, j >= 0, j < n], ("c", "j")),
        MicroStep("ctx_b", lambda c, j, n: P("PFP", c, -1), lambda c, j, n: P("CTX", c + 1),
                  lambda m, st, c, j: m.ctx_b(st, c), one, ("c",)),
        MicroStep("ctx-exit", lambda c, j, n: P("CTX", n), lambda c, j, n: P("DET", 0), _ident, lambda c, j, n: []),
        MicroStep("det", lambda c, j, n: P("DET", c), lambda c, j, n: P("DET", c + 1),
                  lambda m, st, c, j: m.det(st, c), one, ("c",)),
        MicroStep("det_end", lambda c, j, n: P("DET", n), lambda c, j, n: P("FAIL", 0),
                  lambda m, st, c, j: m.det_end(st), lambda c, j, n: []),
        MicroStep("fail", lambda c, j, n: P("FAIL", c), lambda c, j, n: P("FAIL", c + 1),
                  lambda m, st, c, j: m.fail(st, c), one, ("c",)),
        MicroStep("fail_end", lambda c, j, n: P("FAIL", n), lambda c, j, n: P("EXEC", 0),
                  lambda m, st, c, j: m.fail_end(st), lambda c, j, n: []),
        MicroStep("exec", lambda c, j, n: P("EXEC", c), lambda c, j, n: P("EXEC", c + 1),
                  lambda m, st, c, j: m.exec_(st, c), one, ("c",)),
        # the pre-state of the whole step is any state: `dead` (its error) is false by `pass`
        MicroStep("exec_end", lambda c, j, n: P("EXEC", n), lambda c, j, n: P("P0"),
                  lambda m, st, c, j: m.finish_step(fresh("any", st.n, with_pass=False), m.exec_end(st)),
                  lambda c, j, n: []),
    ]


def program(n: int) -> list[tuple]:
    """The micro-steps `chain` visits for a concrete n, in order, as (name, c, j) with the cursors each uses
    (None where it uses none); the loop exits, which run no code, left out. From P0 the one step whose
    pre-point is the current point (its cursors within their bounds) runs, and its post-point is next, until
    `exec_end` closes the step."""
    steps, point, out = chain(), Point("P0"), []
    cursors = range(-1, n + 1)
    while True:
        found = {s.name: (s, c, j) for s in steps for c in cursors for j in cursors
                 if s.pre(c, j, n) == point and all(s.bounds(c, j, n))}
        if len(found) != 1:
            raise AssertionError(f"the chain is not a program at {point} for n = {n}: {sorted(found)}")
        (s, c, j), = found.values()
        if s.run is not _ident:
            out.append((s.name, c if "c" in s.cursors else None, j if "j" in s.cursors else None))
        if s.name == "exec_end":
            return out
        point = s.post(c, j, n)


@dataclasses.dataclass
class Setup:
    """What a proof is about: the structure (knobs, options), the class, and the knobs' constraints;
    and what the negative controls change (a dropped invariant, a dropped index, a mutant model)."""
    knobs: Knobs
    knob_constraints: list
    per_index_class: Optional[Callable] = None
    drop: tuple = ()                  # invariant names left out (everywhere)
    omit: tuple = ()                  # instantiation indices left out: "c", "j", "u", "witness", "others"
    mutant: Optional[str] = None
    cls: str = "c1"                   # whose invariants: invariants.CLASSES


class RecordingPages(MonotonePages):
    """`MonotonePages` that remembers every page count it builds, so a query's page facts are
    written for those (a fact about an application the query does not use is still true) instead
    of walking the formulas for them."""

    def __init__(self):
        self.apps: dict = {}

    def pages(self, tokens, block_size):
        t = super().pages(tokens, block_size)
        if z3.is_expr(t):
            self.apps.setdefault(t.get_id(), t)
        return t

    def facts(self) -> list:
        """`ops.page_facts` of the recorded applications (PAGES(0) = 0, >= 0, monotone pairwise),
        plus PAGES(t) >= 1 for t >= 1 (cdiv(t, b) >= 1 for t >= 1, b >= 1)."""
        apps = [a for a in self.apps.values() if z3.is_app(a) and a.decl().eq(MonotonePages.PAGES)]
        out = [MonotonePages.PAGES(z3.IntVal(0)) == 0]
        for i, a in enumerate(apps):
            x = a.arg(0)
            out += [a >= 0, z3.Implies(x >= 1, a >= 1)]
            for b in apps[i + 1:]:
                y = b.arg(0)
                out += [z3.Implies(x <= y, a <= b), z3.Implies(y <= x, b <= a)]
        return out


def _pre_state() -> tuple:
    n = z3.Int("n")
    st = fresh("s", n)
    st.g["Q"] = z3.Bool("Q")
    st.g["u"] = z3.Int("u")
    return st, n


def _query(setup: Setup, step: MicroStep, timeout: float) -> Result:
    ops = RecordingPages()
    m = V2ArrayModel(ops, setup.knobs, setup.mutant)
    k = setup.knobs
    pre, n = _pre_state()
    c, j = z3.Int("c"), z3.Int("j")
    goal_index = z3.Int("g")
    witnesses = {} if "witness" in setup.omit else {"S_B": z3.Int("w.S_B"), "S_blocks": z3.Int("w.S_blocks")}
    others = {}   # name -> (witness, excluded index): a part other than c's, where the sum exceeds c's
    if setup.cls in ("c2", "c3") and step.name != "start" and "witness" not in setup.omit:
        witnesses["S_chg"] = z3.Int("w.S_chg")
        if "c" in step.cursors and "others" not in setup.omit:
            others = {"S_blocks": (z3.Int("w.S_blocks-c"), c), "S_chg": (z3.Int("w.S_chg-c"), c)}
            if setup.cls == "c3":
                others["S_blocks-S_R"] = (z3.Int("w.S_blocks-S_R-c"), c)
        if setup.cls == "c3":
            witnesses["S_R"] = z3.Int("w.S_R")
    idx = [goal_index]
    if "c" in step.cursors and "c" not in setup.omit:
        idx.append(c)
    if "j" in step.cursors and "j" not in setup.omit:
        idx.append(j)
    if "u" not in setup.omit:
        idx.append(pre.g["u"])
    idx += list(witnesses.values()) + [w for w, _ in others.values()]
    p_pre, p_post = step.pre(c, j, n), step.post(c, j, n)
    hyps = list(setup.knob_constraints) + [n >= 0] + step.bounds(c, j, n)
    names = set()
    for i in idx:
        inv = per_index(ops, k, pre, i, p_pre, setup.drop, setup.cls)
        names |= set(inv)
        hyps.append(z3.Implies(z3.And(i >= 0, i < n), z3.And(*_terms(inv.values()), *workload_at(
            ops, k, pre, i, setup.per_index_class))))
        if step.name == "start":   # what Q stands for, at the start of the pass
            r = pre.cell(i)
            hyps.append(z3.Implies(z3.And(i >= 0, i < n, pre.g["Q"], r["present"]),
                                   z3.And(r["arrival"] < pre.g["step"], r["cancel_at"] < pre.g["step"])))
    if step.name == "start":
        u = pre.g["u"]
        hyps.append(z3.Implies(pre.g["Q"], z3.And(u >= 0, u < n, pre.cell(u)["present"],
                                                   unfinished(ops, pre.cell(u)["phase"]))))
    hyps += _terms(scalars(ops, k, pre, p_pre, setup.drop, setup.cls).values())
    hyps += sum_lemmas(ops, k, pre, idx, witnesses, names, others)
    post = step.run(m, pre, c, j)
    goals = dict(per_index(ops, k, post, goal_index, p_post, setup.drop, setup.cls))
    goals = {name: z3.Implies(z3.And(goal_index >= 0, goal_index < n), _term(cond)) for name, cond in goals.items()}
    goals.update({name: _term(cond) for name, cond in scalars(ops, k, post, p_post, setup.drop, setup.cls).items()})
    return _decide(step.name, hyps, goals, ops.facts(), timeout, {"g": goal_index, "c": c}, pre, post)


def _term(x):
    return z3.BoolVal(x) if isinstance(x, bool) else x


def _terms(xs) -> list:
    return [_term(x) for x in xs]


def _decide(name: str, hyps: list, goals: dict, facts: list, timeout: float, show: dict, pre=None,
            post=None) -> Result:
    """All goals in one query; on failure, each alone, to name the ones refuted. The hypotheses
    alone must be satisfiable: contradictory ones would prove anything (a vacuous proof fails)."""
    s = z3.Solver()
    clock.limit(s, timeout)
    s.add(*hyps, *facts)
    t0 = time.monotonic()
    if s.check() != z3.sat:
        return Result(name, "failed", time.monotonic() - t0, ["hypotheses not satisfiable (vacuous)"])
    r = s.check(z3.Not(z3.And(*goals.values())))
    if r == z3.unsat:
        return Result(name, "proved", time.monotonic() - t0)
    if r == z3.unknown:
        return Result(name, "unknown", time.monotonic() - t0, reason=s.reason_unknown())
    failed, cti = [], None
    for gname, goal in goals.items():
        if s.check(z3.Not(goal)) == z3.sat:
            failed.append(gname)
            if cti is None:
                cti = _cti(s.model(), show, pre, post)
    return Result(name, "failed", time.monotonic() - t0, failed, cti)


def _cti(mdl, show: dict, pre, post) -> dict:
    out = {}
    for label, idx in show.items():
        i = mdl.eval(idx, model_completion=True)
        for tag, st in (("pre", pre), ("post", post)):
            if st is None:
                continue
            cell = st.cell(i)
            out[f"{tag}[{label}={i}]"] = {f: str(mdl.eval(cell[f], model_completion=True))
                                          for f in ("phase", "computed", "generated", "blocks", "suspended",
                                                    "prompt", "max_new", "present")}
    if pre is not None:
        out["pre scalars"] = {f: str(mdl.eval(pre.g[f], model_completion=True))
                              for f in ("n", "free_blocks", "S_blocks", "S_B") if f in pre.g} | \
            {"n": str(mdl.eval(pre.n, model_completion=True))}
    return out


def init_obligation(setup: Setup, timeout: float) -> Result:
    k = setup.knobs
    ops = RecordingPages()
    n = z3.Int("n")
    st = initial(ops, k, "init", n)
    g = z3.Int("g")
    hyps = list(setup.knob_constraints) + [n >= 0, z3.Implies(z3.And(g >= 0, g < n), z3.And(
        *workload_at(ops, k, st, g, setup.per_index_class)))]
    goals = {name: z3.Implies(z3.And(g >= 0, g < n), _term(cond))
             for name, cond in per_index(ops, k, st, g, Point("P0"), setup.drop, setup.cls).items()}
    goals.update({name: _term(cond) for name, cond in scalars(ops, k, st, Point("P0"), setup.drop, setup.cls).items()})
    return _decide("init", hyps, goals, ops.facts(), timeout, {"g": g})


def prove_all_n(setup: Setup, timeout: float = 600.0, only: Optional[tuple] = None,
                stop_on_failure: bool = False) -> list[Result]:
    """init and every micro-step of the chain (or those named in `only`)."""
    deadline = clock.now() + timeout
    out = []
    steps = [s for s in chain() if only is None or s.name in only]
    if only is None or "init" in only:
        out.append(init_obligation(setup, max(1.0, clock.until(deadline))))
    for s in steps:
        left = clock.until(deadline)
        if left <= 0:
            out.append(Result(s.name, "unknown", 0.0, reason="time-out"))
            continue
        out.append(_query(setup, s, left))
        if stop_on_failure and out[-1].status == "failed":
            break
    return out
