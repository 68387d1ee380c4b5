"""Random cases for the trtllm_v1 core (model/symbolic/cores/trtllm_v1.py): both capacity policies,
chunking, drafts, `max_input_len`, and block reuse (with a second generator that keeps the pool under
pressure so cache entries are evicted in order and shared blocks are paused, and a third in which a
batch's allocation evicts a prefix that a later request of the batch was charged as reused, the
shortfall behind #13318, with and without the post-allocation trim)."""

import dataclasses
import random
from collections import Counter

from checkers.differential import CompiledRelation
from model.config import EngineConfig
from model.policies.trtllm_v1 import GNE, MAX_UTIL, Options as V1Options
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES

DIFF_RUNS = 2000        # 1000 plain + 750 under block-reuse pressure + 250 reuse shortfalls
RELATION_RUNS = 125     # per structure (8 structures)
SLOTS = 5
MAX_STEPS = 200         # a pause livelock grows `preemptions` forever: no cycle ends it


def Options(**options) -> V1Options:
    """_executor_loop (disable_overlap_scheduler), the loop these cases were drawn for; the same cases in TensorRT-LLM's
    default overlap executor: test_core_trtllm_overlap.py (`overlap_case`)."""
    return V1Options(**{"disable_overlap_scheduler": True, **options})


def random_options(rng: random.Random) -> Options:
    return Options(capacity_scheduler_policy=rng.choice([GNE, MAX_UTIL]),
                   max_input_len=rng.choice([None, None, rng.randint(1, 24)]),
                   draft_len=rng.choice([0, 0, 1, 2, 3]),
                   enable_block_reuse=rng.random() < 0.6,
                   token_budget_trim=rng.random() < 0.7)


def random_numbers(rng: random.Random) -> dict:
    return dict(block_size=rng.randint(1, 5), num_blocks=rng.randint(1, 16), max_num_tokens=rng.randint(1, 28),
                max_batch_size=rng.randint(1, 5), host_blocks=rng.choice([0, 0, 0, 3]))


def random_config(rng: random.Random) -> EngineConfig:
    chunked = rng.random() < 0.5
    return EngineConfig("trtllm_v1", **random_numbers(rng), chunked_prefill=chunked,
                        chunk_unit=rng.choice([0, 0, 1, 2, 3]), options=random_options(rng))


def random_workload(rng: random.Random, max_requests: int = SLOTS) -> Workload:
    n = rng.randint(1, max_requests)
    groups = rng.randint(1, min(2, n))
    specs = []
    for _ in range(n):
        prompt = rng.randint(1, rng.choice([6, 12, 20]))
        max_new = rng.randint(1, rng.choice([4, 8, 20]))
        arrival = rng.randint(0, 5)
        output_len = rng.randint(1, max_new) if rng.random() < 0.25 else None
        cancel_at = arrival + rng.randint(0, 8) if rng.random() < 0.15 else None
        group, prefix = -1, 0
        if rng.random() < 0.65:   # scenario rule: group >= 0 and 0 < prefix_len <= prompt
            group, prefix = rng.randrange(groups) + (7 if rng.random() < 0.3 else 0), rng.randint(1, prompt)
        specs.append(RequestSpec(prompt, max_new, arrival, output_len, cancel_at, group, prefix))
    return Workload(tuple(specs))


def reuse_numbers(rng: random.Random) -> dict:
    return dict(random_numbers(rng), block_size=rng.randint(1, 3), num_blocks=rng.randint(4, 12),
                max_num_tokens=rng.randint(6, 28))


def reuse_workload(rng: random.Random) -> Workload:
    """Block reuse under pressure: requests arrive one after another, mostly each in a group of
    its own, so finished donors leave idle cache entries that later requests evict in order;
    some groups are shared, so MAX_UTILIZATION also pauses requests holding shared blocks."""
    n = rng.randint(2, SLOTS)
    specs, arrival = [], 0
    for _ in range(n):
        prompt, max_new = rng.randint(2, 12), rng.randint(1, 4)
        group = rng.randrange(n) * 3 if rng.random() < 0.8 else -1
        prefix = rng.randint(max(1, prompt - 2), prompt) if group >= 0 else 0
        specs.append(RequestSpec(prompt, max_new, arrival, rng.randint(1, max_new) if rng.random() < 0.15 else None,
                                 None, group, prefix))
        arrival += rng.randint(0, 4)
    return Workload(tuple(specs))


def shortfall_case(rng: random.Random, cfg: EngineConfig):
    """Two donors leave idle prefixes of a and b blocks (a the older); then x (no prefix) and y
    (a's prefix) arrive together. x's whole context is more blocks than are free, so allocating
    it evicts a's blocks before y's `add_sequence` can reuse them, while y was charged as if it
    would: y forwards more than it was charged."""
    bs, a, b = rng.randint(1, 3), rng.randint(2, 5), rng.randint(2, 5)
    num_blocks = a + b + rng.randint(2, 10)
    free = num_blocks - a - b
    x_blocks = rng.randint(free + 1, free + a)
    y_prompt = a * bs + rng.randint(1, 2 * bs)
    specs = (RequestSpec(a * bs + 1, 2, 0, None, None, 0, a * bs), RequestSpec(b * bs + 1, 2, 0, None, None, 1, b * bs),
             RequestSpec(x_blocks * bs - rng.randint(0, bs - 1), rng.randint(1, 3), 3),
             RequestSpec(y_prompt, rng.randint(1, 3), 3, None, None, 0, a * bs))
    cfg = dataclasses.replace(cfg, block_size=bs, num_blocks=num_blocks, max_num_tokens=rng.randint(8, 40),
                              options=dataclasses.replace(cfg.options, enable_block_reuse=True))
    return cfg, Workload(specs)


def random_case(seed: int):
    """Seeds below 1000: any case; 1000-1749: block reuse under pressure; from 1750 on: a reuse
    shortfall."""
    rng = random.Random(seed)
    cfg = random_config(rng)
    if seed < 1000:
        return cfg, random_workload(rng)
    if seed >= 1750:
        return shortfall_case(rng, cfg)
    cfg = dataclasses.replace(cfg, **reuse_numbers(rng),
                              options=dataclasses.replace(cfg.options, enable_block_reuse=True))
    return cfg, reuse_workload(rng)


CRASHES = ("Context compute tokens", "Can't allocate new blocks", "assert total_num_tokens")


def coverage(trace, seen: Counter) -> None:
    for t, rec in enumerate(trace.records):
        pre, post = trace.states[t], trace.states[t + 1]
        seen["preempted"] += bool(rec.preempted)
        seen["dropped at max_input_len"] += any(post.req(i).generated < pre.req(i).generated for i in rec.preempted)
        seen["reused prefix"] += any(post.req(rid).shared_blocks and pre.req(rid).computed == 0
                                     and any(e.group == pre.req(rid).prefix_group for e in pre.prefix_cache)
                                     for rid, _ in rec.scheduled)
        seen["evicted"] += len(post.prefix_cache) < len(pre.prefix_cache)
        seen["trimmed chunk"] += any(tok < pre.req(rid).remaining_context for rid, tok in rec.scheduled
                                     if pre.req(rid).phase.name != "DECODING")
        seen["charged below run"] += rec.charged < rec.num_tokens
        seen["shrunk after allocation"] += any("to fit max_num_tokens" in note for note in rec.notes)
        seen["finished"] += bool(rec.finished)
        seen["rejected"] += bool(rec.rejected)
        seen["evicted in order"] += any(e.refs == 0 and e in post.prefix_cache for e in pre.prefix_cache) and \
            len(post.prefix_cache) < len(pre.prefix_cache)
        seen["paused with shared blocks"] += any(pre.req(i).shared_blocks for i in rec.preempted)
        if rec.error:
            seen[next(k for k in CRASHES if k in rec.error)] += 1


MUST_SEE = ("preempted", "dropped at max_input_len", "reused prefix", "evicted", "evicted in order",
            "paused with shared blocks", "trimmed chunk", "charged below run", "shrunk after allocation", "finished",
            "rejected", *CRASHES)


def structures():
    """Each capacity policy x chunked prefill x block reuse, with drafts (none or some), chunk units
    and max_input_len spread over them."""
    out = []
    for i, (cap, chunked, reuse) in enumerate((c, ch, r) for c in (GNE, MAX_UTIL) for ch in (False, True)
                                               for r in (False, True)):
        draft, unit, max_input = [0, 2, 3, 0][i % 4], [0, 1, 2, 3][(i + i // 4) % 4], [None, 6, None, 12][(i + 1) % 4]
        out.append((f"{cap}-{'chunked' if chunked else 'whole'}-{'reuse' if reuse else 'noreuse'}",
                    EngineConfig("trtllm_v1", 4, 8, 16, 4, chunked_prefill=chunked, chunk_unit=unit,
                                 options=Options(capacity_scheduler_policy=cap, draft_len=draft,
                                                 max_input_len=max_input, enable_block_reuse=reuse))))
    return out


def structure_case(template: EngineConfig, rng: random.Random):
    reuse = template.options.enable_block_reuse and rng.random() < 0.5
    cfg = EngineConfig("trtllm_v1", **(reuse_numbers if reuse else random_numbers)(rng),
                       chunked_prefill=template.chunked_prefill, chunk_unit=template.chunk_unit,
                       options=template.options)
    return cfg, (reuse_workload if reuse else random_workload)(rng)


def relation(template: EngineConfig, n: int):
    return CompiledRelation(CORES["trtllm_v1"], template, n)
