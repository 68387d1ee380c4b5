"""Which proved claims reach a check file: containment of the file's space in a claim's class.

A claim (proofs/claims.py) is proved for every design of its structure with the numeric knobs in
`knob_bounds` and every workload of its class, on top of induction.workload_constraints. A check
file's space is a design with ranges and request groups (checkers/space.py). The file's runs lie in
the claim's class where
- the structure is the claim's: the policy, chunked prefill, the chunk unit and every option equal;
  a numeric knob the claim leaves out of `knob_bounds` fixed at the claim's value; with
  `block_sizes`, the file's block size fixed at one of them (checked here, on the data: `structure`);
- and, on the file's own encoding, the knobs lie in `knob_bounds`, the slots satisfy
  workload_constraints and the claim's `workload`, and (where the claim is proved only up to n
  requests) at most n slots are present (`condition`: a Z3 term over the file's variables).

A solver query then says whether the file's constraints imply the condition (the whole space is
inside), exclude it (none of it is), or neither (a part is): `reach`. The part inside is proved by
the claim, at every depth; proofs/review.py searches the rest.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import z3

from checkers import clock
from checkers.induction import workload_constraints
from checkers.space import Encoding, Space, hi, lo
from model.policy import POLICIES
from model.symbolic.ops import Symbolic
from model.symbolic.slots import Knobs

from . import modes
from .claims import HOLDS, Claim, claims_for

SYM = Symbolic()
WHOLE, PART, NONE = "whole", "part", "none"


def candidates(space: Space, properties: list[str]) -> list[Claim]:
    """The claims that could reach the space: expected to hold, proved by induction, about the file's
    engine and one of its properties; with each claim, its twin in the engine's default loop where the core
    expresses that loop (proofs/modes.py: a file in the default loop lies in no claim's class, the loop's knob
    being part of the structure, but may lie in a twin's)."""
    claims = claims_for(space.template.policy)
    return [c for c in claims + modes.twins(claims)
            if c.expected == HOLDS and c.method == "induction" and c.property in properties]


def structure(claim: Claim, space: Space) -> str:
    """"" when the file's design has the claim's structure; else what differs, in words."""
    design, template = claim.design, space.template
    for field in ("policy", "chunked_prefill", "chunk_unit"):
        if getattr(template, field) != getattr(design, field):
            return f"engine.{field} is {getattr(template, field)!r}, the claim's is {getattr(design, field)!r}"
    pool_inputs = POLICIES[design.policy].pool_inputs
    for f in dataclasses.fields(design.options):
        if f.name in pool_inputs:
            continue        # they give num_blocks, which the class bounds
        mine, theirs = getattr(template.options, f.name), getattr(design.options, f.name)
        if mine != theirs:
            return f"engine.options.{f.name} is {mine!r}, the claim's is {theirs!r}"
    for name in Knobs.NUMERIC:
        v = space.knobs.get(name, getattr(template, name))
        if name == "block_size" and claim.block_sizes:
            if lo(v) != hi(v) or lo(v) not in claim.block_sizes:
                return f"engine.block_size is {_text(v)}, the claim is proved at {_sizes(claim.block_sizes)}"
            continue
        if name in claim.knob_bounds:
            continue        # the condition bounds it on the file's terms
        if lo(v) != hi(v) or lo(v) != getattr(design, name):
            return f"engine.{name} is {_text(v)}, the claim's is {getattr(design, name)}"
    return ""


def condition(claim: Claim, enc: Encoding, scope) -> object:
    """The file's runs inside the claim's class (a Z3 term, or a Python bool), with `scope` the
    request counts the claim is proved for: "any", or the largest n."""
    out = []
    for name, (low, high) in claim.knob_bounds.items():
        t = enc.knob_terms.get(name, getattr(enc.space.template, name))
        out.append(t >= low)
        if high is not None:
            out.append(t <= high)
    out += workload_constraints(enc.params)
    if claim.workload is not None:
        out += claim.workload(SYM, enc.knobs, enc.params)
    if scope != "any":
        out.append(enc.count <= scope)
    out = [c for c in out if c is not True]
    if any(c is False for c in out):
        return False
    return z3.And(*out) if out else True


@dataclasses.dataclass
class Reach:
    claim: Claim
    kind: str                 # WHOLE | PART | NONE, or "" when not decided (`why` says why)
    why: str = ""             # NONE: what keeps the file outside; "": the time ran out
    seconds: float = 0.0

    def line(self) -> str:
        if self.kind == WHOLE:
            return f"{self.claim.name}: the whole space lies in its class"
        if self.kind == PART:
            return f"{self.claim.name}: part of the space lies in its class"
        if self.kind == NONE:
            return f"{self.claim.name}: outside its class ({self.why})"
        return f"{self.claim.name}: containment not decided ({self.why or 'time-out'})"


def reach(claim: Claim, enc: Encoding, scope, timeout: float) -> Reach:
    """Whether the file's space (its encoding's constraints) lies inside the claim's class up to
    `scope` requests: wholly, in part, or not at all."""
    t0 = time.monotonic()
    why = structure(claim, enc.space)
    if why:
        return Reach(claim, NONE, why, time.monotonic() - t0)
    cond = condition(claim, enc, scope)
    if cond is False:
        return Reach(claim, NONE, "no run of the file satisfies the class", time.monotonic() - t0)
    if cond is True:
        return Reach(claim, WHOLE, "", time.monotonic() - t0)
    solver = z3.Solver()
    solver.add(*enc.constraints)
    deadline = clock.now() + timeout
    some = _check(solver, deadline, cond)
    if some == z3.unsat:
        return Reach(claim, NONE, "no run of the file satisfies the class", time.monotonic() - t0)
    rest = _check(solver, deadline, z3.Not(cond))
    if some == z3.unknown or rest == z3.unknown:
        return Reach(claim, "", "time-out" if rest != z3.unsat else "", time.monotonic() - t0)
    return Reach(claim, WHOLE if rest == z3.unsat else PART, "", time.monotonic() - t0)


def _check(solver: z3.Solver, deadline: float, *assumptions):
    left = clock.until(deadline)
    if left <= 0:
        return z3.unknown
    clock.limit(solver, left)
    return solver.check(*assumptions)


def _text(v) -> str:
    return str(lo(v)) if lo(v) == hi(v) else f"[{lo(v)}, {hi(v)}]"


def _sizes(sizes: tuple) -> str:
    return ", ".join(str(b) for b in sizes)


def covered_by(parts: list[tuple[Claim, object]]) -> Optional[callable]:
    """Per property, the runs some proved claim covers (a function of an encoding), from (claim, scope) pairs."""
    if not parts:
        return None

    def covered(enc: Encoding) -> dict:
        out: dict = {}
        for claim, scope in parts:
            cond = condition(claim, enc, scope)
            prev = out.get(claim.property, False)
            out[claim.property] = cond if prev is False else (True if cond is True else z3.Or(prev, cond))
        return out
    return covered
