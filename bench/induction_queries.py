"""The queries of one inductive-invariant proof, each timed with the work Z3 counted for it: the proof of
tests/symbolic/test_core_hf_cb.py `test_invariants_inductive_two_slots` (the hf_cb core's invariants over two
slots, every numeric knob a range, the obligations batched per action as `check` batches them).

    .venv/bin/python bench/induction_queries.py [--structure 0|3] [--budget 300] [--param smt.relevancy=0 ...]

Run it with each Z3 release's interpreter (docs/benchmarks.md, "Z3 4.15.4 against 5.4.0"): on 5.4.0 the step's
batched query of structure 0 ran past its rlimit's worth of time, which is why the pin stayed 4.15.4. `--param`
sets a global Z3 parameter before anything is built, to try one on that query. Under a wall-clock `timeout`
(coreutils), a query that never returns shows as the last line printed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import z3

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "symbolic")]

import model.policies  # noqa: E402,F401
import model.symbolic.cores  # noqa: E402,F401  (registers the cores)
from cases import hf_cb as cases  # noqa: E402
from checkers.budget import spent  # noqa: E402
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402

_check = z3.Solver.check


def _param(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    for parse in (int, {"true": True, "false": False}.__getitem__):
        try:
            return key, parse(value)
        except (ValueError, KeyError):
            pass
    return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--structure", type=int, default=0, help="cases.hf_cb.STRUCTURES index (the test's: 0 and 3)")
    ap.add_argument("--budget", type=float, default=300.0, help="the proof's budget, seconds of the clock")
    ap.add_argument("--param", action="append", default=[], help="a global Z3 parameter, KEY=VALUE")
    args = ap.parse_args()
    for key, value in map(_param, args.param):
        z3.set_param(key, value)
    asked = [0]

    def timed(self, *assumptions):
        asked[0] += 1
        print(f"query {asked[0]}: asked", flush=True)
        before, t0 = spent(self), time.perf_counter()
        result = _check(self, *assumptions)
        print(f"query {asked[0]}: {result}, {time.perf_counter() - t0:.1f} s, {spent(self) - before:,} units",
              flush=True)
        return result

    z3.Solver.check = timed
    template = cases.rand_cfg(random.Random(0), cases.STRUCTURES[args.structure])
    knobs, cons = symbolic_knobs(template, {"block_size": (4, 8), "num_blocks": (1, 8), "max_num_tokens": (1, 16),
                                            "max_batch_size": (1, 8)})
    params = any_params(2)
    cons += workload_constraints(params)
    t0 = time.perf_counter()
    obligations = check_obligations(CORES["hf_cb"], knobs, params, cons, CORES["hf_cb"].invariants,
                                    timeout=args.budget, batch=True)
    open_ = [o.line() for o in obligations if o.status != "proved"]
    print(f"z3 {z3.get_version_string()} {args.param}: {len(obligations)} obligations, {len(open_)} not proved, "
          f"{time.perf_counter() - t0:.1f} s", *open_, sep="\n")


if __name__ == "__main__":
    main()
