"""Times of the argument for any number of requests (checkers/parametric, claim v2-ab-outgrowing):
the refinement check per n (one pass of micro-steps == Core.step), the lifting check per n, each
micro-step obligation (every n), and the bounded search's traces of the refuted trtllm_v2 claims
replayed in the array model. Prints one line per part; docs/symbolic.md quotes it.

    .venv/bin/python bench/parametric.py [--refine-up-to 4] [--no-traces]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--refine-up-to", type=int, default=3)
    ap.add_argument("--no-traces", action="store_true")
    ap.add_argument("--arith2", action="store_true", help="smt.arith.solver=2 for the refinement")
    args = ap.parse_args()
    ab = next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing")
    k, cons = symbolic_knobs(ab.design, ab.knob_bounds)
    cls = lambda ops, k, r: ab.workload(ops, k, Params([r]))   # noqa: E731
    t0 = time.monotonic()
    for r in prove_all_n(Setup(k, cons, cls), 600):
        print(f"any-n    {r.step:10s} {r.status:8s} {r.seconds:7.2f} s")
    print(f"any-n    all        {time.monotonic() - t0:7.2f} s wall")
    for n in range(1, 6):
        r = lifting(k, n, R.invariant_set(ab), cls)
        print(f"lifts    n={n:<8d} {r.status:8s} {r.seconds:7.2f} s")
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
