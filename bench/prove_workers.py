"""`schedproof prove` on 1 and on N worker processes, one run after the other: the wall-clock time of each whole run,
their ratio, and whether every claim got the same verdict.

    .venv/bin/python bench/prove_workers.py [--workers 1 2] [--budget 3600] [--json FILE] [POLICY]

Each run is the command as a user types it (`schedproof prove --json --workers W`), a fresh process; the
machine should be otherwise idle. With one worker the claims are decided one after the other, each handing on
the budget it left unspent; with more, each claim has a fixed share (proofs/parallel.py), so a claim's verdict
can differ between the two only where it needed more than its share: the table lists any such claim.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("schedproof"))     # the interpreter's own venv


def prove(workers: int, budget: float, policy: list[str]) -> tuple[float, dict]:
    """(wall seconds, {claim: (status, seconds)}) of one whole `prove` run."""
    t0 = time.perf_counter()
    proc = subprocess.run([CLI, "prove", *policy, "--json", "--workers", str(workers), "--budget", str(budget)],
                          capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    claims = json.loads(proc.stdout)
    return seconds, {c["claim"]: (c["status"], c["seconds"]) for c in claims}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policy", nargs="?")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--budget", type=float, default=3600.0)
    ap.add_argument("--json", metavar="FILE", help="also write every claim's status and seconds, per run, to FILE")
    args = ap.parse_args(argv)
    runs = {}
    for w in args.workers:
        runs[w] = prove(w, args.budget, [args.policy] if args.policy else [])
        print(f"{w} worker(s): {runs[w][0]:.0f} s", file=sys.stderr, flush=True)    # each as it ends
        if args.json:                                                                   # kept if a later run is stopped
            Path(args.json).write_text(json.dumps({str(k): {"seconds": v[0], "claims": v[1]} for k, v in runs.items()},
                                                  indent=1))
    base = runs[args.workers[0]][0]
    print("| workers | wall s | ratio to the first | claims | verdicts as the first's |")
    print("|---|---|---|---|---|")
    first = {name: status for name, (status, _) in runs[args.workers[0]][1].items()}
    for w, (seconds, claims) in runs.items():
        same = sum(first.get(name) == status for name, (status, _) in claims.items())
        print(f"| {w} | {seconds:.0f} | {seconds / base:.2f} | {len(claims)} | {same} of {len(claims)} |")
    for name, status in first.items():
        others = {w: runs[w][1].get(name, ("missing",))[0] for w in args.workers[1:]}
        if any(s != status for s in others.values()):
            print(f"differs: {name}: {status} with {args.workers[0]} worker(s), " +
                  ", ".join(f"{s} with {w}" for w, s in others.items()))
    print("slowest claims (seconds, each run): " + "; ".join(
        f"{w}: " + ", ".join(f"{n} {s:.0f}" for n, (_, s) in sorted(c.items(), key=lambda kv: -kv[1][1])[:3])
        for w, (_, c) in runs.items()))


if __name__ == "__main__":
    main()
