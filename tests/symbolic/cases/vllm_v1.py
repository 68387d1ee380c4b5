"""Random cases for the vllm_v1 core (model/symbolic/cores/vllm_v1.py): configurations vLLM accepts
(`VllmV1.check_config`), FCFS and priority, chunked prefill on and off, the scheduling caps, the
watermark, prefix caching (vLLM's default; with FCFS, the core's subset) in over half of them;
workloads with refusals, early stops, cancellations, pool pressure, and with prefix caching shared
prefixes (some prompts all prefix) whose requests race to compute them."""

import dataclasses
import random
from collections import Counter

from checkers import differential
from checkers.encode import int_var
from model.config import ConfigError, EngineConfig
from model.releases import RELEASES
from model.policies.vllm_v1 import Options
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload
from model.state import Phase
from model.symbolic.core import CORES
from model.symbolic.cores.vllm_v1 import PREFIX_BLOCKS

DIFF_RUNS = 1600        # prefix caching on in about 60% of them
RELATION_RUNS = 130     # per structure (8 structures)
SLOTS = 4
MAX_STEPS = 2000
WATERMARKS = [0.0, 0.0, 0.0, 0.1, 0.2, 0.25, 0.5]


def rand_cfg(rng: random.Random, chunked=None, policy=None, full_isl=None, watermark=None,
             pressure: bool = False, caching=None, release=None) -> EngineConfig:
    """A configuration vLLM accepts (VllmV1.check_config); `pressure` keeps the pool at its
    smallest so that decodes preempt; prefix caching (`caching`, else drawn) comes with FCFS; the release
    (model/releases.py, `release`, else drawn) is every release the policy mirrors."""
    apc = rng.random() < 0.6 if caching is None else caching
    if apc:
        policy = "fcfs"
    while True:
        bs = rng.choice([1, 2, 4, 4, 8, 8] if apc else [1, 2, 4, 8])   # with caching, more designs that share
        mml = rng.randint(2, 24)
        nb = 1 + -(-mml // bs) + (rng.randint(0, 1) if pressure else rng.randint(0, 3))
        ch = rng.random() < 0.5 if chunked is None else chunked
        mbs = rng.randint(1, 4)
        mnbt = rng.randint(mbs, mml + 6) if ch else rng.randint(max(mml, mbs), mml + 6)
        opts = dict(max_model_len=mml, enable_prefix_caching=apc, async_scheduling=False,
                    policy=policy or rng.choice(["fcfs", "priority"]),
                    watermark=rng.choice(WATERMARKS) if watermark is None else watermark)
        if rng.random() < 0.6:
            opts["max_num_scheduled_tokens"] = rng.randint(1, mnbt + 3)
        if rng.random() < 0.3:
            opts["max_num_active_seqs"] = rng.randint(1, mbs)
        if rng.random() < 0.4:
            opts["long_prefill_token_threshold"] = rng.randint(1, mml)
        isl = rng.random() < 0.7 if full_isl is None else full_isl
        opts["scheduler_reserve_full_isl"] = isl
        version = release or rng.choice(RELEASES["vllm_v1"])
        cfg = EngineConfig("vllm_v1", bs, nb, mnbt, mbs, chunked_prefill=ch, options=Options(**opts), version=version)
        try:
            POLICIES["vllm_v1"].check_config(cfg)
        except ConfigError:
            continue
        return cfg


def rand_workload(rng: random.Random, cfg: EngineConfig, most: int = 5, pressure: bool = False) -> Workload:
    """1..most requests; some prompts empty or too long (refused at admission), some early
    stops, some cancellations, priorities 0..2; `pressure`: short prompts, long outputs. With
    prefix caching, where the core keeps every block a prompt can share, most requests share one of
    one or two prefixes (the scenario loader's rule, 0 < prefix_len <= prompt), some prompts all prefix."""
    mml = cfg.options.max_model_len
    # shared prefixes where the core keeps every block a prompt can share (VllmV1Core.unsupported)
    sharing = cfg.options.enable_prefix_caching and (mml - 1) // cfg.block_size <= PREFIX_BLOCKS
    groups = rng.randint(0, 2) if sharing else 0
    reqs = []
    for _ in range(rng.randint(2 if pressure else 1, most)):
        if pressure:
            prompt, max_new = rng.randint(1, max(1, mml // 3)), rng.randint(mml // 2, 24)
        else:
            prompt = 0 if rng.random() < 0.05 else rng.randint(1, min(20, mml + 1))
            max_new = rng.randint(1, 20)
        output_len = rng.randint(1, max_new) if rng.random() < 0.25 else None
        cancel_at = rng.randint(0, 15) if rng.random() < 0.2 else None
        group, prefix = -1, 0
        if groups and prompt > 0 and rng.random() < 0.75:
            group = rng.randrange(groups)
            prefix = rng.randint(max(1, prompt // 2), prompt)
            if rng.random() < 0.25:   # all prefix (at a block boundary, vLLM recomputes the last block)
                prefix = prompt
        reqs.append(RequestSpec(prompt, max_new, rng.randint(0, 3 if pressure else 5), output_len, cancel_at,
                                prefix_group=group, prefix_len=prefix, priority=rng.randint(0, 2)))
    return Workload(tuple(reqs))


def random_case(seed: int, **structure):
    rng = random.Random(seed)
    pressure = rng.random() < 0.4
    cfg = rand_cfg(rng, pressure=pressure, **structure)
    return cfg, rand_workload(rng, cfg, pressure=pressure)


def coverage(trace, seen: Counter) -> None:
    """What a run exercised, read off the simulator's states and records."""
    cfg = trace.cfg
    o = cfg.options
    seen[f"chunked {cfg.chunked_prefill}"] += 1
    for s, rec in zip(trace.states, trace.records):
        running = s.sched.running
        seen["preempted itself, the loop went on (0.33)"] += any("the running loop goes on" in n for n in rec.notes)
        if rec.preempted:
            seen[f"preempt {o.policy}"] += 1
            seen["several victims in one step"] += len(rec.preempted) > 1
            # PRIORITY: a victim ahead (in list order) of a request scheduled in the same step
            # had its turn first; if it was scheduled, its budget comes back (S:813-832)
            last = max((running.index(rid) for rid, _ in rec.scheduled if rid in running), default=-1)
            seen["victim ahead of the current one"] += any(v in running and running.index(v) < last
                                                           for v in rec.preempted)
        seen["rejected"] += bool(rec.rejected)
        seen["cancelled"] += any("cancelled" in n for n in rec.notes)
        seen["prompt over the budget"] += any("chunked prefill off" in n for n in rec.notes)
        for rid, tokens in rec.scheduled:
            r = s.req(rid)
            if r.phase != Phase.DECODING and tokens < r.context_len - r.computed:
                seen["partial chunk"] += 1
                seen["long-prefill cap"] += tokens == o.long_prefill_token_threshold
        seen["active-seqs cap"] += bool(o.max_num_active_seqs and len(running) >= o.max_num_active_seqs
                                        and s.sched.waiting)
    seen[f"end {trace.end}"] += 1
    seen["wedged with a preempted head"] += trace.end == "fixpoint" and bool(trace.final.sched.waiting) and \
        trace.final.req(trace.final.sched.waiting[0]).preemptions > 0
    if o.enable_prefix_caching:
        seen["prefix caching"] += 1
        seen["prefix caching, preempt"] += any(rec.preempted for rec in trace.records)
        for pre, post in zip(trace.states, trace.states[1:]):
            pool_coverage(pre.sched, post.sched, seen)


def pool_coverage(pre, post, seen: Counter) -> None:
    """The block pool's mechanisms in one step, read off the policy's Sched (model/policies/vllm_v1.py Pool)."""
    for rid, blocks in post.req_blocks:
        if rid in pre.running:
            continue
        for b in blocks:   # an admitted request's blocks that were cached before the step: hits
            if pre.hashed[b] and pre.ident[b] == post.ident[b]:
                seen["hit a shared prefix" if pre.ident[b][0] == 0 else "hit its own blocks after preemption"] += 1
                seen["hit a free cached block"] += pre.ref[b] == 0
    seen["cached block evicted"] += any(pre.hashed[b] and pre.ref[b] == 0 and post.ident[b] != pre.ident[b]
                                        for b in range(len(pre.ref)))
    seen["duplicate cached copies"] += any(len(ids) > 1 for _, ids in post.cmap)
    seen["first copy free, a later one held"] += any(
        len(ids) > 1 and post.ref[ids[0]] == 0 and any(post.ref[b] for b in ids[1:]) for _, ids in post.cmap)


MUST_SEE = ("chunked True", "chunked False", "preempt fcfs", "preempt priority", "several victims in one step",
            "preempted itself, the loop went on (0.33)",
            "victim ahead of the current one", "rejected", "cancelled", "prompt over the budget", "partial chunk",
            "long-prefill cap", "active-seqs cap", "end done", "end fixpoint", "wedged with a preempted head",
            "prefix caching", "prefix caching, preempt", "hit a shared prefix", "hit its own blocks after preemption",
            "hit a free cached block", "cached block evicted", "duplicate cached copies",
            "first copy free, a later one held")


# The numeric options are symbolic in the relation too (the core never branches on them); an
# option left unset is fixed to what vLLM uses instead (S:132-141), which is the same step.
NUMERIC_OPTIONS = ("max_model_len", "max_num_scheduled_tokens", "max_num_active_seqs",
                   "long_prefill_token_threshold")


def option_values(cfg: EngineConfig) -> list:
    o = cfg.options
    return [o.max_model_len, o.max_num_scheduled_tokens or cfg.max_num_tokens,
            o.max_num_active_seqs or cfg.max_batch_size, o.long_prefill_token_threshold]


class CompiledRelation(differential.CompiledRelation):
    """The library's compiled relation with vLLM's numeric options symbolic too."""

    def __init__(self, core, template, n):
        self.option_vars = [int_var(f"o.{f}") for f in NUMERIC_OPTIONS]
        symbolic = dataclasses.replace(template.options, **dict(zip(NUMERIC_OPTIONS, self.option_vars)))
        super().__init__(core, dataclasses.replace(template, options=symbolic), n)

    def extra_inputs(self) -> list:
        return self.option_vars

    def extra_values(self, cfg: EngineConfig) -> list:
        return option_values(cfg)


# the release matters under PRIORITY (0.33) and with chunked prefill off (0.34; model/releases.py): each release
# in some of the structures where it matters
STRUCTURES = [dict(chunked=c, policy=p, full_isl=f, watermark=w, caching=a, release=r)
              for c, p, f, w, a, r in [(False, "fcfs", True, 0.0, False, "0.34"),
                                       (False, "priority", True, 0.25, False, "0.32"),
                                       (False, "fcfs", False, 0.1, False, "0.33"),
                                       (False, "priority", False, 0.0, False, "0.34"),
                                       (True, "fcfs", True, 0.0, False, "0.33"),
                                       (True, "priority", True, 0.0, False, "0.32"),
                                       (True, "fcfs", False, 0.5, False, "0.33"),
                                       (True, "priority", True, 0.2, False, "0.33"),
                                       (False, "fcfs", True, 0.0, True, "0.34"), (False, "fcfs", False, 0.2, True, "0.32"),
                                       (True, "fcfs", True, 0.0, True, "0.33"), (True, "fcfs", False, 0.1, True, "0.33")]]


def structures():
    return [("-".join(map(str, s.values())), random_case(0, **s)[0]) for s in STRUCTURES]


def structure_case(template: EngineConfig, rng: random.Random):
    o = template.options
    pressure = rng.random() < 0.4
    cfg = rand_cfg(rng, chunked=template.chunked_prefill, policy=o.policy, full_isl=o.scheduler_reserve_full_isl,
                   watermark=o.watermark, pressure=pressure, caching=o.enable_prefix_caching, release=template.version)
    return cfg, rand_workload(rng, cfg, most=SLOTS, pressure=pressure)


def relation(template: EngineConfig, n: int):
    return CompiledRelation(CORES["vllm_v1"], template, n)
