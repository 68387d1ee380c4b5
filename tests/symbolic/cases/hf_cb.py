"""Random cases for the hf_cb core (model/symbolic/cores/hf_cb.py): both scheduler types, safety
margins, block sharing (a request's own blocks, and prefix groups: matches, blocks referenced by
several requests, cached prefix blocks, soft resets that free nothing), soft resets, the fatal error
and the empty-batch crash, cancellations and early stops."""

import dataclasses
import random
from collections import Counter

from checkers.differential import CompiledRelation
from model.config import EngineConfig, build_options
from model.policies.hf_cb import Options
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES

DIFF_RUNS = 1000
RELATION_RUNS = 260     # per structure (4 structures)
SLOTS = 5
MAX_STEPS = 2000
MARGINS = [None, None, 0.0, 0.1, 0.15, 0.2, 0.25, 1 / 3, 0.5, 0.75, 1.0]


def rand_options(rng: random.Random) -> dict:
    o = {"scheduler_type": rng.choice(["fifo", "prefill_first"]),
         "allow_block_sharing": rng.random() < 0.7}
    margin = rng.choice(MARGINS)
    if margin is not None:
        o["safety_margin"] = margin
    return o


def rand_cfg(rng: random.Random, options: dict) -> EngineConfig:
    return EngineConfig("hf_cb", rng.choice([4, 4, 5, 8]), rng.randint(1, 10), rng.randint(1, 12),
                        rng.randint(1, 5), chunked_prefill=True, chunk_unit=rng.choice([0, 1]),
                        options=build_options(Options, options))


def rand_workload(rng: random.Random, most: int = SLOTS, prompt: int = 20, new: int = 12) -> Workload:
    """In 3 workloads of 4, most requests are in one of two prefix groups (the whole prompt shared
    in half of them, so that later arrivals match what earlier ones hashed)."""
    grouped = rng.random() < 0.75
    reqs = []
    for _ in range(rng.randint(1, most)):
        p = 0 if rng.random() < 0.05 else rng.randint(1, prompt)   # empty prompts: the crash rule
        max_new = rng.randint(1, new)
        output_len = rng.randint(1, max_new) if rng.random() < 0.25 else None
        cancel_at = rng.randint(0, 15) if rng.random() < 0.2 else None
        group = rng.choice([-1, 0, 0, 1]) if grouped else -1
        prefix_len = 0 if group < 0 else rng.choice([p, rng.randint(0, p)])
        reqs.append(RequestSpec(p, max_new, rng.randint(0, 5), output_len, cancel_at,
                                prefix_group=group, prefix_len=prefix_len))
    return Workload(tuple(reqs))


def random_case(seed: int):
    rng = random.Random(seed)
    return rand_cfg(rng, rand_options(rng)), rand_workload(rng)


def coverage(trace, seen: Counter) -> None:
    for prev, rec, cur in zip(trace.states, trace.records, trace.states[1:]):
        seen["soft reset"] += bool(rec.preempted)
        seen["soft reset, then a batch"] += bool(rec.preempted and rec.scheduled)
        seen[f"error {rec.error_kind}"] += rec.error_kind is not None
        seen["evicted"] += any("evicted" in n for n in rec.notes)
        seen["idle"] += any("idle" in n for n in rec.notes)
        seen["cancel"] += any("cancelled" in n for n in rec.notes)
        seen["prefix match"] += any("prefix match" in n for n in rec.notes)
        counts = [c for _, slots in cur.sched.slots for c in slots]
        seen["prefix block referenced twice"] += any(c >= 2 for c in counts)
        seen["cached prefix block"] += any(c == 0 for c in counts)
        # offloaded holding no block of its own: only prefix blocks (held, or matched in this step)
        seen["soft reset of a request holding only prefix blocks"] += any(
            prev.req(rid).blocks == 0 and (prev.req(rid).shared_blocks > 0 or
                                           any(n.startswith(f"r{rid} prefix match") for n in rec.notes))
            for rid in rec.preempted)
    seen["block_new at the end"] += bool(trace.final.sched.block_new) and trace.end != "error"


MUST_SEE = ("soft reset", "soft reset, then a batch", "error deadlock", "error crash", "evicted", "idle",
            "cancel", "block_new at the end", "prefix match", "prefix block referenced twice",
            "cached prefix block", "soft reset of a request holding only prefix blocks")

STRUCTURES = [
    {"scheduler_type": "fifo"},
    {"scheduler_type": "fifo", "safety_margin": 1 / 3, "allow_block_sharing": False},
    {"scheduler_type": "prefill_first"},
    {"scheduler_type": "prefill_first", "safety_margin": 0.5, "allow_block_sharing": True},
]


def structures():
    return [("-".join(map(str, s.values())), rand_cfg(random.Random(0), s)) for s in STRUCTURES]


def structure_case(template: EngineConfig, rng: random.Random):
    return dataclasses.replace(rand_cfg(rng, {}), options=template.options), rand_workload(rng, most=SLOTS)


def relation(template: EngineConfig, n: int):
    return CompiledRelation(CORES["hf_cb"], template, n)
