"""How much slower the suite's slowest tests are in the suite than alone: each test's call time in a clean clone's
run of the README test command (its reports/junit.xml) beside the same test run alone, in a fresh pytest process,
one after the other on an otherwise idle machine.

    .venv/bin/python bench/alone_vs_suite.py --junit /path/to/clean/clone/reports/junit.xml [--min-seconds 15]

A test much slower in the suite than alone has a worker's history or the other worker's multi-core tests to blame
(docs/benchmarks.md, "What makes a test slower in the suite"); a fresh process (tests/helpers.py
in_a_fresh_process) cures the first. Tests that already decide in a fresh process, the real engines' tests, and
the tests that start processes of their own (determinism, parallel prove, Ray) are left out: their time is not a
worker's history.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# left out: real engines, tests that start processes of their own, and the decisions already in a fresh process
SKIP = ("test_fuzz_transformers", "test_target_", "test_cli_fuzz", "test_determinism", "test_prove_parallel",
        "test_fuzz_ray", "test_check_scenarios", "loses_the_scope", "cut_short", "planted_in_the_core_makes")


def call_times(junit: Path) -> list[tuple[float, str]]:
    """(seconds, test id) of every test in a junit report, slowest first."""
    rows = []
    for case in ET.parse(junit).iter("testcase"):
        path = case.get("classname").replace(".", "/") + ".py"
        rows.append((float(case.get("time")), f"{path}::{case.get('name')}"))
    return sorted(rows, reverse=True)


def alone(test_id: str) -> float:
    """The test's time alone: one pytest process for it, its call time from its own junit report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        f"--junitxml={report}", test_id], cwd=ROOT, capture_output=True, text=True)
        return sum(float(c.get("time")) for c in ET.parse(report).iter("testcase"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", type=Path, required=True, help="a clean clone's reports/junit.xml")
    ap.add_argument("--min-seconds", type=float, default=15.0, help="the suite's tests at least this slow")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    print("| in the suite s | alone s | ratio | test |\n|---|---|---|---|", flush=True)
    for suite, test_id in call_times(args.junit):
        if suite < args.min_seconds:
            break
        if any(s in test_id for s in SKIP):
            continue
        by_itself = alone(test_id)
        rows.append({"test": test_id, "suite": suite, "alone": by_itself})
        print(f"| {suite:.1f} | {by_itself:.1f} | {suite / by_itself:.2f} | {test_id} |", flush=True)
    total_suite, total_alone = sum(r["suite"] for r in rows), sum(r["alone"] for r in rows)
    print(f"| {total_suite:.1f} | {total_alone:.1f} | {total_suite / total_alone:.2f} | all {len(rows)} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
