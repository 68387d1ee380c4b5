"""A sweep with the boundary from the grid against one with the boundary from the solver, side by side in
one run (docs/benchmarks.md, docs/sweep.md).

    .venv/bin/python bench/sweep_solver.py [--workers 2] [--timeout 120] [--steps 4,1]

The design is scenarios/check/trtllm-v2-replay-budget-sweep.toml over pool x token budget
(num_blocks 8..12 step 2 x max_num_tokens 8..32, at each step of --steps: 21 points at step 4, 75 at
step 1). "grid" judges every point by `check`; "solver" first finds each row's threshold by queries over
intervals and judges only the points its queries do not cover. Printed per step: wall seconds, the
checks each ran (points run + queries), the ratio, and whether the two modes give every grid point the
same safe/unsafe verdict (they must: a point the solver covers is one the grid finds safe); then both
boundaries at the finest step.
"""

from __future__ import annotations

import argparse
import time

from schedproof import sweep, sweepsolver

DESIGN = "scenarios/check/trtllm-v2-replay-budget-sweep.toml"
POOLS = "num_blocks=8..12:2"
BUDGETS = "max_num_tokens=8..32"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--steps", default="4,1")
    args = parser.parse_args()
    print(f"{DESIGN}, {args.workers} workers, --timeout {args.timeout:g}")
    print("| grid | mode | seconds | points run | solver queries | ratio of seconds to the grid's |")
    print("|---|---|---|---|---|---|")
    for step in (int(s) for s in args.steps.split(",")):
        grid, solver, rows, box, varies = compare(step, args.workers, args.timeout)
    print("grid boundary (finest step):", *sweep.boundary(varies, grid), sep="\n  ")
    print("solver boundary:", *[r.sentence(varies) for r in rows], sep="\n  ")
    if box is not None:
        print(" ", sweepsolver.box_sentence(varies, box))


def compare(step: int, workers: int, timeout: float):
    raw, varies = sweep.plan(DESIGN, [POOLS, f"{BUDGETS}:{step}"])
    start = time.perf_counter()
    grid = sweep.sweep(DESIGN, raw, varies, workers, timeout)
    grid_seconds = time.perf_counter() - start

    start = time.perf_counter()
    rows = sweepsolver.boundaries(DESIGN, raw, varies, timeout, workers)
    box = sweepsolver.box_boundary(DESIGN, raw, varies, rows, timeout)
    covered = sweepsolver.covered_points(varies, rows)
    solver = sweep.sweep(DESIGN, raw, varies, workers, timeout, covered=covered)
    solver_seconds = time.perf_counter() - start

    queries = sum(len(r.queries) for r in rows) + (box is not None)
    n = len(grid)
    grid_of = f"{len(varies[0].values)} x {len(varies[1].values)} (step {step})"
    print(f"| {grid_of} | grid | {grid_seconds:.1f} | {n} | 0 | 1.00 |")
    print(f"| {grid_of} | solver | {solver_seconds:.1f} | {n - len(covered)} | {queries} | "
          f"{solver_seconds / grid_seconds:.2f} |")
    if any(g.safe != s.safe for g, s in zip(grid, solver)):
        raise SystemExit(f"step {step}: the two modes disagree at a grid point")
    return grid, solver, rows, box, varies


if __name__ == "__main__":
    main()
