"""How `schedproof run` scales with the number of requests: wall time and peak memory of one run
per request count, each in its own process. The reason behind model/limits.py REQUESTS (README,
"Limits"): a run keeps every state with every request, so both grow with the square of the count.

    .venv/bin/python bench/run_scaling.py                 # 500, 1000, 2000 requests (about 2 minutes)
    .venv/bin/python bench/run_scaling.py 1000 4000       # the counts quoted in the README (about 5 minutes)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One vLLM design, light requests: what grows is the count alone.
SCENARIO = """name = "scaling"
[engine]
policy = "vllm_v1"
block_size = 16
num_blocks = 100
max_num_tokens = 64
max_batch_size = 4
[engine.options]
max_model_len = 64
async_scheduling = false   # the loop the results table in docs/benchmarks.md was measured with
[[requests]]
count = {count}
prompt = 10
max_new = 10
"""


def measure(count: int, folder: Path) -> tuple[float, float, int]:
    """(seconds, peak resident MiB, exit status) of `schedproof run` on `count` requests."""
    path = folder / f"scaling-{count}.toml"
    path.write_text(SCENARIO.format(count=count))
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "schedproof.cli", "run", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.monotonic() - start, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main(counts: list[int]) -> None:
    print("| requests | seconds | peak MiB | exit | seconds / (requests/1000)^2 |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            seconds, mib, code = measure(n, Path(tmp))
            print(f"| {n} | {seconds:.1f} | {mib:.0f} | {code} | {seconds / (n / 1000) ** 2:.1f} |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [500, 1000, 2000])
