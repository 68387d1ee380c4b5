"""`schedproof check` before and after design review (issue 38), side by side, one row per file:

    .venv/bin/python bench/review.py --before COMMIT [FILE ...] [--timeout S] [--json]

Each file is checked by the command line of two trees at once, one process each (so on a 2-core machine
each has a core): `--before`, a commit checked out into a temporary git worktree and run from it
(PYTHONPATH points there, so its own packages are imported), and this working tree. The row gives each
one's verdict (`status`, and for `proved` how, for `violated` the depth and requests, for `unknown`
how far it got) and wall seconds, and the ratio after/before. Default files: every bundled check file,
the claims' classes written as files (scenarios/check/claims/) and the designs outside every claim
(scenarios/check/review/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_files() -> list[str]:
    out = []
    for folder in ("scenarios/check", "scenarios/check/claims", "scenarios/check/review"):
        out += sorted(str(p.relative_to(ROOT)) for p in (ROOT / folder).glob("*.toml"))
    return out


def check(tree: Path, path: str, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), CI="true")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import sys; from schedproof.cli import main; "
                                                 "sys.exit(main(sys.argv[1:]))",
                           "check", str(ROOT / path), "--json", "--timeout", str(timeout)],
                          cwd=tree, env=env, capture_output=True, text=True)
    secs = time.monotonic() - t0
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"status": f"exit {proc.returncode}", "seconds": secs, "detail": proc.stderr.strip()[-200:]}
    return {"status": out["status"], "seconds": secs, "detail": detail(out)}


def detail(out: dict) -> str:
    status = out["status"]
    if status == "violated":
        n = len(out.get("workload") or [])
        return (f"{out['property']} at depth {out['depth']}, {n} request{'s' if n != 1 else ''}, found at "
                f"{out.get('found_seconds', 0):.0f} s, shortest in {out.get('shortest_in', '?')}")
    proofs = out.get("proofs") or {}
    if status == "proved":
        by = [c["claim"] + (" (any n)" if c["scope"] == "any" else f" (up to {c['scope']})") for c in proofs["claims"]]
        by += [f"inferred invariant, {len(i['invariant'])} families" for i in proofs["inferred"]
               if i["status"] == "proved"]
        return "by " + ", ".join(by)
    if status == "bounded":
        return f"depth {out['depth']}"
    return f"clear to depth {out['depth']} in {out.get('clear_in', '?')}"


def worktree(commit: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="schedproof-before-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), commit], cwd=ROOT, check=True,
                   capture_output=True)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--timeout", type=float, default=600.0, help="check's --timeout (default 600, check's own)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    before = worktree(args.before)
    rows = []
    try:
        with ThreadPoolExecutor(2) as pool:
            for path in files:
                # a file the older tree does not have is checked from this tree's copy by both
                old = pool.submit(check, before, path, args.timeout)
                new = pool.submit(check, ROOT, path, args.timeout)
                row = {"file": path, "before": old.result(), "after": new.result()}
                rows.append(row)
                print(line(row), file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, capture_output=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"| file | before ({args.before[:7]}) | s | after | s | after/before |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print(line(row))
    return 0


def line(row: dict) -> str:
    b, a = row["before"], row["after"]
    return (f"| {row['file']} | {b['status']}: {b['detail']} | {b['seconds']:.0f} | {a['status']}: {a['detail']} | "
            f"{a['seconds']:.0f} | {a['seconds'] / max(b['seconds'], 0.01):.2f} |")


if __name__ == "__main__":
    sys.exit(main())
