"""Where a test's CPU goes, from py-spy's raw samples: in Z3's search (a sample under `Z3_solver_check` or
`Z3_solver_check_assumptions`), in z3py's wrappers building terms, or elsewhere (the encodings, the simulator,
pytest). Answers whether a slow solver test would get faster from less Python or only from less solving
(docs/benchmarks.md, "Where the test command's time goes").

    py-spy record --subprocesses -r 50 -f raw -o /tmp/review.raw -- .venv/bin/python -m pytest -q \\
        "tests/symbolic/test_review.py::test_a_bug_planted_in_the_core_makes_the_proved_file_fail_to_prove"
    .venv/bin/python bench/pyspy_split.py /tmp/review.raw

py-spy (`pip install py-spy`) is not one of the project's dependencies.
"""

from __future__ import annotations

import argparse
from collections import Counter

SEARCH = ("Z3_solver_check ", "Z3_solver_check_assumptions ")


def split(path: str) -> tuple[int, Counter]:
    """(samples, samples per part) of a py-spy raw file: one `frame;frame;... count` line per stack."""
    parts: Counter = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames, n = stack.split(";"), int(count)
            total += n
            if any(f.startswith(SEARCH) for f in frames):
                parts["Z3's search"] += n
            elif "z3/z3" in frames[-1]:
                parts["z3py's wrappers"] += n
            else:
                parts["elsewhere"] += n
    return total, parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="py-spy record's output with -f raw")
    args = parser.parse_args()
    total, parts = split(args.raw)
    print(f"{total:,} samples")
    for part in ("Z3's search", "z3py's wrappers", "elsewhere"):
        print(f"{parts[part] / total:6.1%}  {part}")


if __name__ == "__main__":
    main()
