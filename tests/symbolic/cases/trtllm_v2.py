"""Random cases for the trtllm_v2 core (model/symbolic/cores/trtllm_v2.py)."""

import random
from collections import Counter

from checkers.differential import CompiledRelation
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES

DIFF_RUNS = 1000
RELATION_RUNS = 170     # per structure (6 structures)
SLOTS = 5
MAX_STEPS = 2000


def rand_options(rng: random.Random) -> Options:
    return Options(draft_len=rng.choice([0, 0, 1, 2]), enable_recompute_pause=rng.random() < 0.85,
                   fix_replay_fit=rng.random() < 0.4, fix_worst_case_admission=rng.random() < 0.4,
                   max_util_for_resume=rng.choice([0.95, 1.0, 0.8, 0.5]), stall_limit=rng.choice([1, 2, 3, 1000]))


def rand_cfg(rng: random.Random, options: Options, chunked: bool, chunk_unit=None) -> EngineConfig:
    unit = (rng.choice([0, 0, 1, 2]) if chunked else 0) if chunk_unit is None else chunk_unit
    return EngineConfig("trtllm_v2", block_size=rng.choice([1, 2, 4]), num_blocks=rng.randint(1, 10),
                        max_num_tokens=rng.randint(1, 16), max_batch_size=rng.randint(1, 4), host_blocks=0,
                        chunked_prefill=chunked, chunk_unit=unit, options=options)


def rand_workload(rng: random.Random, most: int = 5) -> Workload:
    reqs = []
    for _ in range(rng.randint(1, most)):
        max_new = rng.randint(1, 12)
        reqs.append(RequestSpec(prompt=rng.randint(1, 14), max_new=max_new, arrival=rng.randint(0, 5),
                                output_len=rng.choice([None, None, rng.randint(1, max_new)]),
                                cancel_at=rng.choice([None] * 4 + [rng.randint(0, 12)])))
    return Workload(tuple(reqs))


def random_case(seed: int):
    rng = random.Random(seed)
    return rand_cfg(rng, rand_options(rng), rng.random() < 0.4), rand_workload(rng)


def coverage(trace, seen: Counter) -> None:
    for rec in trace.records:
        seen["preempted"] += bool(rec.preempted)
        seen["finished"] += bool(rec.finished)
        seen["stall detector"] += rec.error_kind == "deadlock"
        seen["recompute pause"] += any("recompute-paused" in n for n in rec.notes)
        seen["cancelled"] += any("cancel" in n for n in rec.notes)
    seen[f"end {trace.end}"] += 1


MUST_SEE = ("preempted", "recompute pause", "finished", "stall detector", "cancelled", "end done", "end error")


def structures():
    rng = random.Random(7)
    return [(f"{unit}-{i}" if chunked else f"off-{i}",
             rand_cfg(rng, rand_options(rng), chunked, unit))
            for chunked, unit in ((False, 0), (True, 0), (True, 2)) for i in range(2)]


def structure_case(template: EngineConfig, rng: random.Random):
    cfg = rand_cfg(rng, template.options, template.chunked_prefill, template.chunk_unit)
    return cfg, rand_workload(rng, SLOTS)


def relation(template: EngineConfig, n: int):
    return CompiledRelation(CORES["trtllm_v2"], template, n)
