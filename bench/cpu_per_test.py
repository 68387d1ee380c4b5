"""How much of each test's time is CPU: a pytest plugin that records every test's wall time and the CPU its
worker spent on it (its own and its reaped children's), and a summary of what the workers recorded: where
the test command waits (a Ray head starting, a subprocess's time-out) rather than computes, the time that
more parallelism or shorter waits could win back (docs/benchmarks.md, "Where the test command's time goes").

    rm -f /tmp/cpu_per_test.*.tsv
    PYTHONPATH=bench .venv/bin/python -m pytest -n 2 -q -p cpu_per_test
    .venv/bin/python bench/cpu_per_test.py /tmp/cpu_per_test.*.tsv --top 10

A test whose wall time exceeds its CPU either waits or shares a core with more processes than there are
cores (another worker's test that spins two processes of its own, tests/symbolic/test_determinism.py): the
summary calls both "not on a core"; a child still running when its test ends is not counted.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import pytest

# where each worker writes its records (a folder of the reader's choosing: CPU_PER_TEST_DIR)
RECORD = "cpu_per_test.{pid}.tsv"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, (own0, children0) = time.monotonic(), _cpu()
    yield
    wall, (own1, children1) = time.monotonic() - t0, _cpu()
    folder = os.environ.get("CPU_PER_TEST_DIR", "/tmp")
    with open(os.path.join(folder, RECORD.format(pid=os.getpid())), "a") as out:
        out.write(f"{item.nodeid}\t{wall:.2f}\t{own1 - own0:.2f}\t{children1 - children0:.2f}\n")


def rows(paths: list[str]) -> list[tuple[str, float, float, float]]:
    """(node id, wall, own CPU, children's CPU) of every recorded test."""
    out = []
    for path in paths:
        with open(path) as f:
            for line in f:
                node, wall, own, children = line.rstrip("\n").split("\t")
                out.append((node, float(wall), float(own), float(children)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", help="the workers' cpu_per_test.PID.tsv files (in /tmp by default)")
    parser.add_argument("--top", type=int, default=10, help="how many of the tests longest off a core to list")
    args = parser.parse_args()
    recorded = rows(args.records)
    wall = sum(r[1] for r in recorded)
    cpu = sum(r[2] + r[3] for r in recorded)
    off = sorted(((w - own - children, node, w) for node, w, own, children in recorded), reverse=True)
    off_total = sum(o for o, _, _ in off if o > 0)
    print(f"{len(recorded)} tests: {wall:,.0f} s of a worker, {cpu:,.0f} s of CPU ({cpu / wall:.0%}), "
          f"{off_total:,.0f} s not on a core ({off_total / wall:.0%})\n")
    print("| s not on a core | s in all | test |\n|---|---|---|")
    for seconds, node, w in off[:args.top]:
        print(f"| {seconds:.0f} | {w:.0f} | `{node}` |")


if __name__ == "__main__":
    main()
