"""The semantic outcome of `check` on a set of designs, one line each, to compare two commits (a
refactor must leave every line the same):

    .venv/bin/python bench/verdicts.py [FILE ...] [--timeout S] [--json]

Per file: status, property, depth (transitions: the shortest over the space searched, so it is
the same for any correct encoding), the smallest configuration found (`minimised`: lexicographically
least pool, budget, batch cap, requests, as the solver proves it); these are what a refactor must
keep. Also printed, not compared: the engine steps (they follow the workload values of the trace,
the solver's choice among the shortest, which may differ between encodings) and what the trace was
certified shortest in (that depends on the time certification had). Default: the benchmark's small
design (bench/trtllm-v2-field-ranges-small.toml) and the quick check files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import model.symbolic.cores  # noqa: E402,F401  (registers every core)
from model.symbolic.core import CORES  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402

try:
    from checkers.bmc import search
    from checkers.replay import replay
except ImportError:   # a commit before the checkers left model/ (41f7af5 and earlier), for comparison
    from model.symbolic.bmc import search
    from model.symbolic.replay import replay

DEFAULT = ("bench/trtllm-v2-field-ranges-small.toml", "scenarios/check/hf-cb-fatal-ranges.toml",
           "scenarios/check/trtllm-v1-reuse-overshoot-small-ranges.toml",
           "scenarios/check/vllm-chunked-off-wedge-ranges.toml")


def outcome(path: str, timeout: float) -> dict:
    spec = load_check(str(ROOT / path))
    result = search(CORES[spec.space.template.policy], spec.space, spec.max_depth, timeout,
                    list(spec.properties) if spec.properties else None)
    out = {"file": path, "status": result.status, "depth": result.depth}
    if result.status == "violated":
        out.update(property=result.cex.property, engine_steps=result.cex.steps, minimised=result.minimised,
                   shortest_in=result.scope or "the whole space", replayed=replay(result.cex).ok)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(DEFAULT))
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [outcome(f, args.timeout) for f in args.files]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(" | ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
