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
first row.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, default=2_000_000, help="how many terms the history makes and frees")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    print("| run | search s | verdict | ratio to the first |\n|---|---|---|---|")
    first = None
    for label, where, fresh in RUNS:
        with context.Pool(1) as pool:
            seconds, verdict = pool.apply(_search, (args.terms, where, fresh))
        first = first or seconds
        print(f"| {label.format(n=args.terms)} | {seconds:.1f} | {verdict} | {seconds / first:.2f} |", flush=True)


if __name__ == "__main__":
    main()
