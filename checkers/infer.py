"""An invariant for a design no claim covers: Houdini over candidates, then the property, then only what is needed.

For a check file's space at a fixed number of request slots (its own, or a capped subset of its runs), the
candidates are the core's invariants, the invariants of the engine's claims (proofs/claims.py hands them in)
and templates instantiated with the file's numbers (`templates`). Houdini (Flanagan and Leino, "Houdini, an
annotation assistant for ESC/Java", FME 2001): every candidate with an obligation (init, step, decode-run;
checkers/induction.py) that is not proved, assuming only the candidates still kept, is dropped, until the rest
is inductive together. The property's one-step obligation (induction.property_obligation, the very condition
the search uses) is then asked from the survivors alone. Where it follows, the set is cut down to the families
it needs (a family is one invariant over every request slot, `r{i}.` stripped): first to what the unsat cores of
the property's and the used families' obligations name (`_support`), then each family is removed in turn and
kept only if without it the rest is not inductive or no longer implies the property, until no family can go,
so removing any one of the final set breaks the proof (`needed` says how). Where it does not follow, the
counterexample to induction is the obligation's pre and post states: a state satisfying every survivor whose
step violates the property; some fact that rules it out is missing.

The invariant obligations run within a slice of solver work (checkers/budget.py); the property's obligation and
the whole inference are held to wall-clock time as well, so on a loaded machine less may be proved, never more:
an obligation not decided counts as not proved (the candidate is dropped: sound, only less is proved).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Callable, Optional

import z3

from model.symbolic.core import Core
from model.symbolic.ops import Symbolic
from model.symbolic.slots import DECODING, OFFLOADED, PREEMPTED, Knobs, Params, SlotState
from properties.symbolic import Transition, violations

from . import clock
from .budget import units as work_units
from .encode import fresh_state, int_var
from .induction import Obligation, OneStep, check_obligations, property_obligation
from .space import Space, encode

Candidates = Callable[[object, Knobs, Params, SlotState], dict]

_SYM = Symbolic()
# solver work per obligation, in seconds of the reference machine (checkers/budget.py)
OBLIGATION_WORK = 20.0


@dataclasses.dataclass
class Inference:
    status: str                          # proved | failed (a counterexample to induction) | unknown
    property: str
    slots: int
    seconds: float
    candidates: int = 0                  # invariants tried (over every slot)
    kept: tuple = ()                     # the families of the final set (minimal where `minimal`)
    needed: dict = dataclasses.field(default_factory=dict)   # family -> what fails without it
    minimal: bool = False                # every family of `kept` was shown needed
    dropped: dict = dataclasses.field(default_factory=dict)  # invariant -> why pruned ("refuted by step", ...)
    cti: Optional[tuple] = None          # (pre, post) SlotStates: the property fails from the survivors
    reason: str = ""                     # unknown: why

    def line(self) -> str:
        if self.status == "proved":
            how = ("each needed: removing any one breaks the proof" if self.minimal else
                   "not shown minimal within the time")
            return (f"{self.property} proved for every run of at most {self.slots} requests by an inferred "
                    f"invariant of {len(self.kept)} families ({how}; {len(self.dropped)} of "
                    f"{self.candidates} candidates pruned as not inductive)")
        if self.status == "failed":
            return (f"{self.property} not proved: from the {self.candidates - len(self.dropped)} inductive "
                    f"invariants a state steps into a violation (a counterexample to induction)")
        return f"{self.property}: inference unknown ({self.reason})"


def family(name: str) -> str:
    return re.sub(r"^r\d+\.", "r*.", name)


def templates(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Candidate facts no core states, instantiated with the file's numbers: a request never reaches a
    phase (paused for recompute, offloaded), is never suspended, never preempted, and holds at most its
    worst case of pages (cdiv(prompt + max_new + draft_len, block_size), as fix B counts it)."""
    draft = getattr(k.options, "draft_len", 0) or 0
    inv = {}
    for i, (w, r) in enumerate(zip(p.slots, s.req)):
        inv[f"r{i}.never-paused"] = r["phase"] != PREEMPTED
        inv[f"r{i}.never-offloaded"] = r["phase"] != OFFLOADED
        inv[f"r{i}.never-suspended"] = ops.not_(r["suspended"])
        inv[f"r{i}.never-preempted"] = r["preemptions"] == 0
        inv[f"r{i}.pages-within-worst"] = r["blocks"] <= k.blocks_for(ops, w["prompt"] + w["max_new"] + draft)
        inv[f"r{i}.decoding-within-worst"] = ops.implies(
            r["phase"] == DECODING, r["computed"] <= w["prompt"] + w["max_new"] + draft)
    return inv


def infer(core: Core, space: Space, candidates: Candidates, props: list[str], timeout: float,
          minimise: bool = True, work: float = OBLIGATION_WORK) -> list[Inference]:
    """Houdini over `candidates` on `space` (its request slots), once; then each of `props` from the
    survivors, and where it follows and `minimise`, the set cut down to the families that property needs."""
    t0 = time.monotonic()
    deadline = clock.now() + timeout      # `timeout`: seconds of the checkers' clock (checkers/clock.py)
    enc = encode(space)
    knobs, params, assume = enc.knobs, enc.params, enc.constraints
    all_names = list(candidates(_SYM, knobs, params, fresh_state(core, space.slots, "names")))
    outs = [Inference("unknown", prop, space.slots, 0.0, candidates=len(all_names)) for prop in props]

    def restricted(keep):
        def invs(ops, k, p, s):
            return {n: c for n, c in candidates(ops, k, p, s).items() if n in keep}
        return invs

    keep, dropped = set(all_names), {}
    while True:
        if clock.now() >= deadline:
            for out in outs:
                out.reason, out.seconds, out.dropped = ("time-out while pruning the candidates",
                                                        time.monotonic() - t0, dict(dropped))
            return outs
        obligations = check_obligations(core, knobs, params, assume, restricted(keep),
                                        max(0.0, clock.until(deadline)), per_obligation=work, batch=True)
        bad = {o.invariant: o for o in obligations if o.status != "proved"}
        if not bad:
            break
        for name, o in bad.items():
            dropped[name] = (f"refuted by {o.action}" if o.status == "failed"
                             else f"{o.action} not proved within its work")
        keep -= set(bad)
    for out in outs:
        out.dropped = dict(dropped)
        prop_ob = _property(core, knobs, params, assume, restricted(keep), out.property, deadline, work)
        out.kept = tuple(sorted({family(n) for n in keep}))
        if prop_ob.status != "proved":
            out.status = "failed" if prop_ob.status == "failed" else "unknown"
            out.cti, out.reason = prop_ob.cti, prop_ob.reason or ("time-out" if prop_ob.status == "unknown" else "")
        else:
            out.status = "proved"
            if minimise:
                support = _support(core, knobs, params, assume, candidates, keep, out.property, deadline, work)
                out.kept, out.needed, out.minimal = _needed(core, knobs, params, assume, candidates, support,
                                                            out.property, deadline, work)
        out.seconds = time.monotonic() - t0
    return outs


def _property(core, knobs, params, assume, invs, prop, deadline, work) -> Obligation:
    left = clock.until(deadline)
    if left <= 0:
        return Obligation("step", prop, "unknown", 0.0, reason="time-out")
    # four times the obligations' slice of work at most: the wall-clock net it had before the clock
    return property_obligation(core, knobs, params, assume, invs, min(left, 4 * work), prop)


def _support(core, knobs, params, assume, candidates, keep: set, prop: str, deadline: float, work: float) -> set:
    """A part of the inductive set `keep` that is still inductive and still implies `prop`, from unsat cores:
    the invariants the property's obligation uses, then, family by family, those each used family's step
    (and decode-run) obligation uses, until nothing new is used. Every family of `keep` holds initially, so
    the part is inductive: each member's obligations hold from the part alone. Where a query does not answer
    within its work, `keep` is returned whole (the removal passes then start from all of it)."""
    n = len(params.slots)
    pre = fresh_state(core, n, "pre")
    conds = {name: c for name, c in candidates(_SYM, knobs, params, pre).items() if name in keep}
    lits = {z3.Bool(f"use[{name}]"): name for name in conds}
    tracked = [z3.Implies(lit, conds[name]) for lit, name in lits.items() if conds[name] is not True]
    members: dict[str, set] = {}
    for name in keep:
        members.setdefault(family(name), set()).add(name)

    def used(facts: list, goal_violated) -> Optional[set]:
        if clock.now() >= deadline:
            return None
        solver = z3.Solver()
        clock.limit(solver, clock.until(deadline), units=work_units(work))
        solver.add(*assume, *tracked, *facts)
        if solver.check(goal_violated, *lits) != z3.unsat:
            return None
        return {lits[lit] for lit in solver.unsat_core() if lit in lits}

    post, rec = core.step(_SYM, knobs, params, pre)
    t = Transition(0, pre, post, rec, True, 1)
    bad = violations(_SYM, OneStep(knobs, params, core, [t], [pre, post]), t)[prop][0]
    first = used([], bad) if not isinstance(bad, bool) else set()
    if first is None:
        return set(keep)
    actions = [(post, [])]
    if core.accelerates_in(knobs):
        m = int_var("m")
        adv = core.decode_advance(_SYM, knobs, params, pre, m)
        actions.append((adv, [m >= 2, core.decode_guard(_SYM, knobs, params, pre, m)]))
    support: set = set()
    todo = sorted({family(name) for name in first})
    while todo:
        fam = todo.pop()
        if fam in {family(x) for x in support}:
            continue
        support |= members[fam]
        for after, facts in actions:
            goals = [c for name, c in candidates(_SYM, knobs, params, after).items()
                     if name in members[fam] and c is not True]
            if not goals:
                continue
            got = used(facts, z3.Not(z3.And(*goals)))
            if got is None:
                return set(keep)
            todo += sorted({family(x) for x in got} - {family(x) for x in support})
    return support


def _needed(core, knobs, params, assume, candidates, keep: set, prop: str, deadline: float, work: float):
    """(families kept, family -> what fails without it, whether every one was shown needed)."""
    members: dict[str, set] = {}
    for n in keep:
        members.setdefault(family(n), set()).add(n)
    current = dict(members)
    changed = True
    needed: dict[str, str] = {}
    while changed:
        changed = False
        needed = {}
        for fam in sorted(current):
            if clock.now() >= deadline:
                return tuple(sorted(current)), needed, False
            rest = set().union(*(v for f, v in current.items() if f != fam))
            broken = _breaks(core, knobs, params, assume, candidates, rest, prop, deadline, work)
            if broken is None:
                # gone; a family judged needed earlier in this pass was judged with it present, so the
                # pass is repeated until one removes nothing: then each was judged against the final set
                del current[fam]
                changed = True
            else:
                needed[fam] = broken
    return tuple(sorted(current)), needed, True


def _breaks(core, knobs, params, assume, candidates, rest: set, prop, deadline, work) -> Optional[str]:
    """None when `rest` alone is inductive and implies `prop`; else what fails."""
    def invs(ops, k, p, s):
        return {n: c for n, c in candidates(ops, k, p, s).items() if n in rest}
    obligations = check_obligations(core, knobs, params, assume, invs, max(0.0, clock.until(deadline)),
                                    per_obligation=work, batch=True)
    first = next((o for o in obligations if o.status != "proved"), None)
    if first is not None:
        return f"{first.invariant} is no longer inductive ({first.action} {first.status})"
    ob = _property(core, knobs, params, assume, invs, prop, deadline, work)
    if ob.status != "proved":
        return f"{prop} no longer follows ({ob.status})"
    return None

