"""Two runs of the test command side by side, from their reports/junit.xml: each test's time before and after, in
three groups, with the sum and the median ratio of each. A change that works inside a test worker shows in the
second and third groups only; the first, the tests that decide in a fresh process (their body calls
tests/helpers.py `in_a_fresh_process`, found in the source), is out of its reach, so its ratio is the machine's.

    .venv/bin/python bench/junit_compare.py BEFORE/reports/junit.xml AFTER/reports/junit.xml [--min-seconds 2]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def times(junit: str) -> dict[str, float]:
    """Each test's call time, by `module::name` (the parametrisation kept)."""
    root = ET.parse(junit).getroot()
    return {f"{tc.get('classname')}::{tc.get('name')}": float(tc.get("time", 0)) for tc in root.iter("testcase")}


def in_a_fresh_process() -> set[tuple[str, str]]:
    """(module, test function) of every test whose body calls `in_a_fresh_process`."""
    out = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    isinstance(call, ast.Call) and getattr(call.func, "id", None) == "in_a_fresh_process"
                    for call in ast.walk(node)):
                out.add((module, node.name))
    return out


def group(test: str, fresh: set[tuple[str, str]]) -> str:
    module, name = test.split("::", 1)
    if (module, name.split("[")[0]) in fresh:
        return "deciding in a fresh process"
    return "other solver tests (tests/symbolic/)" if module.startswith("tests.symbolic.") else "the rest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="tests shorter than this before are left out")
    args = parser.parse_args()
    before, after, fresh = times(args.before), times(args.after), in_a_fresh_process()
    rows: dict[str, list[tuple[float, float]]] = {}
    for test, t in before.items():
        if test in after and t >= args.min_seconds:
            rows.setdefault(group(test, fresh), []).append((t, after[test]))
    print(f"junit sums: {sum(before.values()):,.0f} s before, {sum(after.values()):,.0f} s after")
    print("| tests of at least %g s before | tests | s before | s after | ratio of the sums | median ratio |" % args.min_seconds)
    print("|---|---|---|---|---|---|")
    for name in ("deciding in a fresh process", "other solver tests (tests/symbolic/)", "the rest"):
        pairs = rows.get(name, [])
        if pairs:
            b, a = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            print(f"| {name} | {len(pairs)} | {b:,.0f} | {a:,.0f} | {a / b:.2f} | "
                  f"{statistics.median(p[1] / p[0] for p in pairs):.2f} |")


if __name__ == "__main__":
    main()
