"""Whether a claim decided at one engine release carries to the other releases of its policy: a checked premise.

A claim (proofs/claims.py) is decided at its design's release (model/releases.py `release`: its `version`, or the
newest its policy mirrors). The symbolic core reads the release from `Knobs.release` where a rule differs between
releases (`releases.changed_at`). `carries(claim, timeout_s)` asks Z3, for every other release R of the claim's
policy, whether some state, knobs and workload inside the claim's class make the core behave differently at R
than at the claim's release A. Every term is built by the core itself (`Core.step`, `initial`, `decode_guard`,
`decode_advance`, `invariants`) and by properties/symbolic.py `violations`, twice over the same symbolic knobs,
workload and pre-state: once with `Knobs.release` = A, once with R. Nothing is argued "by construction": a pair
of terms is equal only where it is the same Z3 term (hash-consed: the same function of the inputs) or where the
solver finds no input of the class on which they differ.

What is compared, per case (below), on the class's knobs and workload (`assumptions`), for each release R:
- init:       the initial state, field by field;
- step:       the post-state (every field of every slot, every global) and the step record (tokens, every flag,
              the charge, the error and its kind), from every pre-state satisfying the claim's invariant set at A
              (the core's invariants plus the claim's, proofs/claims.py `invariant_set`: the pre-states of the
              induction's step obligation);
- decode-run: for a core that accelerates, the guard, and the advanced state where the guard holds, for m >= 2
              (the induction's decode-run obligation);
- invariants: each named invariant of the set, at A and at R, on any state (so the init obligation at R is the
              one at A);
- property:   the claim's one-step property condition (`violations`) on the step from an invariant state, with
              the knobs at A and at R (on A's transition, which is R's where the step comparison holds).
If no comparison can differ (UNSAT, or every pair the same term), every obligation of the claim's induction at R
(init, step, decode-run, the property's, and the class being inhabited, which reads only the invariants) is the
obligation at A over equal terms, so the claim's verdict at A is its verdict at R: "carries". The premise is
exactly this check; the carry is only as good as the claim's own proof at A (a claim not proved at A carries
nothing). A model of the difference: "differs", with the first differing field, its two values and the model
(`Witness`: knobs, workload, pre-state), which is a difference of the encoding's inputs, not necessarily a
reachable state (the pre-state satisfies the invariants, nothing more): a conservative "does not carry". Neither
within the time: "unknown", which does not carry.

The cases are the claim's own proof cases: one per slot count of `slots` and per block size of `block_sizes`
(proofs/claims.py `case_class`, as proofs/run.py `prove` builds them). So a carried claim carries for the request counts its
slot proofs cover (up to max(slots) requests). Its argument for any number of requests (checkers/parametric, the
one-request step with the others as an environment) is NOT re-checked here: at R it is not carried by this
premise, and a carried claim's scope at R is "up to max(slots) requests" until that argument is run at R.

A claim decided by the bounded search (method "bmc", expected to fail) has one case: its `space`'s encoding
(checkers/space.py `encode`), and no invariants are assumed (the search's trace need satisfy none that is proved
for that space): init, step, decode-run and the property are compared from every pre-state of the space's knobs and
workload. Carried, the core's runs at R are its runs at A, step for step, so the counterexample is a run of the
core at R with the same violation. (Its replay on the simulator at R, model/policies/ with `changed(cfg, ...)`, is not
re-run here: the simulator and the core at each release are tied by the differential tests.)

Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from checkers import clock
from checkers.encode import evaluate, evaluate_state, fresh_state, int_var
from checkers.induction import ONE_STEP_PROPERTIES, OneStep
from checkers.space import encode
from model import releases
from model.symbolic.core import CORES
from model.symbolic.ops import Symbolic
from model.symbolic.slots import RECORD_FLAGS, Knobs, Params, SlotRecord, SlotState
from properties.symbolic import Transition, violations

from .claims import Claim, case_class, invariant_set

SYM = Symbolic()
CARRIES, DIFFERS, UNKNOWN = "carries", "differs", "unknown"


@dataclasses.dataclass
class ReleaseCarry:
    """The verdict for one other release: CARRIES, DIFFERS (`field`: the case and the first field that differs,
    with its value at the claim's release and at this one) or UNKNOWN (`field`: why)."""

    release: str
    status: str
    field: str = ""
    seconds: float = 0.0
    # per case ("n=2", "n=3 block_size=4", "space"): (label, status, the field or reason, how many of the
    # compared outputs are different terms at the two releases: 0 means the same terms, decided without a query)
    cases: list = dataclasses.field(default_factory=list)
    witness: Optional["Witness"] = None   # DIFFERS: the model of the difference

    def line(self) -> str:
        if self.status == CARRIES:
            how = "the same terms" if all(c[3] == 0 for c in self.cases) else "no difference on the class"
            return f"{self.release}: carries ({how}; {self.seconds:.1f} s)"
        if self.status == DIFFERS:
            return f"{self.release}: differs ({self.field}) ({self.seconds:.1f} s)"
        return f"{self.release}: unknown ({self.field or 'time-out'}) ({self.seconds:.1f} s)"


@dataclasses.dataclass
class CarryResult:
    claim: Claim
    at: str                         # the release the claim is decided at
    releases: list[ReleaseCarry]    # every other release of its policy, oldest first
    scope: str                      # the cases checked, in words
    seconds: float = 0.0

    def carried(self) -> tuple[str, ...]:
        return tuple(r.release for r in self.releases if r.status == CARRIES)

    def get(self, release: str) -> ReleaseCarry:
        return next(r for r in self.releases if r.release == release)

    def line(self) -> str:
        """"releases: 0.32 (carried), 0.33 (differs: ...), 0.34 (decided)", oldest first."""
        words = {r.release: ("carried" if r.status == CARRIES else
                             f"differs: {r.field}" if r.status == DIFFERS else "unknown")
                 for r in self.releases}
        words[self.at] = "decided"
        return "releases: " + ", ".join(f"{r} ({words[r]})" for r in releases.releases(self.claim.policy))

    def detail(self, proved_for_any_n: bool) -> dict:
        """What a verdict keeps of it (`prove` prints `line`, `--json` has it all): no seconds, so a run's JSON is
        a function of the claims and the budget. A claim proved for any number of requests at its release is
        carried for the slot counts checked here only."""
        line = self.line()
        if proved_for_any_n and self.carried():
            line += (f"; carried for up to {max(self.claim.slots)} requests (the argument for any number of "
                     f"requests is checked at {self.at} only)")
        return {"at": self.at, "line": line, "carried": list(self.carried()),
                "differs": {r.release: r.field for r in self.releases if r.status == DIFFERS},
                "unknown": {r.release: r.field or "time-out" for r in self.releases if r.status == UNKNOWN}}


# -- one case: the terms at two releases over the same inputs --------------------------------------------------
@dataclasses.dataclass
class _Case:
    label: str
    knobs: Knobs                 # at the claim's release
    params: Params
    assume: list                 # the class: knob bounds, workload constraints
    invariants: Optional[object]  # (ops, k, p, s) -> dict, assumed of the pre-state; None: no invariants
    side: Optional[tuple] = None  # `_side`: the pre-state, m, its invariants, the outputs at the claim's release


def cases(claim: Claim) -> list[_Case]:
    """The claim's proof cases (proofs/run.py `prove` for induction; the space's encoding for a bounded search)."""
    if claim.method != "induction":
        enc = encode(claim.space)
        return [_Case("space", enc.knobs, enc.params, list(enc.constraints), None)]
    out = []
    for n in claim.slots:
        for b in (claim.block_sizes or (None,)):
            knobs, params, assume = case_class(claim, n, b)
            label = f"n={n}" + (f" block_size={b}" if b is not None else "")
            out.append(_Case(label, knobs, params, assume, invariant_set(claim)))
    return out


def _state_pairs(what: str, a: SlotState, b: SlotState) -> list[tuple[str, object, object]]:
    out = []
    for i, (ra, rb) in enumerate(zip(a.req, b.req)):
        out += [(f"{what} slot {i}.{f}", ra[f], rb[f]) for f in ra]
    out += [(f"{what} {f}", a.g[f], b.g[f]) for f in a.g]
    return out


def _record_pairs(a: SlotRecord, b: SlotRecord) -> list[tuple[str, object, object]]:
    out = [(f"record tokens[{i}]", x, y) for i, (x, y) in enumerate(zip(a.tokens, b.tokens))]
    for f in RECORD_FLAGS:
        out += [(f"record {f}[{i}]", x, y) for i, (x, y) in enumerate(zip(a.flags[f], b.flags[f]))]
    out += [("record charged", a.charged, b.charged), ("record error", a.error, b.error),
            ("record error_kind", a.error_kind, b.error_kind)]
    return out


def _same(x, y) -> bool:
    """The same term (Z3 hash-conses its terms: the same function of the inputs) or the same Python value."""
    if isinstance(x, z3.ExprRef) and isinstance(y, z3.ExprRef):
        return x.eq(y)
    if isinstance(x, z3.ExprRef) or isinstance(y, z3.ExprRef):
        return False
    return x == y and isinstance(x, bool) == isinstance(y, bool)


def _differ(x, y):
    """x != y as a Z3 condition (either may be a Python value)."""
    if not isinstance(x, z3.ExprRef):
        x, y = y, x
    if not isinstance(x, z3.ExprRef):        # two Python values (`_same` found them different)
        return z3.BoolVal(not _same(x, y))
    if z3.is_bool(x):
        return z3.Not(x == (y if isinstance(y, z3.ExprRef) else z3.BoolVal(bool(y))))
    return z3.Not(x == (int(y) if isinstance(y, bool) else y))


def _outputs(claim: Claim, case: _Case, release: str, pre: SlotState, m, at_a: Optional[dict]) -> dict:
    """label -> term: every output the claim's proof reads, with `Knobs.release` = `release`, over the case's
    knobs, workload, the pre-state `pre` and the decode-run length `m`. The property's condition is taken on the
    claim's release's step (`at_a`'s, or this one's when this is that release): it compares the condition itself."""
    core = CORES[claim.policy]
    k = dataclasses.replace(case.knobs, release=release)
    p = case.params
    out: dict = {}
    out.update((label, x) for label, x, _ in _state_pairs("init", core.initial(SYM, k, p), core.initial(SYM, k, p)))
    post, rec = core.step(SYM, k, p, pre)
    out["_post"], out["_rec"] = post, rec
    out.update((label, x) for label, x, _ in _state_pairs("step: post", post, post) + _record_pairs(rec, rec))
    if core.accelerates_in(k):
        out["decode-run: guard"] = core.decode_guard(SYM, k, p, pre, m)
        adv = core.decode_advance(SYM, k, p, pre, m)
        out.update((label, x) for label, x, _ in _state_pairs("decode-run: advanced", adv, adv))
    if case.invariants is not None:
        for name, cond in case.invariants(SYM, k, p, pre).items():
            out[f"invariant {name}"] = cond
    if claim.property in ONE_STEP_PROPERTIES:
        post_a, rec_a = (post, rec) if at_a is None else (at_a["_post"], at_a["_rec"])
        t = Transition(0, pre, post_a, rec_a, True, 1)
        out[f"property {claim.property}"] = violations(SYM, OneStep(k, p, core, [t], [pre, post_a]), t)[
            claim.property][0]
    return out


def _side(claim: Claim, case: _Case) -> tuple:
    """The case's pre-state, decode-run length, invariants of the pre-state and outputs at the claim's release,
    built once and shared by every other release."""
    if case.side is None:
        core = CORES[claim.policy]
        pre = fresh_state(core, len(case.params.slots), "pre")
        m = int_var("m")
        inv_pre = []
        if case.invariants is not None:
            inv_pre = [c for c in case.invariants(SYM, case.knobs, case.params, pre).values() if c is not True]
        case.side = (pre, m, inv_pre, _outputs(claim, case, case.knobs.release, pre, m, None))
    return case.side


def comparisons(claim: Claim, case: _Case, other: str) -> list[tuple[str, object, object, list]]:
    """(label, term at the claim's release, term at `other`, what is assumed besides the class) for every output
    the claim's proof reads; pairs that are the same term are left out. Assumed: nothing for init and the
    invariants (any state); the invariants at the claim's release of the pre-state for the step and the property;
    those, m >= 2 (and for the advanced state the guard at the claim's release) for the decode-run."""
    pre, m, inv_pre, at_a = _side(claim, case)
    at_r = _outputs(claim, case, other, pre, m, at_a)
    out = []
    for label in list(at_a) + [name for name in at_r if name not in at_a]:
        if label.startswith("_"):
            continue
        if label not in at_a or label not in at_r:
            out.append((f"{label} (at one release only)", True, False, []))
            continue
        if label.startswith("init") or label.startswith("invariant"):
            extra = []
        elif label == "decode-run: guard":
            extra = inv_pre + [m >= 2]
        elif label.startswith("decode-run"):
            extra = inv_pre + [m >= 2, at_a["decode-run: guard"]]
        else:
            extra = inv_pre
        out.append((label, at_a[label], at_r[label], extra))
    return [(label, x, y, extra) for label, x, y, extra in out if not _same(x, y)]


@dataclasses.dataclass
class Witness:
    """A model of a difference: concrete knobs (the claim's release), workload and pre-state on which the core's
    outputs differ between the two releases (tests/symbolic/test_release_carry.py re-runs the core on it
    concretely at both)."""

    knobs: Knobs
    params: Params
    pre: SlotState


def _witness(model, case: _Case, pre: SlotState) -> Witness:
    numeric = {name: evaluate(model, getattr(case.knobs, name)) for name in Knobs.NUMERIC}
    params = Params([{f: evaluate(model, v) for f, v in w.items()} for w in case.params.slots])
    return Witness(dataclasses.replace(case.knobs, **numeric), params, evaluate_state(model, pre))


def _decide(claim: Claim, case: _Case, other: str, deadline: float) -> tuple:
    """(status, the first differing field with its values or why unknown, how many pairs differ as terms, the
    witness of a difference or None)."""
    pairs = comparisons(claim, case, other)
    if not pairs:
        return CARRIES, "", 0, None
    diffs = [(label, x, y, z3.And(*extra, _differ(x, y)) if extra else _differ(x, y))
             for label, x, y, extra in pairs]
    left = clock.until(deadline)
    if left <= 0:
        return UNKNOWN, "time-out", len(pairs), None
    solver = z3.Solver()
    clock.limit(solver, left)
    solver.add(*case.assume)
    r = solver.check(z3.Or(*[d for _, _, _, d in diffs]))
    if r == z3.unsat:
        return CARRIES, "", len(pairs), None
    if r == z3.unknown:
        return UNKNOWN, clock.why_unknown(solver), len(pairs), None
    model = solver.model()
    witness = _witness(model, case, case.side[0])
    for label, x, y, d in diffs:
        if z3.is_true(model.eval(d, model_completion=True)):
            return DIFFERS, (f"{case.label}: {label}: {evaluate(model, x)} at {case.knobs.release}, "
                             f"{evaluate(model, y)} at {other}"), len(pairs), witness
    return DIFFERS, f"{case.label}: (no single field named by the model)", len(pairs), witness


def carries(claim: Claim, timeout_s: float) -> CarryResult:
    """For every other release of the claim's policy: does the claim's verdict at its own release carry there?
    `timeout_s` is seconds of the checkers' clock (checkers/clock.py), shared by every release and case."""
    t0 = time.monotonic()
    at = releases.release(claim.design)
    others = [r for r in releases.releases(claim.policy) if r != at]
    the_cases = cases(claim)
    scope = ", ".join(c.label for c in the_cases)
    deadline = clock.now() + timeout_s
    out = []
    for other in others:
        t1 = time.monotonic()
        per_case = []
        witness = None
        for case in the_cases:
            status, field, count, witness = _decide(claim, case, other, deadline)
            per_case.append((case.label, status, field, count))
            if status == DIFFERS:
                break                       # one difference decides it
        statuses = [s for _, s, _, _ in per_case]
        if DIFFERS in statuses:
            status = DIFFERS
            field = next(f for _, s, f, _ in per_case if s == DIFFERS)
        elif UNKNOWN in statuses:
            status = UNKNOWN
            field = next(f"{label}: {f}" for label, s, f, _ in per_case if s == UNKNOWN)
        else:
            status, field = CARRIES, ""
        out.append(ReleaseCarry(other, status, field, time.monotonic() - t1, per_case, witness))
    return CarryResult(claim, at, out, scope, time.monotonic() - t0)
