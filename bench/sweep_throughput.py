"""Sweep throughput: points per second with 1 and 2 local workers and through a local Ray head, side by side
in one run, as ratios to one worker (docs/benchmarks.md).

    .venv/bin/python bench/sweep_throughput.py [--repeat 3] [--no-ray]

The grid is the field design's pool x token budget (4 x 8 = 32 points, each a `run` of the 12-request field
workload). Ray needs the [ray] extra; its head is started here on a free port (`ray start --head`, two CPUs)
and stopped after, and its start is not timed (a cluster is started once and kept). Each mode runs `--repeat`
times in turn, the best time kept.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from schedproof import sweep

FIELD = "scenarios/trtllm-v2-replay-over-budget.toml"
VARY = ["options.kv_cache_max_tokens=6144..12288:2048", "max_num_tokens=1792..3584:256"]


def _timed(run) -> float:
    start = time.perf_counter()
    points = run()
    assert all(p.verdict != "error" for p in points)
    return time.perf_counter() - start


def _ray_head() -> tuple[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats", f"--temp-dir={temp}"], check=True, capture_output=True, timeout=300)
    return f"127.0.0.1:{port}", temp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    raw, varies = sweep.plan(FIELD, VARY)
    n = len(varies[0].values) * len(varies[1].values)
    modes = {"1 local worker": lambda: sweep.sweep(FIELD, raw, varies, 1, 120),
             "2 local workers": lambda: sweep.sweep(FIELD, raw, varies, 2, 120)}
    head = None
    if not args.no_ray:
        head = _ray_head()
        modes["Ray, local head (2 CPUs)"] = lambda: sweep.sweep_on_ray(FIELD, raw, varies, head[0], 120)
    best = {m: float("inf") for m in modes}
    try:
        for _ in range(args.repeat):
            for mode, run in modes.items():
                best[mode] = min(best[mode], _timed(run))
    finally:
        if head is not None:
            subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True)
            shutil.rmtree(head[1], ignore_errors=True)
    base = n / best["1 local worker"]
    print(f"{n} points of {FIELD}, best of {args.repeat}")
    print("| mode | seconds | points/s | ratio to 1 worker |\n|---|---|---|---|")
    for mode, secs in best.items():
        print(f"| {mode} | {secs:.2f} | {n / secs:.2f} | {n / secs / base:.2f} |")


if __name__ == "__main__":
    main()
