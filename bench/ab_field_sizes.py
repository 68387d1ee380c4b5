"""TensorRT-LLM V2 with fixes A and B at the field report's sizes, side by side in one run (issue 10):
what is proved for any number of requests, what is proved only for a few, and the shortest wedge of the field
ranges on a mixed workload.

    .venv/bin/python bench/ab_field_sizes.py [--timeout 600] [--full-ranges]

1. `prove` on the A+B claims expected to hold (proofs/claims.py): `v2-ab-outgrowing` (class C1: every request
   can outgrow its budget, the field report's shape), `v2-ab-outgrowing-first` (C3) and `v2-ab-within-budget`
   (C2), and the repair `v2-ab-reserve-all` (A+B* in C0: every request fits alone). Each claim holds for every
   pool, budget, block size and batch cap of its class, so at the field sizes (272 pages of 32 tokens, a
   2048-token budget, batch cap 64) too; the scope says for how many requests.
2. `check` on scenarios/check/trtllm-v2-ab-field-ranges.toml: A+B at the field sizes over the field ranges of
   prompt, max_new and arrival with up to 4 requests, early stops and cancellations allowed (the default
   [check]), by `check`'s search (`schedproof.sweep.search_table`: a trace is reported only if the simulator
   replays it).
3. With `--full-ranges`, the same design with 1-12 requests (the field ranges' count) under the same time-out:
   where the search gets to.
Prints one table row per line; docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proofs import claims as C  # noqa: E402
from proofs import run as R  # noqa: E402
from schedproof.sweep import search_table  # noqa: E402

DESIGN = "scenarios/check/trtllm-v2-ab-field-ranges.toml"
CLAIMS = ("v2-ab-outgrowing", "v2-ab-outgrowing-first", "v2-ab-within-budget", "v2-ab-reserve-all")


def prove_rows(timeout: float) -> None:
    for name in CLAIMS:
        claim = next(c for c in C.CLAIMS if c.name == name)
        t0 = time.monotonic()
        v = R.decide_claims([claim], timeout)[0]
        scope = "any number" if v.scope == "any" else f"up to {v.scope}" if v.scope else "-"
        print(f"| prove {name} | {v.status} | requests: {scope} | {time.monotonic() - t0:.1f} |")


def check_row(label: str, table: dict, timeout: float) -> None:
    found = search_table(DESIGN, table, timeout)   # `check`'s search; a trace that does not replay is unknown
    if found.status == "violated":
        n = len(found.cex.workload.requests)
        where = found.scope or "the whole space"
        if found.scope and found.certified is not None:
            where += f" ({found.certified_in or 'the whole space'} clear to depth {found.certified})"
        what = (f"{found.cex.property} at depth {found.cex.depth}, {n} requests, {found.cex.steps} engine steps; "
                f"shortest among {where}; replayed in the simulator")
        print(f"| {label} | violated | {what} | {found.found_seconds:.1f} (all: {found.seconds:.1f}) |")
    else:
        where = found.scope or "the whole space"
        print(f"| {label} | {found.status} | clear to depth {found.depth} among {where} "
              f"{('(' + found.reason + ')') if found.reason else ''} | {found.seconds:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per claim and per search")
    ap.add_argument("--full-ranges", action="store_true", help="also search the design with 1-12 requests")
    args = ap.parse_args()
    with open(ROOT / DESIGN, "rb") as f:
        table = tomllib.load(f)
    print("| what | verdict | detail | seconds |")
    print("|---|---|---|---|")
    prove_rows(args.timeout)
    check_row("check A+B, field ranges, 1-4 requests", table, args.timeout)
    if args.full_ranges:
        full = {**table, "requests": [{**table["requests"][0], "count": [1, 12]}],
                "check": {**table["check"], "max_depth": 16}}
        check_row("check A+B, field ranges, 1-12 requests (depth 16)", full, args.timeout)


if __name__ == "__main__":
    main()
