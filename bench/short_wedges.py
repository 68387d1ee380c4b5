"""Short wedges of the field design, found on the simulator: upper bounds on the shortest trace per request count.

    .venv/bin/python bench/short_wedges.py --samples 60 --seed 3

For each request count, the fewest BMC transitions (checkers/replay.py `transitions`: a decode run that can
start counts once) among seeded random workloads of one shape, the field failure's mechanism made as short as it
goes: n-1 short requests and one long one, all arriving at step 0, the long one last (the newest, which V2 pauses);
its prompt over half the budget so that its replay can outgrow it, and the short ones' max_new swept around the
step at which the pool runs out, so that they finish in the step the long one is paused. Each workload is
simulated and evaluated as `schedproof run` does; only LIVE-NO-PROGRESS with a paused request whose replay is over
max_num_tokens counts.

This is a sweep of a hand-picked shape, not a search of the space: what it prints are upper bounds, which
`schedproof check` certifies only from below and only for few requests (docs/symbolic.md, "Search").
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from model.simulator import RequestSpec, Workload  # noqa: E402
from model.state import Phase  # noqa: E402
from checkers.replay import transitions  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402
from time_to_counterexample import DEFAULT_SCENARIO, describe, no_progress  # noqa: E402


def wedge_depth(cfg, reqs: list[tuple[int, int]]):
    """(split into transitions, workload) of the replay-over-budget wedge of these (prompt, max_new) requests, all
    at step 0; None when they do not wedge that way."""
    wl = Workload(tuple(RequestSpec(p, m, 0) for p, m in reqs))
    v, trace = no_progress(cfg, wl)
    if v is None:
        return None
    stuck = trace.states[v.step]
    if not any(q.phase == Phase.PREEMPTED and q.context_len > cfg.max_num_tokens for q in stuck.requests):
        return None
    return transitions(cfg, wl, v.step), wl


def sweep(cfg, counts: list[int], samples: int, seed: int, max_new: int) -> dict:
    rng = random.Random(seed)
    budget = cfg.max_num_tokens
    best: dict = {}
    for _ in range(samples):
        n = rng.choice(counts)
        long_prompt = rng.randint(budget // 2 + 1, budget - (n - 1))
        short_prompt = rng.randint(1, (budget - long_prompt) // (n - 1))
        long_new = rng.randint(max_new // 2, max_new)
        probe = wedge_depth(cfg, [(short_prompt, max_new)] * (n - 1) + [(long_prompt, long_new)])
        if probe is None:
            continue
        # the step the pool ran out at: the end of the first decode run
        split = probe[0]
        out_at = split[0] + (split[1] if len(split) > 1 else 0)
        for m in range(max(1, out_at - 3), min(max_new, out_at + 6) + 1):
            found = wedge_depth(cfg, [(short_prompt, m)] * (n - 1) + [(long_prompt, long_new)])
            if found and (n not in best or len(found[0]) < len(best[n][0])):
                best[n] = found
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / DEFAULT_SCENARIO))
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--counts", default="3,4,5,6,7,8,9,10,11,12", help="request counts to sample")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    if min(counts) < 2:
        ap.error("--counts: every count must be at least 2 (short requests and the long one)")
    spec = load_check(args.scenario)
    cfg = spec.space.template
    max_new = spec.space.groups[0].fields["max_new"]
    max_new = max_new[1] if isinstance(max_new, tuple) else max_new
    best = sweep(cfg, counts, args.samples, args.seed, max_new)
    print(f"# shortest replay-over-budget wedge found per request count: {Path(args.scenario).name}, "
          f"seed {args.seed}, {args.samples} samples")
    print("| requests | transitions | engine steps | split | workload (prompt+max_new@arrival) |")
    print("|---|---|---|---|---|")
    for n in sorted(best):
        split, wl = best[n]
        shown = split if len(split) <= 12 else split[:12] + ["..."]
        print(f"| {n} | {len(split)} | {sum(split)} | {shown} | {describe(wl)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
