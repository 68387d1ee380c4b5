"""What the repair B* costs: TensorRT-LLM V2 with fixes A+B against A+B* on the bundled workloads.

    .venv/bin/python bench/repair_cost.py [--mixed 20] [--seed 0]

B* (trtllm_v2 option `reserve_every_worst_case`, schedproof's proposal, not an engine change) makes fix B
reserve the worst case of every admitted request, not only of those whose replay can outgrow the budget;
A+B* is proved free of no-progress states for any number of requests that each fit alone (proofs/claims.py
`v2-ab-reserve-all`), where A+B is refuted (`v2-ab-mixed`). The price is admissions: a request that cannot
outgrow now waits until its worst case fits beside the others'. For each bundled trtllm_v2 scenario with
chunked prefill off and no host tier (the designs fix B applies to), and for the workload of the
`v2-ab-mixed` counterexample, both designs run on the simulator with the scenario's sizes; printed per
workload and design: requests completed, engine steps to the end, requests per step (mean batch), and the
mean wait from arrival to the first scheduled step. The bundled workloads are the field report's, where every
request either can outgrow (so B reserves it already) or the pool holds four worst cases anyway; the cost shows
on mixed workloads, so `--mixed N` adds N seeded random ones at the field design's sizes (272 pages of 32
tokens, budget 2048, 64 requests per step): 24 requests at step 0, prompt 100-1900, max_new 16-1024, each
fitting alone (class C0), summed per design with the runs A+B wedges counted. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model.simulator import RequestSpec, Workload, simulate  # noqa: E402
from model.state import Phase  # noqa: E402
from proofs import claims as C  # noqa: E402
from proofs.run import decide_bmc  # noqa: E402
from schedproof.scenario import load  # noqa: E402

DESIGNS = {"A+B": dict(C.AB, reserve_every_worst_case=False), "A+B*": C.AB_STAR}


def workloads():
    for path in sorted((ROOT / "scenarios").glob("trtllm-v2-*.toml")):
        sc = load(path)
        if not sc.cfg.chunked_prefill and sc.cfg.host_blocks == 0:
            yield sc.name, sc.cfg, sc.workload
    v = decide_bmc(next(c for c in C.CLAIMS if c.name == "v2-ab-mixed"), 300)
    if v.cex is not None:
        yield "v2-ab-mixed counterexample", v.cex.cfg, v.cex.workload


def measure(cfg, workload) -> dict:
    trace = simulate(cfg, workload)
    final = trace.final
    first = {}
    for rec in trace.records:
        for rid, _ in rec.scheduled:
            first.setdefault(rid, rec.step)
    waits = [first[r.rid] - r.arrival for r in final.requests if r.rid in first]
    steps = len(trace.records)
    return dict(completed=sum(r.phase == Phase.FINISHED for r in final.requests), total=len(final.requests),
                end=trace.end, steps=steps,
                batch=sum(len(rec.scheduled) for rec in trace.records) / max(1, steps),
                wait=sum(waits) / max(1, len(waits)))


def mixed(n: int, seed: int):
    """n seeded mixed workloads in C0 at the field design's sizes."""
    rng = random.Random(seed)
    for _ in range(n):
        yield Workload(tuple(RequestSpec(rng.randint(100, 1900), rng.randint(16, 1024), 0) for _ in range(24)))


def row(name: str, label: str, m: dict) -> None:
    print(f"{name:42s} {label:5s} {m['completed']:>4d}/{m['total']:<4d} {m['end']:9s} {m['steps']:6d} "
          f"{m['batch']:6.2f} {m['wait']:7.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mixed", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"seed {args.seed}")
    print(f"{'workload':42s} {'design':5s} {'completed':>9s} {'end':9s} {'steps':>6s} {'batch':>6s} {'wait':>7s}")
    for name, cfg, workload in workloads():
        for label, options in DESIGNS.items():
            row(name, label, measure(dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, **options)),
                                     workload))
    field = C.v2()
    runs = list(mixed(args.mixed, args.seed))
    for label, options in DESIGNS.items():
        design = dataclasses.replace(field, options=dataclasses.replace(field.options, **options))
        ms = [measure(design, wl) for wl in runs]
        total = dict(completed=sum(m["completed"] for m in ms), total=sum(m["total"] for m in ms),
                     end=f"{sum(m['end'] != 'done' for m in ms)} wedged", steps=sum(m["steps"] for m in ms),
                     batch=sum(m["batch"] for m in ms) / max(1, len(ms)),
                     wait=sum(m["wait"] for m in ms) / max(1, len(ms)))
        row(f"{len(ms)} mixed workloads (sums; batch, wait: means)", label, total)


if __name__ == "__main__":
    main()
