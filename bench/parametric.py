"""Times of the argument for any number of requests (checkers/parametric), for each claim that has
one (proofs/claims.py `parametric`): for the trtllm_v2 claims (C1, C0 with B*, C2, C3) each
micro-step obligation (every n) and the lifting check per n; for trtllm_v1's token-budget claims,
vLLM V1's no-progress claims (prefix caching on and off), SGLang's no-progress claims and
transformers' fatal-error claims ("local") each part of the one-request argument (refinement n = 1..3
included; once per page size where the claim has several); then, for the C1
design, the refinement check per n (one pass of micro-steps == Core.step), and the bounded search's
traces of the refuted trtllm_v2 claims replayed in the array model. Prints one line per part;
docs/symbolic.md quotes it.

    .venv/bin/python bench/parametric.py [--refine-up-to 4] [--no-traces] [--claim NAME]
"""

from __future__ import annotations

import argparse
import time

import z3

from checkers.induction import symbolic_knobs
from checkers.parametric import Setup, lifting, prove_all_n, refinement, replay_counterexample
from model.symbolic.slots import Params
from proofs import claims as C
from proofs import run as R


def per_request(claim):
    if claim.per_request is not None:
        return claim.per_request
    return lambda ops, k, r: claim.workload(ops, k, Params([r]))


def local_rows(claim) -> None:
    """The one-request argument, once per block size where the claim has several (as `prove` runs it)."""
    for b, one in R.per_block_size(claim):
        name = claim.name if b is None else f"{claim.name} page {b}"
        k, cons = symbolic_knobs(one.design, claim.knob_bounds)
        t0 = time.monotonic()
        parts = R.one_request_argument(one, k, cons, 600)
        for action, part, status, secs, _ in parts:
            print(f"{name:34s} {action:8s} {part:44s} {status:8s} {secs:7.2f} s")
        slowest = max(parts, key=lambda p: p[3])
        print(f"{name:34s} all      {time.monotonic() - t0:7.2f} s wall "
              f"({sum(p[2] == 'proved' for p in parts)}/{len(parts)} proved; slowest {slowest[0]} {slowest[1]} "
              f"{slowest[3]:.2f} s)")


def argument_rows(claim) -> None:
    if claim.parametric == "local":
        return local_rows(claim)
    k, cons = symbolic_knobs(claim.design, claim.knob_bounds)
    cls = per_request(claim)
    t0 = time.monotonic()
    results = prove_all_n(Setup(k, cons, cls, cls=claim.parametric), 600)
    for r in results:
        print(f"{claim.name:24s} any-n    {r.step:10s} {r.status:8s} {r.seconds:7.2f} s")
    slowest = max(results, key=lambda r: r.seconds)
    print(f"{claim.name:24s} any-n    all        {time.monotonic() - t0:7.2f} s wall "
          f"({sum(r.status == 'proved' for r in results)}/{len(results)} proved; slowest {slowest.step} "
          f"{slowest.seconds:.2f} s)")
    for n in range(1, 6):
        r = lifting(k, n, R.invariant_set(claim), cls, cls=claim.parametric)
        print(f"{claim.name:24s} lifts    n={n:<8d} {r.status:8s} {r.seconds:7.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--refine-up-to", type=int, default=3)
    ap.add_argument("--no-traces", action="store_true")
    ap.add_argument("--claim", help="only this claim's argument (default: every claim with one)")
    ap.add_argument("--arith2", action="store_true", help="smt.arith.solver=2 for the refinement")
    args = ap.parse_args()
    for claim in C.CLAIMS:
        if claim.parametric is not None and args.claim in (None, claim.name):
            argument_rows(claim)
    ab = next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing")
    k, _ = symbolic_knobs(ab.design, ab.knob_bounds)
    if args.arith2:
        z3.set_param("smt.arith.solver", 2)
    for n in range(1, args.refine_up_to + 1):
        r = refinement(k, n, 3600)
        print(f"refines  n={n:<8d} {r.status:8s} {r.seconds:7.2f} s {r.detail}")
    if args.no_traces:
        return
    for c in C.CLAIMS:
        if c.policy != "trtllm_v2" or c.method != "bmc":
            continue
        v = R.decide_bmc(c, 600)
        t1 = time.monotonic()
        ok, msg = replay_counterexample(v.cex) if v.cex is not None else (False, v.line)
        print(f"replays  {c.name:34s} {'ok' if ok else 'FAILED':6s} {time.monotonic() - t1:6.1f} s  {msg}")


if __name__ == "__main__":
    main()
