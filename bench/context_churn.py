"""What a Z3 context's history costs a search, and what a fresh context gives back: the bounded search of the
claim v1-budget-reuse-trim-floor (the search of tests/symbolic/test_core_trtllm_v1.py's trim-floor test), each run
in a fresh process, one after the other:

- fresh: nothing before it;
- after N terms made and freed in the main context (a test worker's history: hundreds of tests' terms);
- after as many made and freed in a context of their own (the same Python and malloc history, another Z3 context);
- after N terms made and freed in the main context, the search inside `checkers.clock.fresh_context` (what
  tests/conftest.py gives every test, and `proofs.run.decide_claims` every claim).

    .venv/bin/python bench/context_churn.py --terms 2000000

Prints a row per run: seconds of the search, its verdict and depth (the same in every row), and the ratio to the
first row. Then, with `--claims FIRST OTHER`, a second table: in one fresh process, claim FIRST decided by
`proofs.run.decide_claims`, then OTHER, then FIRST again, with each claim in a fresh context and with
`fresh_context` made a no-op (the code before 5258087): the verdict of each decision of FIRST, the clock seconds it
took (Z3's work, the same for the same queries) and its wall seconds.

    .venv/bin/python bench/context_churn.py --claims vllm-chunked-fits-alone v2-original
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUNS = (("fresh", None, False), ("after {n:,} terms made and freed in the main context", "main", False),
        ("after {n:,} terms made and freed in a context of their own", "own", False),
        ("after {n:,} terms made and freed in the main context, the search in a fresh context", "main", True))


def _churn(terms: int, ctx) -> None:
    """`terms` terms (half constants, half sums) made, then freed, in `ctx` (None: the main context)."""
    import z3
    xs = [z3.Int(f"x{i}", ctx) for i in range(terms // 2)]
    sums = [x + i for i, x in enumerate(xs)]
    del xs, sums


def _search(terms: int, where, fresh: bool) -> tuple[float, str]:
    import z3

    import model.symbolic.cores  # noqa: F401  (registers the cores)
    from checkers import bmc, clock
    from model.symbolic.core import CORES
    from proofs.claims import CLAIMS

    if where == "main":
        _churn(terms, None)
    elif where == "own":
        _churn(terms, z3.Context())
    claim = next(c for c in CLAIMS if c.name == "v1-budget-reuse-trim-floor")
    start = time.monotonic()
    if fresh:
        with clock.fresh_context():
            result = bmc.search(CORES["trtllm_v1"], claim.space, claim.max_depth, timeout=900, properties=["SAFE-BUDGET"])
    else:
        result = bmc.search(CORES["trtllm_v1"], claim.space, claim.max_depth, timeout=900, properties=["SAFE-BUDGET"])
    return time.monotonic() - start, f"{result.status} at depth {result.depth}"


def _claim_twice(first: str, other: str, fresh: bool, budget: float) -> list[tuple[str, float, float]]:
    import contextlib

    from checkers import clock
    from proofs import run
    from proofs.claims import CLAIMS

    if not fresh:
        run.clock.fresh_context = contextlib.nullcontext     # this process only
    claims = {c.name: c for c in CLAIMS}
    out = []
    for name in (first, other, first):
        start, wall = clock.now(), time.monotonic()
        [v] = run.decide_claims([claims[name]], budget)
        out.append((v.line, clock.now() - start, time.monotonic() - wall))
    return [out[0], out[2]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, default=2_000_000, help="how many terms the history makes and frees")
    parser.add_argument("--claims", nargs=2, metavar=("FIRST", "OTHER"), help="the claims' table instead")
    parser.add_argument("--budget", type=float, default=120.0, help="each claim's budget (clock seconds)")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    if args.claims:
        print("| contexts | decision of the first | verdict | clock s | wall s |\n|---|---|---|---|---|")
        for fresh in (True, False):
            with context.Pool(1) as pool:
                rows = pool.apply(_claim_twice, (*args.claims, fresh, args.budget))
            for label, (line, work, wall) in zip(("first in the process", f"after {args.claims[1]}"), rows):
                print(f"| {'one per claim' if fresh else 'the main one'} | {label} | {line} | {work:.3f} | {wall:.1f} |",
                      flush=True)
        return
    print("| run | search s | verdict | ratio to the first |\n|---|---|---|---|")
    first = None
    for label, where, fresh in RUNS:
        with context.Pool(1) as pool:
            seconds, verdict = pool.apply(_search, (args.terms, where, fresh))
        first = first or seconds
        print(f"| {label.format(n=args.terms)} | {seconds:.1f} | {verdict} | {seconds / first:.2f} |", flush=True)


if __name__ == "__main__":
    main()
