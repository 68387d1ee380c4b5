"""Seconds each test spends in Python's cyclic collector, in the suite as it runs: a pytest plugin that writes one
line per test and worker (the collector's time during the test, its full collections, and every 25th test the
number of objects it tracks) to GC_TIME_DIR (default reports/gc), and a summary of those lines.

    PYTHONPATH=bench .venv/bin/python -m pytest -n 2 -q -p gc_time      # the README's test command, plus the plugin
    .venv/bin/python bench/gc_time.py reports/gc                         # the summary
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

# the collector's time and full collections since the last test ended, the tests seen, whether this process
# runs tests, and the file it writes
_clock = {"start": 0.0, "total": 0.0, "full": 0, "tests": 0, "runs_tests": True, "out": None}


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _clock["start"] = time.perf_counter()
    else:
        _clock["total"] += time.perf_counter() - _clock["start"]
        _clock["full"] += info["generation"] == 2


def pytest_configure(config) -> None:
    # pytest-xdist's controller hears of every test but runs none: only the workers (or a run without -n) write
    _clock["runs_tests"] = hasattr(config, "workerinput") or config.getoption("dist", "no") == "no"
    gc.callbacks.append(_timed)


def pytest_runtest_logfinish(nodeid, location) -> None:
    if not _clock["runs_tests"]:
        return
    if _clock["out"] is None:
        folder = Path(os.environ.get("GC_TIME_DIR", "reports/gc"))
        folder.mkdir(parents=True, exist_ok=True)
        _clock["out"] = open(folder / f"gc-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a")
    # counting the objects walks them all: every 25th test only
    objects = len(gc.get_objects()) if _clock["tests"] % 25 == 0 else None
    _clock["out"].write(json.dumps({"test": nodeid, "gc_s": round(_clock["total"], 3), "gen2": _clock["full"],
                           "objects": objects, "frozen": gc.get_freeze_count()}) + "\n")
    _clock["out"].flush()
    _clock["tests"] += 1
    _clock["total"], _clock["full"] = 0.0, 0


def summary(folder: Path) -> None:
    for path in sorted(folder.glob("gc-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        counted = [r["objects"] for r in rows if r["objects"] is not None]
        total = sum(r["gc_s"] for r in rows)
        print(f"{path.name}: {len(rows)} tests, {total:.0f} s in the collector, {sum(r['gen2'] for r in rows)} full "
              f"collections, tracked objects at most {max(counted, default=0):,}, frozen at the end "
              f"{rows[-1]['frozen'] if rows else 0:,}")
        for r in sorted(rows, key=lambda r: -r["gc_s"])[:10]:
            print(f"  {r['gc_s']:8.1f} s  {r['gen2']:5d} full  {r['test']}")


if __name__ == "__main__":
    summary(Path(sys.argv[1] if len(sys.argv) > 1 else "reports/gc"))
