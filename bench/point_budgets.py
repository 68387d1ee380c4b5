"""The ci budgets of test_check_scenarios.py, measured: a scenario's point search (the test's own
`helpers.point_search`, each budget in a fresh process as the test runs it) at several budgets, one after the
other, with its verdict and wall time. A point design whose violation is shallow is found as soon as the search
unrolls, so a smaller budget mostly cuts the lemmas proved before it (up to half the budget): the ci size is the
smallest measured budget with the nightly's verdict, and the nightly keeps the default.

    .venv/bin/python bench/point_budgets.py vllm-chunked-off-head-of-line 3 30 10 5

The depth is the test's: one transition past the simulator's run (`n + 1`) or the ci depth of its SIZES.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "symbolic"), str(ROOT / "tests")]

from helpers import in_a_fresh_process, point_search  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="a scenario's name (scenarios/NAME.toml)")
    parser.add_argument("depth", type=int)
    parser.add_argument("budgets", type=float, nargs="+", help="seconds on checkers/clock.py's clock")
    args = parser.parse_args()
    path = str(ROOT / "scenarios" / f"{args.scenario}.toml")
    print("| budget s | status | depth | property | replays | wall s |\n|---|---|---|---|---|---|")
    for budget in args.budgets:
        start = time.monotonic()
        status, _, reached, prop, replays = in_a_fresh_process(point_search, path, args.depth, budget)
        print(f"| {budget:g} | {status} | {reached} | {prop or '-'} | {'-' if replays is None else replays} "
              f"| {time.monotonic() - start:.1f} |", flush=True)


if __name__ == "__main__":
    main()
