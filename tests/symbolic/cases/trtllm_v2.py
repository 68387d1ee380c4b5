"""Random cases for the trtllm_v2 core (model/symbolic/cores/trtllm_v2.py): seeds below 1000 draw any
design (a host tier in about half of those fix B allows), seeds from 1000 on a host tier under page
pressure, so that suspensions to the host tier and on the GPU, resumptions, refused resumptions,
eviction retries and recompute pauses of suspended requests all happen."""

import dataclasses
import random
from collections import Counter

from checkers.differential import CompiledRelation
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options as V2Options
from model.simulator import RequestSpec, Workload
from model.state import Phase
from model.symbolic.core import CORES

DIFF_RUNS = 2000        # 1000 any design + 1000 with a host tier under pressure
RELATION_RUNS = 170     # per structure (6 structures)
SLOTS = 5
MAX_STEPS = 2000


def Options(**options) -> V2Options:
    """_executor_loop (disable_overlap_scheduler), the loop these cases were drawn for; the same cases in TensorRT-LLM's
    default overlap executor: test_core_trtllm_overlap.py (`overlap_case`)."""
    return V2Options(**{"disable_overlap_scheduler": True, **options})


def rand_options(rng: random.Random) -> Options:
    options = Options(draft_len=rng.choice([0, 0, 1, 2]), enable_recompute_pause=rng.random() < 0.85,
                      fix_replay_fit=rng.random() < 0.4, fix_worst_case_admission=rng.random() < 0.4,
                      max_util_for_resume=rng.choice([0.95, 1.0, 0.8, 0.5]), stall_limit=rng.choice([1, 2, 3, 1000]))
    # the repair B* widens fix B, so only with it (half of those designs)
    star = options.fix_worst_case_admission and rng.random() < 0.5
    return dataclasses.replace(options, reserve_every_worst_case=star)


def rand_host(rng: random.Random, options: Options) -> int:
    """Host blocks: none, a few (suspensions that do not fit stay on the GPU) or more; fix B is
    refused with a host tier (TrtllmV2.check_config)."""
    pick = rng.choice([0, 0, rng.randint(1, 3), rng.randint(1, 12)])
    return 0 if options.fix_worst_case_admission else pick


def rand_cfg(rng: random.Random, options: Options, chunked: bool, chunk_unit=None) -> EngineConfig:
    unit = (rng.choice([0, 0, 1, 2]) if chunked else 0) if chunk_unit is None else chunk_unit
    return EngineConfig("trtllm_v2", block_size=rng.choice([1, 2, 4]), num_blocks=rng.randint(1, 10),
                        max_num_tokens=rng.randint(1, 16), max_batch_size=rng.randint(1, 4),
                        host_blocks=rand_host(rng, options), chunked_prefill=chunked, chunk_unit=unit,
                        options=options)


def rand_workload(rng: random.Random, most: int = 5) -> Workload:
    reqs = []
    for _ in range(rng.randint(1, most)):
        max_new = rng.randint(1, 12)
        reqs.append(RequestSpec(prompt=rng.randint(1, 14), max_new=max_new, arrival=rng.randint(0, 5),
                                output_len=rng.choice([None, None, rng.randint(1, max_new)]),
                                cancel_at=rng.choice([None] * 4 + [rng.randint(0, 12)])))
    return Workload(tuple(reqs))


def pressure_cfg(rng: random.Random, options: Options, chunked: bool, chunk_unit=None) -> EngineConfig:
    """A host tier of 1-8 pages over a small pool, with budgets that let several requests decode
    at once: their growth runs the pool dry, so the ladder (evict, pause) runs every few steps."""
    unit = (rng.choice([0, 0, 1, 2]) if chunked else 0) if chunk_unit is None else chunk_unit
    return EngineConfig("trtllm_v2", block_size=rng.choice([1, 2, 2, 4]), num_blocks=rng.randint(2, 10),
                        max_num_tokens=rng.randint(4, 16), max_batch_size=rng.randint(1, 5),
                        host_blocks=rng.choice([rng.randint(1, 3), rng.randint(1, 8)]),
                        chunked_prefill=chunked, chunk_unit=unit, options=options)


def pressure_workload(rng: random.Random, most: int = SLOTS) -> Workload:
    """Short prompts, longer outputs, early arrivals: requests decode side by side and outgrow
    the pool together."""
    reqs = []
    for _ in range(rng.randint(2, most)):
        max_new = rng.randint(2, 16)
        reqs.append(RequestSpec(prompt=rng.randint(1, 8), max_new=max_new, arrival=rng.randint(0, 3),
                                output_len=rng.choice([None, None, None, rng.randint(1, max_new)]),
                                cancel_at=rng.choice([None] * 6 + [rng.randint(0, 12)])))
    return Workload(tuple(reqs))


def random_case(seed: int):
    """Seeds below 1000: any design; from 1000 on: a host tier under pressure (fix B off, which
    a host tier excludes)."""
    rng = random.Random(seed)
    if seed < 1000:
        return rand_cfg(rng, rand_options(rng), rng.random() < 0.4), rand_workload(rng)
    # the detector's own limit (1000) is drawn below 1000; here a short one keeps each run short
    options = Options(**{**rand_options(rng).__dict__, "fix_worst_case_admission": False,
                         "reserve_every_worst_case": False, "stall_limit": rng.choice([1, 2, 3, 30])})
    return pressure_cfg(rng, options, rng.random() < 0.4), pressure_workload(rng)


def coverage(trace, seen: Counter) -> None:
    host = trace.cfg.host_blocks > 0
    for t, rec in enumerate(trace.records):
        seen["preempted"] += bool(rec.preempted)
        seen["finished"] += bool(rec.finished)
        seen["stall detector"] += rec.error_kind == "deadlock"
        seen["recompute pause"] += any("recompute-paused" in n for n in rec.notes)
        seen["cancelled"] += any("cancel" in n for n in rec.notes)
        if not host:
            continue
        pre, post = trace.states[t], trace.states[t + 1]
        for r in pre.requests:
            a = post.req(r.rid)
            seen["suspended to the host tier"] += r.host_blocks == 0 and a.host_blocks > 0
            seen["suspended on the GPU (host tier full)"] += r.rid in rec.offloaded and a.suspended and a.blocks > 0
            seen["resumed from the host tier"] += r.host_blocks > 0 and a.host_blocks == 0 and a.blocks > 0
            # suspend() only takes an active request: suspended before and offloaded now means it
            # was resumed, failed to grow and suspended itself again (the self-eviction loop)
            seen["resumed and suspended again"] += r.suspended and r.rid in rec.offloaded and a.suspended
            seen["recompute pause of a suspended request"] += r.suspended and r.rid in rec.preempted
        # A decoder suspended on the host tier that the generation loop reached (every decoder
        # before it scheduled, within the batch cap and the budget, nothing evicted) and that
        # stays there unscheduled, not offloaded again, not paused: its resumption was refused
        # (by the gate or for want of free pages).
        per = 1 + trace.cfg.options.draft_len
        scheduled = {rid for rid, _ in rec.scheduled}
        before = 0
        for r in pre.requests:
            if not r.phase.unfinished:
                continue
            if r.phase == Phase.DECODING and r.suspended and r.host_blocks > 0 and not rec.offloaded \
                    and before < trace.cfg.max_batch_size and (before + 1) * per <= trace.cfg.max_num_tokens:
                a = post.req(r.rid)
                seen["resume refused"] += (a.suspended and a.host_blocks == r.host_blocks
                                           and r.rid not in scheduled and r.rid not in rec.preempted)
            if r.phase == Phase.DECODING:
                if r.rid not in scheduled:
                    break
                before += 1
    seen[f"end {trace.end}"] += 1
    seen["host tier"] += host


MUST_SEE = ("preempted", "recompute pause", "finished", "stall detector", "cancelled", "end done", "end error",
            "host tier", "suspended to the host tier", "suspended on the GPU (host tier full)",
            "resumed from the host tier", "resumed and suspended again", "recompute pause of a suspended request",
            "resume refused")


def structures():
    rng = random.Random(7)
    return [(f"{unit}-{i}" if chunked else f"off-{i}",
             rand_cfg(rng, rand_options(rng), chunked, unit))
            for chunked, unit in ((False, 0), (True, 0), (True, 2)) for i in range(2)]


def structure_case(template: EngineConfig, rng: random.Random):
    """Half of the cases under host-tier pressure where the options allow a host tier."""
    if not template.options.fix_worst_case_admission and rng.random() < 0.5:
        cfg = pressure_cfg(rng, template.options, template.chunked_prefill, template.chunk_unit)
        return cfg, pressure_workload(rng, SLOTS)
    cfg = rand_cfg(rng, template.options, template.chunked_prefill, template.chunk_unit)
    return cfg, rand_workload(rng, SLOTS)


def relation(template: EngineConfig, n: int):
    return CompiledRelation(CORES["trtllm_v2"], template, n)
