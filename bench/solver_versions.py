"""Two Z3 releases side by side on every bundled check file and every claim: status, depth reached and wall
seconds of `check FILE --budget B`, then the verdict and seconds of each claim of `prove --workers 1`.

    .venv/bin/python bench/solver_versions.py --side 4.15=.venv/bin/python \
        --side 5.4=/path/to/venv-with-z3-5.4/bin/python:2.4,1.2 [--budget 30] [--prove-budget 3600] [FILE ...]
        [--prove-only | --check-only] [--per-policy] [--prove-cap SECONDS] [--loop design|default|both]

Each side is an interpreter with the project importable and its own z3-solver (a second venv: see
docs/benchmarks.md for the command). The two sides run at the same time, one process each, so each has one
of the machine's two cores and the same load beside it. The clock (checkers/clock.py) converts Z3's work
counter at rates measured on the pinned release; another release counts its work differently
(bench/clock_rates.py run in both venvs), so a side may give two factors after its interpreter,
`:OBLIGATION,UNROLLING`, by which its clock rates are multiplied: with them a budget of B seconds buys
about B seconds of that release's solving, and the comparison is at equal time, not equal units. A third part,
`:KEY=VALUE,...`, sets global Z3 parameters on that side before anything is built (`smt.relevancy=0`: the
parameter measured on 5.4's regressing induction queries, docs/benchmarks.md).
Output: one markdown table per part; `--json FILE` keeps the rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The CLI with the clock's rates scaled and Z3's parameters set (argv: obligation factor, unrolling factor,
# KEY=VALUE,... or "", then the CLI's own).
DRIVER = """
import sys
import z3
for kv in filter(None, sys.argv.pop(3).split(",")):
    key, value = kv.split("=")
    z3.set_param(key, int(value) if value.lstrip("-").isdigit() else {"true": True, "false": False}.get(value, value))
import checkers.budget as budget, checkers.clock as clock
ob, un = float(sys.argv[1]), float(sys.argv[2])
budget.RLIMIT_PER_SECOND = int(budget.RLIMIT_PER_SECOND * ob)
clock.OBLIGATION_RATE = int(clock.OBLIGATION_RATE * ob)
clock.UNROLLING_RATE = int(clock.UNROLLING_RATE * un)
clock._CLOCK.rates[0] = clock.OBLIGATION_RATE
from schedproof.cli import entry
sys.argv = ["schedproof"] + sys.argv[3:]
entry()
"""


def check_files() -> list[str]:
    folder = ROOT / "scenarios" / "check"
    return [str(p.relative_to(ROOT)) for sub in (folder, folder / "claims", folder / "review")
            for p in sorted(sub.glob("*.toml"))]


class Side:
    def __init__(self, spec: str) -> None:
        name, _, rest = spec.partition("=")
        python, _, rest = rest.partition(":")
        factors, _, self.params = rest.partition(":")
        self.name, self.python = name, python
        self.factors = tuple(float(f) for f in factors.split(",")) if factors else (1.0, 1.0)
        self.z3 = subprocess.run([python, "-c", "import z3; print(z3.get_version_string())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        self.rows: dict = {}

    def cli(self, *args: str) -> tuple[dict, float]:
        t0 = time.perf_counter()
        proc = subprocess.run([self.python, "-c", DRIVER, *map(str, self.factors), self.params, *args],
                              capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - t0
        try:
            return json.loads(proc.stdout), seconds  # a dict (check) or a list of claims (prove)
        except json.JSONDecodeError:
            return {"status": f"error (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"}, seconds

    def run(self, files: list[str], budget: float, prove: list[tuple[str, list[str]]], saved) -> None:
        for path in files:
            out, seconds = self.cli("check", path, "--budget", str(budget), "--json")
            self.rows[("check", path)] = {"status": out.get("status"), "depth": depth_of(out),
                                          "seconds": round(seconds, 1)}
            saved()
        for label, args in prove:
            out, seconds = self.cli("prove", *args)
            self.rows[("prove", label)] = {"status": "", "depth": "", "seconds": round(seconds, 1)}
            for claim in out if isinstance(out, list) else []:
                scope = (claim.get("scope") or {}).get("requests", "")
                self.rows[("prove", claim["claim"])] = {"status": claim["status"], "depth": scope,
                                                        "seconds": claim["seconds"]}
            saved()


def prove_runs(budget: float, loop: str, per_policy: bool, cap: float | None) -> list[tuple[str, list[str]]]:
    """The `prove` commands to time: the whole run, or (`--per-policy`) one per policy, each process deciding only
    that policy's claims; `--prove-cap CAP` puts each under a wall-clock cap of CAP seconds, so that a release far
    slower somewhere still reports every claim it decided (a whole run on 5.4 had not finished after 72 minutes
    and left no row)."""
    common = ["--workers", "1", "--budget", str(budget), "--loop", loop, "--json"]
    capped = [] if cap is None else ["--timeout", str(cap)]
    suffix = "" if cap is None else f", capped at {cap:.0f} s"
    if not per_policy:
        return [(f"(whole run{suffix})", common + capped)]
    policies = ("trtllm_v2", "trtllm_v1", "vllm_v1", "sglang", "hf_cb")
    return [(f"({policy}{suffix})", [policy, *common, *capped]) for policy in policies]


def depth_of(out: dict):
    """The depth a `check --json` reached: its trace's length where violated, else how far it was clear."""
    return out.get("depth", "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--side", action="append", required=True, help="NAME=PYTHON[:OBLIGATION,UNROLLING]")
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--prove-budget", type=float, default=3600.0)
    ap.add_argument("--loop", choices=("design", "default", "both"), default="design",
                    help="prove's --loop (design: the claims without their default-loop twins)")
    ap.add_argument("--per-policy", action="store_true", help="prove one policy at a time, each in its own process")
    ap.add_argument("--prove-cap", type=float, metavar="SECONDS", help="a wall-clock cap on each prove command")
    ap.add_argument("--prove-only", action="store_true", help="skip the check files")
    ap.add_argument("--check-only", action="store_true", help="skip prove")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    sides = [Side(s) for s in args.side]
    files = [] if args.prove_only else (args.files or check_files())
    prove = [] if args.check_only else prove_runs(args.prove_budget, args.loop, args.per_policy, args.prove_cap)
    lock = threading.Lock()

    def saved() -> None:
        """The rows so far, in --json's file: a run of an hour or more leaves what it measured if it is stopped."""
        if args.json_out:
            with lock:
                Path(args.json_out).write_text(json.dumps(
                    {s.z3: {f"{k[0]} {k[1]}": v for k, v in s.rows.items()} for s in sides}, indent=1))

    threads = [threading.Thread(target=s.run, args=(files, args.budget, prove, saved)) for s in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    keys = list(sides[0].rows)
    print("| command | target | " + " | ".join(f"z3 {s.z3}: status | depth/scope | s" for s in sides) + " |")
    print("|---|---|" + "---|---|---|" * len(sides))
    for key in keys:
        cells = []
        for s in sides:
            r = s.rows.get(key, {})
            cells += [str(r.get("status", "")), str(r.get("depth", "")), str(r.get("seconds", ""))]
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    saved()


if __name__ == "__main__":
    main()
