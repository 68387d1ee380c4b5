"""Where a scenario's point search spends its time: the search test_check_scenarios.py runs (the
design as a point, no early stops or cancellations, one transition past the simulator's run), with
the time at which each depth is covered. Before depth 1: the lemmas (printed) and the acceleration
proof (the rest). Quoted in docs/symbolic.md for scenarios/vllm-prefix-caching.toml.

    .venv/bin/python bench/point_search_profile.py scenarios/vllm-prefix-caching.toml   # about 4 minutes
"""

from __future__ import annotations

import dataclasses
import sys
import time

import model.symbolic.cores  # noqa: F401  (registers every core)
from checkers.bmc import search
from checkers.replay import transitions
from model.simulator import simulate
from model.symbolic.core import CORES
from schedproof.checkspec import load_check
from schedproof.scenario import load


def main(path: str, timeout: float = 600.0) -> None:
    sc, spec = load(path), load_check(path)
    space = dataclasses.replace(spec.space, early_stops=False, cancellations=False)
    trace = simulate(sc.cfg, sc.workload, max_steps=20_000)
    n = len(transitions(sc.cfg, sc.workload, len(trace.records) - 1))
    start = time.monotonic()

    def progress(event):
        if event.kind == "depth":
            print(f"{time.monotonic() - start:7.1f} s  depth {event.depth} covered ({event.slots} slots)", flush=True)

    result = search(CORES[sc.cfg.policy], space, n + 1, timeout=timeout, progress=progress)
    print(f"{result.status} at depth {result.depth} in {time.monotonic() - start:.1f} s {result.reason}")
    if result.lemmas is not None:
        print(f"lemmas: {len(result.lemmas.names)} kept in {result.lemmas.seconds:.1f} s; "
              f"dropped: {', '.join(result.lemmas.dropped) or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1])
