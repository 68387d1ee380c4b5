"""Random cases for the sglang core (model/symbolic/cores/sglang.py): its subset is ignore_eos on and chunked
prefill off. Small pools and long outputs make decode retraction and the last request's abort common; small
context lengths make the arrival clip and the input-length abort act; a few requests per step and several
steps of arrivals set and clear the `batch_is_full` latch."""

import dataclasses
import random
from collections import Counter

from checkers.differential import CompiledRelation
from model.config import EngineConfig
from model.policies.sglang import Options
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES

DIFF_RUNS = 1000
RELATION_RUNS = 250     # per structure (2 structures)
SLOTS = 5
MAX_STEPS = 3000


def rand_cfg(rng: random.Random, options: Options = None) -> EngineConfig:
    options = options or Options(disable_overlap_schedule=True, ignore_eos=True, disable_radix_cache=True,
                                 context_len=rng.choice([None, None, None, 12, 24]))
    return EngineConfig("sglang", block_size=rng.choice([1, 1, 2, 4]), num_blocks=rng.randint(4, 24),
                        max_num_tokens=rng.randint(2, 24), max_batch_size=rng.randint(1, 4), options=options)


def rand_workload(rng: random.Random, most: int = SLOTS) -> Workload:
    reqs = []
    for _ in range(rng.randint(1, most)):
        max_new = rng.randint(1, 16)
        reqs.append(RequestSpec(prompt=rng.randint(1, 16), max_new=max_new, arrival=rng.randint(0, 5),
                                output_len=rng.choice([None, None, rng.randint(1, max_new)]),
                                cancel_at=rng.choice([None] * 4 + [rng.randint(0, 14)])))
    return Workload(tuple(reqs))


def random_case(seed: int):
    rng = random.Random(seed)
    while True:
        cfg = rand_cfg(rng)
        if CORES["sglang"].unsupported(cfg) is None:
            return cfg, rand_workload(rng)


def coverage(trace, seen: Counter) -> None:
    for prev, rec, cur in zip(trace.states, trace.records, trace.states[1:]):
        seen["retract"] += bool(rec.preempted)
        seen["cancel queued"] += any(cur.req(r.rid).phase == 9 and r.phase in (1, 4) for r in prev.requests)
        seen["input-length abort"] += bool(rec.rejected)
        seen["latch set"] += cur.sched.batch_is_full and not prev.sched.batch_is_full
        seen["latch cleared"] += prev.sched.batch_is_full and not cur.sched.batch_is_full
        seen["two admitted in one pass"] += sum(1 for rid, _ in rec.scheduled if prev.req(rid).phase != 3) > 1
        seen["cancel in flight"] += any(rid in prev.sched.to_finish for rid, _ in rec.scheduled)
        seen["clipped"] += any(cap < trace.workload.requests[rid].max_new for rid, cap in cur.sched.caps)
    seen[f"end {trace.end}"] += 1


# No decode retraction (nor the last request's abort) happens with ignore_eos: admission's finish-order
# simulation reserves every running request's whole remaining output (no run of the 1000 retracts, tests/symbolic/test_core_sglang.py; the policy's
# own tests cover retraction with ignore_eos off, outside this core's subset).
MUST_SEE = ("input-length abort", "latch set", "latch cleared", "two admitted in one pass", "cancel in flight",
            "cancel queued", "clipped", "end fixpoint", "end done")

STRUCTURES = [Options(disable_overlap_schedule=True, ignore_eos=True, disable_radix_cache=True),
              Options(disable_overlap_schedule=True, ignore_eos=True, disable_radix_cache=True, context_len=12)]


def structures():
    return [(f"ctx{o.context_len}", rand_cfg(random.Random(0), o)) for o in STRUCTURES]


def structure_case(template: EngineConfig, rng: random.Random):
    return dataclasses.replace(rand_cfg(rng, template.options)), rand_workload(rng)


def relation(template: EngineConfig, n: int):
    return CompiledRelation(CORES["sglang"], template, n)
