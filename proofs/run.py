"""`schedproof prove [POLICY]`: decide every claim of proofs/claims.py.

A claim expected to hold is proved by induction (checkers/induction.py): the core's invariants
plus the claim's are inductive (init, step, decode-run), then the claim's property (LIVE-NO-PROGRESS,
or a one-step safety property such as ENGINE-ERROR or SAFE-BUDGET) follows from them at every step;
one run per concrete block size and per slot count. A claim expected to fail is refuted by the
bounded search (checkers/bmc.py), and the counterexample is replayed on the core and on the
engine-checked simulator (checkers/replay.py) before it is reported.

Nothing here prints: `decide_claims` reports each step of its work to a `progress` callback as
`ProofEvent`s and returns the verdicts; schedproof/provereport.py renders both, schedproof/cli.py
prints. Exit status (`exit_code`): 0 every claim as expected; 1 a claim expected to hold fails (a
counterexample to induction) or one expected to fail is not refuted; 3 unknown or time-out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from checkers import bmc, clock, parametric
from checkers.parametric import local, local_hf, local_sglang, local_vllm
from checkers.encode import fresh_state
from checkers.induction import Obligation, check_obligations, property_obligation, symbolic_knobs
from checkers.replay import replay
from model import releases
from model.symbolic.core import CORES
from model.symbolic.ops import Symbolic
from model.symbolic.slots import DECODING, Params, unfinished
from properties.symbolic import quiet

from .claims import FAILS, HOLDS, OPEN, Claim, case_class, invariant_set
from .release_carry import carries

EXIT_OK, EXIT_UNEXPECTED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3
SYM = Symbolic()


@dataclasses.dataclass
class Verdict:
    claim: Claim
    status: str                     # proved | refuted | failed | not-refuted | unknown
    as_expected: bool
    line: str
    seconds: float
    obligations: list = dataclasses.field(default_factory=list)   # (label, Obligation)
    detail: dict = dataclasses.field(default_factory=dict)
    cex: object = None              # the bounded search's Counterexample (bmc claims), replayed
    scope: object = None            # induction proved: the request counts covered, "any" or the largest n
    # a claim with an argument for any number of requests that did not go through: its first part not
    # proved, "action name: reason" (a premise the tool could not check is one)
    any_n_open: str = ""
    any_n_cut: bool = False         # ... because a part of it was cut short (time-out): unknown, not lost

    @property
    def lost_scope(self) -> bool:
        """Expected for any number of requests, proved only up to n (not for want of time)."""
        return self.status == "proved" and self.claim.any_n and self.scope != "any" and not self.any_n_cut


@dataclasses.dataclass
class ProofEvent:
    """One step of `decide_claims`' work, for a progress display: a claim started ("claim"), an
    obligation decided ("obligation", with its case label), a case skipped at the time-out
    ("skipped"), a bounded search's trace found ("trace", with the verdict so far), a claim
    decided ("verdict")."""
    kind: str
    claim: Claim
    label: str = ""
    obligation: Optional[Obligation] = None
    verdict: Optional[Verdict] = None


Progress = Callable[[ProofEvent], None]


def _quiet(event: ProofEvent) -> None:
    pass


def prove(claim: Claim, n: int, block_size: Optional[int], timeout: float, invariants=None):
    """(obligations, the property's obligation) for one slot count and block size; `invariants`
    overrides the claim's set."""
    core = CORES[claim.policy]
    knobs, params, assume = case_class(claim, n, block_size)
    invs = invariant_set(claim) if invariants is None else invariants
    deadline = clock.now() + timeout
    obligations = [inhabited(core, knobs, params, assume, invs, timeout)]
    obligations += check_obligations(core, knobs, params, assume, invs, max(0.001, clock.until(deadline)))
    left = max(0.001, clock.until(deadline))
    if any(o.status != "proved" for o in obligations):
        prop = Obligation("step", claim.property, "unknown", 0.0,
                          reason="not attempted: an invariant obligation is not proved")
    else:
        prop = property_obligation(core, knobs, params, assume, invs, left, claim.property)
    return obligations, prop


def inhabited(core, knobs, params, assume: list, invs, timeout: float) -> Obligation:
    """The proof is not vacuous: some state of the class satisfies every invariant with the environment
    quiet, a request decoding and another unfinished (a class or invariant that is contradictory would
    make every obligation hold). Proved when such a state exists."""
    pre = fresh_state(core, len(params.slots), "pre")
    conds = [c for c in invs(SYM, knobs, params, pre).values() if c is not True]
    live = [SYM.and_(w["present"], unfinished(SYM, r["phase"])) for w, r in zip(params.slots, pre.req)]
    decoding = [SYM.and_(l, r["phase"] == DECODING) for l, r in zip(live, pre.req)]
    solver = z3.Solver()
    clock.limit(solver, timeout)
    solver.add(*assume, *conds, quiet(SYM, params, pre), SYM.or_(*decoding), SYM.count(live) >= 2)
    t0 = time.monotonic()
    r = solver.check()
    secs = time.monotonic() - t0
    status = "proved" if r == z3.sat else "failed" if r == z3.unsat else "unknown"
    return Obligation("class", "inhabited", status, secs,
                      reason="" if r == z3.sat else "no state of the class satisfies the invariants: vacuous"
                      if r == z3.unsat else solver.reason_unknown())


def decide_induction(claim: Claim, timeout: float, progress: Progress = _quiet) -> Verdict:
    t0 = time.monotonic()
    deadline = clock.now() + timeout
    labelled = []
    worst = "proved"
    failed_line = ""
    for n in claim.slots:
        for b in (claim.block_sizes or (None,)):
            left = clock.until(deadline)
            label = f"n={n}" + (f" block_size={b}" if b is not None else "")
            if left <= 0:
                worst = worst if worst == "failed" else "unknown"
                progress(ProofEvent("skipped", claim, label))
                continue
            obligations, prop = prove(claim, n, b, left)
            for o in obligations + [prop]:
                labelled.append((label, o))
                progress(ProofEvent("obligation", claim, label, o))
                if o.status == "failed" and worst != "failed":
                    worst = "failed"
                    failed_line = f"{label}: {o.action} {o.invariant}"
                elif o.status == "unknown" and worst == "proved":
                    worst = "unknown"
    scope, open_part, cut = max(claim.slots), "", False
    if worst == "proved" and claim.parametric is not None:
        left = clock.until(deadline)
        any_n, open_part = decide_any_n(claim, left, labelled, progress)
        if any_n:
            scope = "any"
    secs = time.monotonic() - t0
    if worst == "proved":
        covers = "for any number of requests" if scope == "any" else f"for up to {scope} requests"
        line = f"proved {covers} (class: {claim.class_text})"
        if open_part:
            line += f"; not for any number of requests: {open_part}"
        status, ok = "proved", claim.expected in (HOLDS, OPEN)
        if claim.expected == OPEN:
            line += " (recorded open: now proved)"
        if not ok:
            line = f"UNEXPECTED: proved {covers}, but expected to fail (class: {claim.class_text})"
        elif claim.any_n and scope != "any":
            ok = False
            # a part cut short by the time-out says nothing either way: unknown (exit 3), not a failure
            cut = next(o.status for label, o in labelled if label == "any n" and o.status != "proved") == "unknown"
            line = (f"unknown for any number of requests, expected ({open_part}); {line}" if cut else
                    f"UNEXPECTED: {line} (expected for any number of requests)")
    elif worst == "failed":
        # a counterexample to induction is not a run: it leaves the claim open, it does not refute it
        status, ok = "failed", claim.expected in (FAILS, OPEN)
        line = (f"not proved, as recorded: counterexample to induction at {failed_line}" if ok else
                f"UNEXPECTED: not proved: counterexample to induction at {failed_line}")
    else:
        status, ok = "unknown", False
        line = "unknown (time-out or solver gave up)"
    return Verdict(claim, status, ok, line, secs, labelled, scope=scope if status == "proved" else None,
                   any_n_open=open_part if status == "proved" else "", any_n_cut=cut)


# the arguments checkers/parametric has: the array model's classes (checkers/parametric/invariants.py CLASSES)
# and the one-request argument, per engine (checkers/parametric/local.py, local_vllm.py, local_sglang.py,
# local_hf.py)
PARAMETRIC = ("c1", "c2", "c3", "local")


def per_block_size(claim: Claim) -> list[tuple[Optional[int], Claim]]:
    """The claim once per block size its one-request argument runs at: each of `block_sizes` where the
    slot proofs cover several (with a symbolic size the pages a request holds would be nonlinear
    arithmetic), else the claim as it is (block size None: the design's)."""
    if len(claim.block_sizes) <= 1:
        return [(None, claim)]
    return [(b, dataclasses.replace(claim, design=dataclasses.replace(claim.design, block_size=b)))
            for b in claim.block_sizes]


def one_request_argument(claim: Claim, knobs, cons: list, timeout: float) -> list[tuple]:
    """The one-request argument of the claim's engine: local_vllm.py for vllm_v1 and local_sglang.py
    for sglang (no progress), local_hf.py for hf_cb (the fatal error), local.py for trtllm_v1 (the
    token budget); each part (action, name, status, seconds, reason)."""
    if claim.policy == "vllm_v1":
        return local_vllm.argument(claim.design, knobs, cons, timeout, claim.invariants, claim.workload)
    if claim.policy == "sglang":
        return local_sglang.argument(claim.design, knobs, cons, timeout, claim.invariants, claim.workload)
    if claim.policy == "hf_cb":
        return local_hf.argument(claim.design, knobs, cons, timeout, claim.invariants, claim.workload,
                                 prop=claim.property)
    return local.argument(claim.design, knobs, cons, timeout)


def decide_any_n(claim: Claim, timeout: float, labelled: list, progress: Progress) -> tuple[bool, str]:
    """The argument for any number of requests (checkers/parametric). "local" (local.py for
    trtllm_v1, local_vllm.py for vllm_v1, local_sglang.py for sglang, local_hf.py for hf_cb): one
    request's step with the others as an environment, with the premises that make it the step of any
    request among any number checked on the core as written (checkers/parametric/sealed.py; once per
    block size where the slot proofs take several). Else the array model: it refines the core for
    n = 1..2 here (1..3 in tests/symbolic/test_parametric.py, 4 in bench/parametric.py; each n costs
    about ten times the last), its invariants imply the claim's slot invariants for n = 1..5, and
    every micro-step keeps them for every n. Each part is reported as an obligation labelled "any n".
    (True, "") only if every part is proved; else (False, the first part not proved and why): the
    claim keeps the scope of its slot proofs."""
    if claim.parametric not in PARAMETRIC:
        return False, ""
    if timeout <= 0:
        o = Obligation("argument", "not started", "unknown", 0.0, reason="time-out")
        labelled.append(("any n", o))
        progress(ProofEvent("obligation", claim, "any n", o))
        return False, "argument not started: unknown (time-out)"
    workload = claim.workload

    def per_index(ops, k, r):
        if claim.per_request is not None:
            return claim.per_request(ops, k, r)
        return workload(ops, k, Params([r])) if workload is not None else []
    if claim.parametric == "local":
        parts, deadline = [], clock.now() + timeout
        for b, one in per_block_size(claim):
            knobs, cons = symbolic_knobs(one.design, claim.knob_bounds)
            label = "" if b is None else f"block_size={b} "
            parts += [(action, label + name, *rest) for action, name, *rest in
                      one_request_argument(one, knobs, cons, max(0.001, clock.until(deadline)))]
    else:
        knobs, cons = symbolic_knobs(claim.design, claim.knob_bounds)
        parts = parametric.argument(knobs, cons, per_index, invariant_set(claim), timeout, refine_up_to=2,
                                    cls=claim.parametric)
    first_open = ""
    for action, name, status, secs, reason in parts:
        o = Obligation(action, name, status, secs, reason=reason)
        labelled.append(("any n", o))
        progress(ProofEvent("obligation", claim, "any n", o))
        if status != "proved" and not first_open:
            first_open = f"{action} {name}: {status}" + (f" ({reason})" if reason else "")
    return not first_open, first_open


def decide_bmc(claim: Claim, timeout: float, progress: Progress = _quiet) -> Verdict:
    t0 = time.monotonic()
    res = bmc.search(CORES[claim.policy], claim.space, claim.max_depth, timeout, [claim.property])
    secs = time.monotonic() - t0
    detail = {"bmc": res.status, "depth": res.depth}
    if res.status == "violated":
        rep = replay(res.cex)
        detail.update(steps=res.cex.steps, replayed=rep.ok, replay=rep.message,
                      config=_cfg_text(res.cex.cfg), workload=_wl_text(res.cex.workload))
        if not rep.ok:
            v = Verdict(claim, "unknown", False, f"UNEXPECTED: the counterexample did not replay: {rep.message}",
                        secs, detail=detail, cex=res.cex)
        elif claim.expected in (FAILS, OPEN):
            how = "as expected" if claim.expected == FAILS else "(recorded open)"
            v = Verdict(claim, "refuted", True,
                        f"refuted {how}: {claim.property} at depth {res.depth}, trace replayed", secs,
                        detail=detail, cex=res.cex)
        else:
            v = Verdict(claim, "refuted", False, f"UNEXPECTED: {claim.property} at depth {res.depth}, trace replayed",
                        secs, detail=detail, cex=res.cex)
        progress(ProofEvent("trace", claim, verdict=v))
        return v
    if res.status == "bounded":
        ok = claim.expected in (HOLDS, OPEN)
        return Verdict(claim, "not-refuted", False if claim.expected == FAILS else ok,
                       ("UNEXPECTED: " if claim.expected == FAILS else "") +
                       f"no {claim.property} up to depth {res.depth}", secs, detail=detail)
    return Verdict(claim, "unknown", False, f"unknown: {res.reason} (searched to depth {res.depth})", secs,
                   detail=detail)


def _cfg_text(cfg) -> str:
    o = cfg.options
    opts = [f"{f.name}={getattr(o, f.name)}" for f in dataclasses.fields(o)
            if getattr(o, f.name) != f.default]
    return (f"block_size={cfg.block_size} num_blocks={cfg.num_blocks} max_num_tokens={cfg.max_num_tokens} "
            f"max_batch_size={cfg.max_batch_size} chunked_prefill={cfg.chunked_prefill} " + " ".join(opts)).strip()


def _wl_text(wl) -> str:
    def one(i, r):
        text = f"r{i} {r.prompt}+{r.max_new} at {r.arrival}"
        if r.prefix_group >= 0:
            text += f" (group {r.prefix_group}, prefix {r.prefix_len})"
        if r.output_len is not None:
            text += f", stops after {r.output_len}"
        if r.cancel_at is not None:
            text += f", cancelled at {r.cancel_at}"
        return text
    return "; ".join(one(i, r) for i, r in enumerate(wl.requests))


def exit_code(verdicts: list[Verdict]) -> int:
    unknown = [v for v in verdicts if v.status == "unknown" or v.any_n_cut]
    if any(not v.as_expected and v not in unknown for v in verdicts):
        return EXIT_UNEXPECTED
    if unknown:
        return EXIT_UNKNOWN
    return EXIT_OK


# A claim decided as expected is checked to carry to the other releases of its policy (proofs/release_carry.py) in a
# tenth of its share, at least CARRY_MIN_S (mostly the terms are the same at every release: no query is needed).
CARRY_SHARE = 0.1
CARRY_MIN_S = 10.0


def decide_claims(claims: list[Claim], timeout: float, progress: Progress = _quiet) -> list[Verdict]:
    """Decide each claim, sharing `timeout` seconds among them: what is left goes to the claims still
    to decide in proportion to their `weight` (about their cost: an even share cut the slowest proofs,
    transformers' at 3 slots and the argument for any number of requests, short under load, and their
    scope would vary between runs). Each claim is decided in a Z3 context of its own (`clock.fresh_context`):
    a claim's verdict then does not depend on the claims decided before it in the process, and its queries
    do not run on the memory the earlier claims' terms left scattered."""
    deadline = clock.now() + timeout
    verdicts = []
    weights = [c.weight for c in claims]
    for i, claim in enumerate(claims):
        left = clock.until(deadline)
        share = left * weights[i] / sum(weights[i:])
        progress(ProofEvent("claim", claim))
        with clock.fresh_context():
            if left <= 0:
                v = Verdict(claim, "unknown", False, "unknown: time-out before it started", 0.0)
            elif claim.method == "induction":
                v = decide_induction(claim, share, progress)
            else:
                v = decide_bmc(claim, share, progress)
            if v.as_expected and len(releases.releases(claim.policy)) > 1:
                carried = carries(claim, max(CARRY_MIN_S, CARRY_SHARE * share))
                v.detail["releases"] = carried.detail(v.scope == "any")
        verdicts.append(v)
        progress(ProofEvent("verdict", claim, verdict=v))
    return verdicts
