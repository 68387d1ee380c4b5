"""How deep the bounded search of each claim expected to fail must go in its engine's default loop (proofs/modes.py):
the twin's own search at its claim's depth and at deeper ones, one after the other in one run.

    .venv/bin/python bench/default_loop_depths.py [--budget S] [CLAIM ...]

In the default loop no decode run is accelerated (the cores' `decode_guard` is false there), so a wedge the
synchronous search reaches through decode runs takes its engine steps one by one. Prints, per twin and depth, the
status, the depth of the trace (or reached), whether the trace replays in the simulator, and the seconds; the
depths recorded in proofs/modes.py MEASURED come from this table (docs/symbolic.md, "Claims in the engine's default
loop").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model.symbolic.cores  # noqa: E402,F401  (registers the cores)
from checkers import bmc  # noqa: E402
from checkers.replay import replay  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402
from proofs import modes  # noqa: E402
from proofs.claims import CLAIMS  # noqa: E402

DEPTHS = (12, 18, 24, 36, 48)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("claims", nargs="*", help="claim names (default: every bounded-search claim with a twin)")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds of solving per search")
    args = ap.parse_args()
    claims = [c for c in CLAIMS if c.method == "bmc" and (not args.claims or c.name in args.claims)]
    print("| twin | depth asked | status | trace / reached depth | replayed | s |")
    print("|---|---|---|---|---|---|")
    for claim in claims:
        twin = modes.in_default_loop(claim)
        if twin is None:
            continue
        for depth in sorted({claim.max_depth, *DEPTHS}):
            t0 = time.monotonic()
            res = bmc.search(CORES[twin.policy], twin.space, depth, args.budget, [twin.property])
            secs = time.monotonic() - t0
            replayed = replay(res.cex).ok if res.cex is not None else ""
            print(f"| {twin.name} | {depth} | {res.status} | {res.depth} | {replayed} | {secs:.1f} |", flush=True)
            if res.status == "violated":
                break


if __name__ == "__main__":
    main()
