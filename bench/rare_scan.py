"""Map where a rare-failure space fails: every point of a box of its ranged numbers run on the simulator.

    .venv/bin/python bench/rare_scan.py bench/rare/SPACE.toml NAME=LO:HI[:STEP] ...

NAME is a ranged number as bench/rare_failures.py draws it (`g1.0.prompt`: group 1, its first request, the prompt;
`knob.num_blocks`); the script lists them when one is missing. A number left out of the box must have a single
value. Prints how many points of the box violate a property the file searches, and each number's range over the
failing points: the evidence for the failing bands a space's description states.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rare_failures import Draws, violated  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402


def parse_box(args: list[str], names: list[str]) -> list[range]:
    box = {}
    for arg in args:
        name, _, spec = arg.partition("=")
        parts = spec.split(":")
        if name not in names or len(parts) not in (2, 3):
            raise SystemExit(f"rare_scan: {arg!r}: want NAME=LO:HI[:STEP] with NAME one of {', '.join(names)}")
        lo, hi, step = int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
        box[name] = range(lo, hi + 1, step)
    missing = [n for n in names if n not in box]
    if missing:
        raise SystemExit(f"rare_scan: give a range for each of {', '.join(missing)}")
    return [box[n] for n in names]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("box", nargs="*")
    args = ap.parse_args(argv)
    spec = load_check(args.file)
    draws = Draws.of(spec.space)
    names = [n for n, _, _ in draws.names]
    wanted = set(spec.properties)
    failing, points = [], 0
    for values in itertools.product(*parse_box(args.box, names)):
        points += 1
        built = draws.build(list(values))
        if built is not None and violated(*built, wanted):
            failing.append(values)
    print(f"{len(failing)} of {points} points fail ({', '.join(sorted(wanted))})")
    for i, name in enumerate(names):
        if failing:
            print(f"  {name}: {min(v[i] for v in failing)}..{max(v[i] for v in failing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
