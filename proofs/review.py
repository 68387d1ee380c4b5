"""Design review: one decision for a check file, by every route the suite has.

`decide` (what `schedproof check FILE` and `schedproof prove FILE` run) ends in one verdict:
- proved: every run of the file, at every depth, for each property asked, by the proved claims whose
  class contains the file's runs (proofs/reach.py: a solver query over the file's ranges) and by an
  invariant inferred for the file (checkers/infer.py: Houdini over the core's, the claims' and template
  candidates, the property from the survivors);
- violated: the bounded search (checkers/bmc.py) found a run outside what is proved, replayed;
- bounded: no run of at most max_depth transitions violates a property (beside what is proved);
- unknown: each route ran out of time; the verdict says what each reached.

A part proved (a claim's class covering some of the runs, an invariant for runs of at most a few
requests) holds at every depth; the search still asks every run of the file, the proved part included:
left out of each query (`And(bad, Not(covered))`) the negated class is in every query, and in a run during
development the 4-request wedge of the A+B field ranges with 1-12 requests was then not found in 600 s.

The order: the claims' reach (solver queries, seconds) first. `check` then proves the reaching claims
where one can prove the whole file, and otherwise searches first (a violation is what a reviewer most
needs to see soon, and a claim's proof can take minutes): the search pauses with the claims' share of
the time left, the claims are proved in the pause, and the search goes on where it stopped. It infers
with what is left: a share of the time is kept for inference only where it can prove the whole file
(at most INFER_SLOTS request slots). `prove` proves the claims and infers first. Each route's time is a
share of the time-out, so both end in it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import z3

from checkers import clock
from checkers.bmc import PAUSED, BmcResult, Searching, units_of
from checkers.induction import ONE_STEP_PROPERTIES
from checkers.infer import infer, templates
from checkers.space import Encoding, Space, encode, hi, lo
from model.symbolic.core import Core

from . import reach as reaching
from .claims import HOLDS, Claim, claims_for
from .run import Verdict, decide_induction

# Inference runs on the file's own slots where it has at most this many, else on its runs with at most
# this many requests per ranged group (each further slot multiplies an obligation's cost several times).
INFER_SLOTS = 3
# the shares of the time-out: the claims that reach the file, then inference (check: after the search)
CLAIMS_SHARE, INFER_SHARE = 0.35, 0.3


@dataclasses.dataclass
class ClaimPart:
    """A proved claim and the part of the file it covers."""
    claim: Claim
    verdict: Verdict
    kind: str                         # reach.WHOLE | reach.PART

    def line(self) -> str:
        scope = ("for any number of requests" if self.verdict.scope == "any"
                 else f"for up to {self.verdict.scope} requests")
        where = "every run of the file" if self.kind == reaching.WHOLE else "the runs of the file in its class"
        return (f"{where}: claim {self.claim.name} ({self.claim.property}, proved {scope}): "
                f"{self.claim.statement}; class: {self.claim.class_text}")


@dataclasses.dataclass
class Review:
    status: str                       # proved | violated | bounded | unknown
    properties: list
    seconds: float
    claims: list = dataclasses.field(default_factory=list)        # ClaimPart: proved and reaching
    reaches: list = dataclasses.field(default_factory=list)       # reach.Reach, every candidate claim
    refused: list = dataclasses.field(default_factory=list)       # (claim name, why its proof did not hold)
    inferred: list = dataclasses.field(default_factory=list)      # (Inference, cap or None)
    search: Optional[BmcResult] = None
    whole: dict = dataclasses.field(default_factory=dict)         # property -> proved for every run
    notes: list = dataclasses.field(default_factory=list)         # why a route was not taken

    def argument(self) -> list[str]:
        """What the proved parts rest on, in words."""
        out = [p.line() for p in self.claims]
        for inf, cap in self.inferred:
            if inf.status == "proved":
                where = "every run of the file" if cap is None else f"the runs with at most {cap} requests per group"
                out.append(f"{where}: {inf.line()}; invariant: {', '.join(inf.kept)}")
        return out


def decide(core: Core, space: Space, properties: list[str], max_depth: int, timeout: float,
           proofs_first: bool = False, accelerate: bool = True,
           progress: Optional[Callable] = None, note: Callable[[str], None] = lambda line: None) -> Review:
    t0 = time.monotonic()                  # for the seconds it reports
    start = clock.now()                    # its deadlines are times of the checkers' clock (checkers/clock.py)
    deadline = start + timeout
    review = Review("unknown", list(properties), 0.0)
    enc = encode(space)
    for claim in reaching.candidates(space, properties):
        review.reaches.append(reaching.reach(claim, enc, "any",
                                             max(0.1, clock.until(start + CLAIMS_SHARE * timeout))))
    own = own_claim(space, properties)
    infer_after = not proofs_first and any(p in ONE_STEP_PROPERTIES for p in properties)
    searching: Optional[Searching] = None

    # check, where no claim can prove the whole file: a violation outside the claims' parts is looked for
    # before they are proved (a shallow trace in seconds, not after minutes of proof); the search pauses
    # with the claims' share of the time-out (and inference's) left, and goes on after them
    if not proofs_first and own is None and any(r.kind == reaching.PART for r in review.reaches) \
            and not any(r.kind == reaching.WHOLE for r in review.reaches):
        reserve = (CLAIMS_SHARE + (INFER_SHARE if infer_after and space.slots <= INFER_SLOTS else 0.0)) * timeout
        searching = Searching(core, space, max_depth, list(properties), accelerate, progress=progress)
        review.search = searching.run(deadline, find_by=deadline - reserve)
        if review.search.status == "violated":
            review.notes.append("the claims that reach part of the file were not proved: the search found a "
                                "violation first")
            return _finish(review, t0)

    # 1. the proved claims whose class reaches the file
    claim_deadline = clock.now() + CLAIMS_SHARE * timeout
    _prove_claims(review, enc, own, claim_deadline, note)
    covered_parts = [(p.claim, p.verdict.scope) for p in review.claims]

    # 2. inference (prove: before the search; check: after it, where it found nothing)
    def run_inference(share_deadline: float) -> None:
        props = [p for p in properties if not review.whole.get(p) and p in ONE_STEP_PROPERTIES]
        if not props:
            return
        cap, sub = _inference_space(space)
        if sub is None:
            review.notes.append(f"inference not attempted: every run of the file has more than {INFER_SLOTS} "
                                f"requests")
            return
        left = clock.until(share_deadline)
        if left <= 1:
            review.notes.append("inference not started: the time-out was spent")
            return
        note(f"  inferring an invariant over {sub.slots} request slots ({left:.0f} s at most)")
        for inf in infer(core, sub, candidates_for(core, space.template.policy), props, left):
            review.inferred.append((inf, cap))
        for prop in props:
            _settle(review, enc, covered_parts, prop)

    for prop in properties:
        _settle(review, enc, covered_parts, prop)
        if prop not in ONE_STEP_PROPERTIES and not review.whole.get(prop):
            review.notes.append(f"{prop}: no proof attempted: it is not a property of one step, so no invariant "
                                f"implies it and no claim states it (checkers/induction.py); searched only")
    if proofs_first and not all(review.whole.get(p) for p in properties):
        run_inference(clock.now() + 0.5 * clock.until(deadline))

    # 3. the search (every run: the proved parts hold at every depth, the search to a depth), or what is left of
    # it where it went first
    wanted = [p for p in properties if not review.whole.get(p)]
    if wanted:
        if review.search is None or review.search.reason == PAUSED:
            # time is kept for inference where it can prove the whole file; where it covers only the runs of a few
            # requests (which the search covers too, if only to a depth), it has what the search leaves
            infer_after = infer_after and any(p in ONE_STEP_PROPERTIES for p in wanted)
            reserve = (INFER_SHARE * clock.until(deadline)
                       if infer_after and space.slots <= INFER_SLOTS else 0.0)
            if searching is None or set(wanted) != set(properties):
                searching = Searching(core, space, max_depth, wanted, accelerate, progress=progress)
            review.search = searching.run(max(clock.now() + 0.1, deadline - reserve))
        if infer_after and review.search.status != "violated":
            run_inference(deadline)
    else:
        review.search = None        # proved: what the search reached before is beside the point
    return _finish(review, t0)


def _prove_claims(review: Review, enc: Encoding, own: Optional[Claim], claim_deadline: float,
                  note: Callable[[str], None]) -> None:
    """Prove the claims that reach the file (and the file's own design, where the engine's argument needs no
    class) within `claim_deadline`; each proved one that still reaches at its proved scope covers a part."""
    proofs: dict[str, Verdict] = {}
    for r in review.reaches:
        claim = r.claim
        if r.kind not in (reaching.WHOLE, reaching.PART):
            continue
        left = clock.until(claim_deadline)
        if left <= 0:
            review.refused.append((claim.name, "its proof not started: the claims' share of the time-out is spent"))
            continue
        note(f"  claim {claim.name}: {r.kind} of the space in its class; proving it ({left:.0f} s at most)")
        verdict = proofs.get(claim.name) or decide_induction(claim, left)
        proofs[claim.name] = verdict
        if verdict.status != "proved":
            review.refused.append((claim.name, verdict.line))
            continue
        scoped = r if verdict.scope == "any" else reaching.reach(claim, enc, verdict.scope, 10.0)
        if scoped.kind in (reaching.WHOLE, reaching.PART):
            review.claims.append(ClaimPart(claim, verdict, scoped.kind))
    # the engine's argument for any workload, applied to the file's own design (a claim of it, made here)
    if own is not None and not any(p.kind == reaching.WHOLE and p.claim.property == own.property
                                   and p.verdict.scope == "any" for p in review.claims):
        left = clock.until(claim_deadline)
        if left > 0:
            note(f"  the file's design as a claim of every workload ({own.property}): proving it ({left:.0f} s at "
                 f"most)")
            verdict = decide_induction(own, left)
            if verdict.status == "proved":
                kind = reaching.reach(own, enc, verdict.scope, 10.0).kind
                if kind in (reaching.WHOLE, reaching.PART):
                    review.claims.append(ClaimPart(own, verdict, kind))
            else:
                review.refused.append((own.name, verdict.line))


def _finish(review: Review, t0: float) -> Review:
    if all(review.whole.get(p) for p in review.properties):
        review.status = "proved"
    elif review.search is not None and review.search.status == "violated":
        review.status = "violated"
    elif review.search is not None and review.search.status == "bounded":
        review.status = "bounded"
    else:
        review.status = "unknown"
    review.seconds = time.monotonic() - t0
    return review


# (engine, property) whose argument for any number of requests needs no workload class: the file's own design, with
# its ranged knobs as the bounds, is then a claim of every workload (trtllm_v1's token budget, checkers/parametric/
# local.py; the argument checks its own premises on the design: block reuse, say, makes it fail)
CLASS_FREE_ARGUMENTS = {("trtllm_v1", "SAFE-BUDGET")}


def own_claim(space: Space, properties: list[str]) -> Optional[Claim]:
    """The file's design as a claim of every workload, where the engine's argument needs no class."""
    prop = next((p for p in properties if (space.template.policy, p) in CLASS_FREE_ARGUMENTS), None)
    if prop is None:
        return None
    design = space.template
    bounds = {name: (lo(v), hi(v)) for name, v in space.knobs.items() if lo(v) != hi(v)}
    ranges = ", ".join(f"{name} {lo(v)}-{hi(v)}" for name, v in space.knobs.items() if lo(v) != hi(v))
    return Claim(design.policy, "the file's design", f"no step of this design violates {prop}, for any workload",
                 design, "this design" + (f" with {ranges}" if ranges else "") + "; any workload, arrivals, early "
                 "stops, cancellations", HOLDS, "induction", knob_bounds=bounds, property=prop, parametric="local")


def candidates_for(core: Core, policy: str):
    """Houdini's candidates: the core's invariants, every claim's of the engine (each claim's named after
    it), and the templates with the file's numbers."""
    extra = []
    for claim in claims_for(policy):
        if claim.invariants is not None and claim.invariants not in [f for f, _ in extra]:
            extra.append((claim.invariants, claim.name))

    def invs(ops, k, p, s):
        out = dict(core.invariants(ops, k, p, s))
        for fn, name in extra:
            try:
                more = fn(ops, k, p, s)
            except (AttributeError, KeyError, TypeError, z3.Z3Exception):
                continue     # written for another option set of the engine: not a candidate here
            for n, c in more.items():
                out.setdefault(f"{n} [{name}]", c)
        for n, c in templates(ops, k, p, s).items():
            out.setdefault(n, c)
        return out
    return invs


def _inference_space(space: Space) -> tuple[Optional[int], Optional[Space]]:
    """(cap, the space inference runs on): the file's own where it has at most INFER_SLOTS slots, else the
    largest capped subset that small (None, None: none is)."""
    if space.slots <= INFER_SLOTS:
        return None, space
    small = [(cap, sub) for cap, sub in units_of(space) if cap is not None and sub.slots <= INFER_SLOTS]
    return max(small, key=lambda u: u[1].slots) if small else (None, None)


def within_cap(enc: Encoding, cap: int):
    """The runs of the encoding with at most `cap` requests in each ranged group (a capped space's runs)."""
    out = []
    groups = enc.space.groups
    for k, grp in enumerate(groups):
        if not isinstance(grp.count, tuple):
            continue
        limit = max(lo(grp.count), min(hi(grp.count), cap))
        members = z3.Sum([z3.If(z3.And(w["present"], g == k) if len(groups) > 1 else w["present"], 1, 0)
                          for w, g in zip(enc.params.slots, enc.group_of)])
        out.append(members <= limit)
    return z3.And(*out) if out else True


def _covered(review: Review, covered_parts: list):
    """Per property, the runs proved so far: the claims' parts and the inferred parts."""
    by_claims = reaching.covered_by(covered_parts)

    def covered(enc: Encoding) -> dict:
        out = dict(by_claims(enc)) if by_claims is not None else {}
        for inf, cap in review.inferred:
            if inf.status != "proved":
                continue
            cond = True if cap is None else within_cap(enc, cap)
            prev = out.get(inf.property, False)
            out[inf.property] = cond if prev is False or cond is True else (
                True if prev is True else z3.Or(prev, cond))
        return out
    if not covered_parts and not any(inf.status == "proved" for inf, _ in review.inferred):
        return None
    return covered


def _settle(review: Review, enc: Encoding, covered_parts: list, prop: str) -> None:
    """Whether the proved parts cover every run of the file for `prop` (a solver query: the file's
    constraints and the negation of their union)."""
    cond = (_covered(review, covered_parts) or (lambda e: {}))(enc).get(prop, False)
    if cond is True:
        review.whole[prop] = True
        return
    if cond is False:
        review.whole[prop] = False
        return
    solver = z3.Solver()
    clock.limit(solver, 30.0)
    solver.add(*enc.constraints)
    review.whole[prop] = solver.check(z3.Not(cond)) == z3.unsat
