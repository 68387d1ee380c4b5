"""Z3 resource units per second of solving on this machine: the rate checkers/budget.py converts its
budgets at (RLIMIT_PER_SECOND), measured on the lemma obligations `check` proves for four bundled
check files capped at 1-3 requests (checkers/bmc.py `prove_lemmas`, whose per-obligation budget is
counted in these units).

    .venv/bin/python bench/rlimit_rate.py

Prints, per file and cap, the queries taking over 0.05 s and their units per second (median, min,
max). Re-run it on a new reference machine and set RLIMIT_PER_SECOND near the medians.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import z3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model.symbolic.cores  # noqa: E402,F401  (registers the cores)
from checkers import bmc  # noqa: E402
from checkers.budget import spent  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402

FILES = ("scenarios/check/trtllm-v2-field-ranges-defaults.toml", "scenarios/check/trtllm-v2-ab-field-ranges.toml",
         "scenarios/check/hf-cb-fatal-ranges.toml", "scenarios/check/vllm-chunked-off-wedge-ranges.toml")
SAMPLES: list[tuple[int, float]] = []
_check = z3.Solver.check


def _timed_check(self, *args):
    before, t0 = spent(self), time.perf_counter()
    result = _check(self, *args)
    SAMPLES.append((spent(self) - before, time.perf_counter() - t0))
    return result


def main() -> None:
    z3.Solver.check = _timed_check
    print("| file | cap | queries > 0.05 s | units/s median | min | max |")
    print("|---|---|---|---|---|---|")
    for path in FILES:
        space = load_check(path).space
        for cap in (1, 2, 3):
            sub = bmc.capped(space, cap)
            SAMPLES.clear()
            bmc.prove_lemmas(CORES[sub.template.policy], sub, time.monotonic() + 300)
            rates = [units / secs for units, secs in SAMPLES if secs > 0.05]
            if rates:
                print(f"| {Path(path).name} | {cap} | {len(rates)} | {statistics.median(rates):,.0f} | "
                      f"{min(rates):,.0f} | {max(rates):,.0f} |")
            else:
                print(f"| {Path(path).name} | {cap} | 0 | - | - | - |")


if __name__ == "__main__":
    main()
