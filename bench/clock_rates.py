"""Z3 resource units per second, by kind of query, over whole `check` runs: the rates checkers/clock.py converts
the solver's work at (OBLIGATION_RATE for the one-step validity queries, UNROLLING_RATE for the bounded search's
queries over an unrolling).

    .venv/bin/python bench/clock_rates.py [--budget 60] [FILE ...]

For each file (default: four bundled check files of three engines), `check` runs with the budget, every solver
query timed; the table gives, per function that asks (bmc._check: the unrolling; induction.run: lemmas and
inference; accel._decide: acceleration), the queries, their units, their wall-clock seconds and the rate. Re-run
it on a new reference machine and set the clock's rates near what it prints; the verdicts do not depend on the
rates, only how long a budget takes.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import z3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkers.budget import spent  # noqa: E402
from schedproof.check import run_check  # noqa: E402

FILES = ("scenarios/check/trtllm-v2-field-ranges-defaults.toml", "scenarios/check/vllm-chunked-off-wedge-ranges.toml",
         "scenarios/check/hf-cb-fatal-ranges.toml", "scenarios/check/sglang-page-rounding-ranges.toml")
_check = z3.Solver.check


def measure(path: str, budget: float) -> tuple[str, dict]:
    """(the verdict, {asking function: [queries, units, seconds]}) of one `check` run."""
    asked: dict[str, list] = collections.defaultdict(lambda: [0, 0, 0.0])

    def timed(self, *args):
        before, t0 = spent(self), time.perf_counter()
        result = _check(self, *args)
        caller = sys._getframe(1)
        row = asked[f"{Path(caller.f_code.co_filename).stem}.{caller.f_code.co_name}"]
        row[0] += 1
        row[1] += spent(self) - before
        row[2] += time.perf_counter() - t0
        return result

    z3.Solver.check = timed
    try:
        code, _ = run_check(path, budget, None, None, True, True, lambda line: None)
    finally:
        z3.Solver.check = _check
    return {0: "ok", 1: "violated", 3: "unknown"}.get(code, str(code)), asked


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", default=list(FILES))
    ap.add_argument("--budget", type=float, default=60.0)
    args = ap.parse_args(argv)
    print("| file | verdict | asked by | queries | units | wall s | units/s |")
    print("|---|---|---|---|---|---|---|")
    for path in args.files:
        verdict, asked = measure(path, args.budget)
        for name, (n, units, seconds) in sorted(asked.items(), key=lambda kv: -kv[1][2]):
            if seconds < 0.5:
                continue
            print(f"| {Path(path).name} | {verdict} | {name} | {n} | {units:,} | {seconds:.1f} | "
                  f"{units / seconds:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
