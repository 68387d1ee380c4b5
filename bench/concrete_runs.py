"""The symbolic cores run on numbers: the differential tests' cost (tests/symbolic/test_core_differential.py runs
every policy's random cases through its core with `Concrete` ops beside the simulator), timed for two checkouts
side by side, as ratios.

    .venv/bin/python bench/concrete_runs.py --tree before=/path/to/old/checkout --tree after=. [--cases 50]
        [--scenario scenarios/trtllm-v2-chunked-prefill.toml ...]

Each side is a fresh interpreter in that tree running the same cases (`checkers.differential.diverges`, every
`--step`-th seed of the policy's cases up to `--cases` of them, and each `--scenario` whole, as
test_scenario_is_in_the_core_and_agrees runs it); the sides alternate over `--repeats` rounds so drift on the
machine hits both alike, and the median per row is reported with each side's ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("trtllm_v2", "trtllm_v1", "vllm_v1", "sglang", "hf_cb")

# run inside the tree being timed: its own model/, checkers/ and tests/symbolic/cases
PRELUDE = """
import json, sys, time
sys.path[:0] = ['.', 'tests', 'tests/symbolic']
import model.policies, model.symbolic.cores
from checkers.differential import diverges
"""

CHILD = PRELUDE + """
from cases import CASES
policy, count, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cases = CASES[policy]
start = time.perf_counter()
for seed in range(0, count * step, step):
    cfg, workload = cases.random_case(seed)
    assert diverges(cfg, workload, max_steps=cases.MAX_STEPS) is None, (policy, seed)
print(json.dumps(time.perf_counter() - start))
"""

SCENARIO_CHILD = PRELUDE + """
from schedproof.scenario import load
sc = load(sys.argv[1])
start = time.perf_counter()
assert diverges(sc.cfg, sc.workload, max_steps=20_000) is None, sys.argv[1]
print(json.dumps(time.perf_counter() - start))
"""


def time_side(tree: Path, row: str, count: int, step: int) -> float:
    """One row (a policy's random cases, or a scenario file) in a fresh interpreter in `tree`."""
    argv = [SCENARIO_CHILD, str(ROOT / row)] if row.endswith(".toml") else [CHILD, row, str(count), str(step)]
    out = subprocess.run([sys.executable, "-c", *argv], cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout (at least one)")
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--step", type=int, default=6, help="every STEP-th seed (the cases' first half is each "
                                                         "policy's plain designs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", action="append", choices=POLICIES, help="default: every policy")
    ap.add_argument("--scenario", action="append", default=[], help="a scenario file to run whole, relative to the "
                                                                    "repository root (the same file on every side)")
    args = ap.parse_args()
    sides = [(name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.tree)]
    rows = list(args.policy or POLICIES) + args.scenario
    times = {(name, p): [] for name, _ in sides for p in rows}
    for _ in range(args.repeats):
        for p in rows:
            for name, tree in sides:
                times[name, p].append(time_side(tree, p, args.cases, args.step))
    header = ["policy or scenario"] + [f"{name} s" for name, _ in sides] + [f"{name}/{sides[0][0]}" for name, _ in sides[1:]]
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for p in rows:
        med = [statistics.median(times[name, p]) for name, _ in sides]
        cells = [p] + [f"{m:.2f}" for m in med] + [f"{m / med[0]:.2f}" for m in med[1:]]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
