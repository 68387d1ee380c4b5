"""Where a `check` search spends its time: each turn of the units sharing it, one line per turn.

    .venv/bin/python bench/search_turns.py FILE [--timeout S] [--min-seconds S]

Runs the search of `check` over FILE's space (`bmc.Searching`, the file's properties and depth, no claims or
inference) and prints, as they happen, each unit's opening (seconds, solver work, whether acceleration was
proved, the lemmas kept and dropped) and each depth query that took at least --min-seconds (the unit's slot
count, the depth, the slice of work it was given, seconds, work used, the outcome), then the result and how far
each unit got. Work is in the "seconds of the reference machine" of checkers/budget.py, read from Z3's shared
counter across the turn. This is the log docs/benchmarks.md quotes for the openings' cost on the A+B 1-12 file
("Larger units opened once the smaller ones have had their time").
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import z3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model.symbolic.cores  # noqa: E402,F401  (registers every core)
from checkers import bmc  # noqa: E402
from checkers.budget import RLIMIT_PER_SECOND, spent  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402


def work_now() -> float:
    """Z3's context-wide work counter, in reference seconds (a new solver reads the shared counter)."""
    return spent(z3.Solver()) / RLIMIT_PER_SECOND


@contextlib.contextmanager
def logged(t0: float, min_seconds: float):
    """While it lasts, the search's opening and deepening print a line per turn."""
    open_unit, deeper = bmc._Search.open, bmc._Deepening.deeper

    def open_logged(self, unit):
        start, w = time.monotonic(), work_now()
        open_unit(self, unit)
        lemmas = unit.lemmas
        print(f"{start - t0:7.1f} s  open   {unit.space.slots:2d} slots  took {time.monotonic() - start:6.1f} s  "
              f"work {work_now() - w:7.1f}  accelerated {unit.accelerated}  lemmas {len(lemmas.names)}"
              f"{'  dropped ' + ', '.join(lemmas.dropped[:3]) + (' ...' if len(lemmas.dropped) > 3 else '') if lemmas.dropped else ''}",
              flush=True)

    def deeper_logged(self, deadline, start, work=None):
        begin, w = time.monotonic(), work_now()
        result = deeper(self, deadline, start, work)
        took = time.monotonic() - begin
        if took >= min_seconds:
            outcome = "clear" if result is None else result.status
            print(f"{begin - t0:7.1f} s  depth  {self.space.slots:2d} slots  d={len(self.u.transitions):<3d} "
                  f"slice {work or 0:7.0f}  took {took:6.1f} s  work {work_now() - w:7.1f}  {outcome}", flush=True)
        return result

    bmc._Search.open, bmc._Deepening.deeper = open_logged, deeper_logged
    try:
        yield
    finally:
        bmc._Search.open, bmc._Deepening.deeper = open_unit, deeper


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--min-seconds", type=float, default=1.0, help="print depth queries at least this long")
    args = parser.parse_args(argv)
    spec = load_check(args.file)
    core = CORES[spec.space.template.policy]
    searching = bmc.Searching(core, spec.space, spec.max_depth, list(spec.properties) if spec.properties else None)
    with logged(searching.start, args.min_seconds):
        result = searching.run(searching.start + args.timeout)
    found = f", found at {result.found_seconds:.0f} s" if result.status == "violated" else ""
    print(f"{result.status} at depth {result.depth}{found}, {result.seconds:.0f} s in all")
    for scope, slots, depth in result.reached:
        print(f"  {slots:2d} slots ({scope}): clear to depth {depth}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
