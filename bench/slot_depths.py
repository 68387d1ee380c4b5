"""How deep `check`'s unrolling reaches with a given number of requests: the time of each depth's query.

    .venv/bin/python bench/slot_depths.py --requests 8 --depth 4 --timeout 1000
    .venv/bin/python bench/slot_depths.py --requests 7 --shapes 2 --depth 5 --timeout 1500

(default file: scenarios/check/trtllm-v2-field-ranges.toml; `--file` for another with one request group.)

The file's space with its request count fixed at `--requests` (every slot present), deepened one transition at a
time as `check` deepens a capped space (checkers/bmc.py: the same invariants kept as lemmas, decode runs as one
transition where acceleration is proved for that slot count, the file's properties). Each row is one depth: the
seconds of its query and what it said (none, a violation with its workload, or unknown at the time-out).

`--shapes s` restricts the space further: the slots come in at most s runs of equal requests (prompt, max_new,
arrival, early stop and cancellation equal within a run). That is a subset of the runs, so a violation found there
is a run of the file's space; "none" means none in the subset only. It is the cheapest form of the "k identical
requests" idea (docs/symbolic.md, "Search"): fewer values to choose, the same number of slots to unroll.

This is the evidence for how far the field design's search reaches (docs/symbolic.md, "Search"; docs/benchmarks.md):
not a timed test, one query per depth on this machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import z3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import model.symbolic.cores  # noqa: E402,F401  (registers every core)
# _Deepening is the one-depth step `check` itself runs per capped space: timing anything else would not be the search
from checkers.bmc import UNROLLING_SORT, AccelerationProofs, _Deepening, prove_lemmas  # noqa: E402
from checkers.replay import replay  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402
from model.symbolic.ops import sort as ops_sort  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402

DEFAULT_FILE = ROOT / "scenarios" / "check" / "trtllm-v2-field-ranges.toml"
SHAPE_FIELDS = ("prompt", "max_new", "arrival", "output_len", "cancel_at")


def at_most_shapes(slots: list[dict], shapes: int) -> list:
    """Constraints: slot i equals slot i-1 on SHAPE_FIELDS except at no more than shapes-1 places."""
    breaks = []
    out = []
    for i in range(1, len(slots)):
        b = z3.Bool(f"shape_break{i}")
        breaks.append(b)
        out.append(z3.Or(b, z3.And([slots[i][f] == slots[i - 1][f] for f in SHAPE_FIELDS])))
    if breaks:
        out.append(z3.Sum([z3.If(b, 1, 0) for b in breaks]) <= shapes - 1)
    return out


@dataclasses.dataclass
class Row:
    depth: int
    seconds: float
    result: str                     # "none", "violated" or "unknown"
    detail: str = ""                # the violated property and workload, or why unknown
    workload: object = None         # the violation's Workload
    replayed: bool = False          # the violation replays in the simulator


def deepen(path: str, requests: int, shapes: int, max_depth: int, timeout: float, report=lambda line: None):
    """(seconds of the lemma and acceleration proofs, whether decode runs are one transition, one Row per depth
    searched); `report` gets each line as it is known."""
    spec = load_check(path)
    if len(spec.space.groups) != 1:
        raise SystemExit(f"slot_depths: {path}: requests: needs exactly one request group")
    group = dataclasses.replace(spec.space.groups[0], count=(requests, requests))
    space = dataclasses.replace(spec.space, groups=(group,))
    core = CORES[space.template.policy]
    start = time.monotonic()
    deadline = start + timeout
    lemmas = prove_lemmas(core, space, deadline)
    accelerate = core.accelerates and AccelerationProofs(core).holds(space, lemmas, deadline)
    setup = time.monotonic() - start
    report(f"lemmas and acceleration proof: {setup:.1f} s (decode runs as one transition: "
           f"{'yes' if accelerate else 'no'})")
    report(f"{'depth':>5}  {'seconds':>8}  result")
    rows = []
    with ops_sort(UNROLLING_SORT):
        run = _Deepening(core, space, spec.properties, accelerate, False, lemmas)
        if shapes:
            run.u.solver.add(*at_most_shapes(run.u.enc.params.slots, shapes))
        for depth in range(1, max_depth + 1):
            t0 = time.monotonic()
            found = run.deeper(deadline, start)
            row = Row(depth, time.monotonic() - t0, "none")
            if found is not None and found.status == "violated":
                cex = found.cex
                rep = replay(cex)
                reqs = ", ".join(f"{r.prompt}+{r.max_new}@{r.arrival}" for r in cex.workload.requests)
                row.result, row.workload, row.replayed = "violated", cex.workload, rep.ok
                row.detail = (f"{cex.property}: {reqs} "
                              f"(simulator replay: {'ok' if rep.ok else 'FAILED: ' + rep.message})")
            elif found is not None:
                row.result, row.detail = "unknown", found.reason
            rows.append(row)
            report(f"{depth:>5}  {row.seconds:>8.1f}  {row.result}{': ' + row.detail if row.detail else ''}")
            if found is not None:
                break
    return setup, accelerate, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", default=str(DEFAULT_FILE))
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--shapes", type=int, default=0, help="at most this many runs of equal requests (0: no limit)")
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole deepening")
    args = ap.parse_args()
    print(f"{Path(args.file).name}: {args.requests} requests, "
          f"{args.shapes or 'any number of'} shapes, z3 {z3.get_version_string()}", flush=True)
    deepen(args.file, args.requests, args.shapes, args.depth, args.timeout, lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
