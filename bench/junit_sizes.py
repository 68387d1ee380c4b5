"""One run of the test command, from its reports/junit.xml: the tests' sizes by time (how many tests, how many
seconds of a worker, what share of the sum) and the slowest N, as the tables of docs/benchmarks.md, "The test
command's durations".

    .venv/bin/python bench/junit_sizes.py reports/junit.xml --slowest 20
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET

BUCKETS = ((0, 1, "under 1 s"), (1, 5, "1-5 s"), (5, 15, "5-15 s"), (15, 40, "15-40 s"),
           (40, float("inf"), "40 s and over"))


def times(path: str) -> list[tuple[float, str]]:
    """(seconds, node id) of every test case in a junit file, slowest first."""
    out = []
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        out.append((float(case.get("time", 0.0)), f"{module}.py::{case.get('name')}"))
    return sorted(out, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", help="a reports/junit.xml of the test command")
    parser.add_argument("--slowest", type=int, default=20, help="how many of the slowest tests to list")
    args = parser.parse_args()
    rows = times(args.junit)
    total = sum(s for s, _ in rows)
    print(f"{len(rows)} tests, {total:,.0f} s of a worker in all\n")
    print("| a test's time | tests | s of a worker | share |\n|---|---|---|---|")
    for lo, hi, name in BUCKETS:
        inside = [s for s, _ in rows if lo <= s < hi]
        print(f"| {name} | {len(inside):,} | {sum(inside):,.0f} | {sum(inside) / total:.0%} |")
    print("\n| s | test |\n|---|---|")
    for seconds, test in rows[:args.slowest]:
        print(f"| {seconds:.0f} | `{test}` |")


if __name__ == "__main__":
    main()
