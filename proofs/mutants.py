"""Planted bugs that must not be proved "for any number of requests" (issue: "for any number of
requests must be earned").

Each `Mutant` is a plausible scheduler bug that needs several requests (a count over the slots, a
position in a list, a loop bound), planted in the core and in the engine-checked policy alike
(`proofs/plant.py`): a faithful model of an engine that had the bug. Each comes with a witness, a
design and workload inside the class of the claim it breaks, on which the mutated simulator (and the
mutated core) violates the claim's property while the real ones do not. `prove` must not report the
claim for any number of requests while the bug is planted: tests/symbolic/test_mutants.py checks
each, and `bench/mutants.py` prints the table (and `--find` searches a witness for a new mutant).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Optional

from model.config import EngineConfig
from model.simulator import RequestSpec, Workload, simulate
from model.symbolic.ops import Concrete
from model.symbolic.run import run_core
from model.symbolic.core import CORES
from model.symbolic.slots import Knobs, Params
from model.policy import POLICIES
from properties import evaluate
from properties.symbolic import Transition, violations

from .claims import CLAIMS, Claim
from .plant import Patch, planted

CONCRETE = Concrete()


@dataclasses.dataclass(frozen=True)
class Witness:
    cfg: EngineConfig
    workload: Workload


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    story: str                  # the bug, in a scheduler engineer's words
    claims: tuple[str, ...]     # the claims it breaks (each must then not be proved for any n)
    patches: tuple[Patch, ...]  # in the core and in the policy
    witness: Optional[Witness] = None


def claim(name: str) -> Claim:
    return next(c for c in CLAIMS if c.name == name)


def W(*requests: tuple) -> Workload:
    """A workload from (prompt, max_new, arrival[, output_len, cancel_at]) tuples."""
    return Workload(tuple(RequestSpec(*r) for r in requests))


# -- checking a witness -----------------------------------------------------------------------------
def in_class(c: Claim, cfg: EngineConfig, workload: Workload) -> bool:
    """The design's numbers within the claim's knob bounds, its structure the claim's, and every workload
    constraint of the class true of the workload."""
    for name, bound in c.knob_bounds.items():
        v = getattr(cfg, name)
        if v < bound[0] or (bound[1] is not None and v > bound[1]):
            return False
    t = c.design
    if (cfg.policy, cfg.chunked_prefill, cfg.options) != (t.policy, t.chunked_prefill, t.options):
        return False
    if c.block_sizes and cfg.block_size not in c.block_sizes:
        return False
    cons = c.workload(CONCRETE, Knobs.of(cfg), Params.of(workload)) if c.workload is not None else []
    return all(bool(x) for x in cons)


def violates(c: Claim, cfg: EngineConfig, workload: Workload, max_steps: int = 2000) -> bool:
    """The claim's property fails on the simulator's run (the policy as registered now)."""
    trace = simulate(cfg, workload, max_steps=max_steps)
    reqs = trace.states[0].requests
    policy = POLICIES[cfg.policy]
    ev = evaluate(trace, lambda rid: policy.fits_alone(cfg, reqs[rid]), max_overtakes=10_000)
    return ev.violated(c.property)


def core_violates(c: Claim, cfg: EngineConfig, workload: Workload, max_steps: int = 2000) -> bool:
    """The claim's property fails on the core's run (the core as registered now), by the conditions `check`
    uses (properties/symbolic.py, evaluated on ints; tests/symbolic/test_properties_symbolic.py holds them to
    the registry)."""
    k, p = Knobs.of(cfg), Params.of(workload)
    run = run_core(CORES[cfg.policy], k, p, max_steps)
    u = _Run(CORES[cfg.policy], _Enc(k, p), run.states, [])
    for t, rec in enumerate(run.records):
        u.transitions.append(Transition(t, run.states[t], run.states[t + 1], rec, True, 1))
        if violations(CONCRETE, u, u.transitions[-1])[c.property][0]:
            return True
    return False


@dataclasses.dataclass
class _Enc:
    knobs: Knobs
    params: Params


@dataclasses.dataclass
class _Run:
    """What `properties.symbolic.violations` reads of an unrolling, for one concrete run of a core."""
    core: object
    enc: _Enc
    states: list
    transitions: list


def design_for(c: Claim, rng: random.Random) -> EngineConfig:
    """A design of the claim's structure with small numbers within its knob bounds (one of its block sizes)."""
    numbers = {}
    for name, (lo, hi) in c.knob_bounds.items():
        numbers[name] = rng.randint(lo, min(hi if hi is not None else lo + 40, lo + 40))
    if c.block_sizes:
        numbers["block_size"] = rng.choice(c.block_sizes)
    elif "block_size" in numbers:
        numbers["block_size"] = rng.randint(1, 4)
    return dataclasses.replace(c.design, **numbers)


def find_witness(m: Mutant, c: Claim, seed: int = 0, tries: int = 3000,
                 requests: tuple[int, int] = (5, 16)) -> Optional[Witness]:
    """A design and workload in `c`'s class on which the mutated simulator violates the claim's property
    and the real one does not (`design_for`; the workload short requests arriving close together, so that
    many compete in one step), then made smaller while it still does (`shrink`)."""
    rng = random.Random(seed)
    for _ in range(tries):
        cfg = design_for(c, rng)
        n = rng.randint(*requests)
        wl = W(*[(rng.randint(1, 12), rng.randint(1, 12), rng.randint(0, 3)) for _ in range(n)])
        if not in_class(c, cfg, wl) or violates(c, cfg, wl):
            continue
        with planted(list(m.patches)):
            if violates(c, cfg, wl):
                return shrink(m, c, Witness(cfg, wl))
    return None


def breaks(m: Mutant, c: Claim, w: Witness) -> bool:
    """`w` is in the class, the real simulator keeps the claim on it and the mutated one does not."""
    if not in_class(c, w.cfg, w.workload) or violates(c, w.cfg, w.workload):
        return False
    with planted(list(m.patches)):
        return violates(c, w.cfg, w.workload)


def shrink(m: Mutant, c: Claim, w: Witness) -> Witness:
    """Drop requests, then lower each number, while `breaks` still holds."""
    changed = True
    while changed:
        changed = False
        reqs = list(w.workload.requests)
        candidates = [reqs[:j] + reqs[j + 1:] for j in range(len(reqs))]
        for j, r in enumerate(reqs):
            for field in ("prompt", "max_new", "arrival"):
                v = getattr(r, field)
                if v > (0 if field == "arrival" else 1):
                    candidates.append(reqs[:j] + [dataclasses.replace(r, **{field: v - 1})] + reqs[j + 1:])
        for cand in candidates:
            smaller = Witness(w.cfg, Workload(tuple(cand)))
            if breaks(m, c, smaller):
                w, changed = smaller, True
                break
    return w


# -- the bugs -------------------------------------------------------------------------------------------
def cores(policy: str) -> str:
    return f"model.symbolic.cores.{policy}"


def policies(policy: str) -> str:
    return f"model.policies.{policy}"


VLLM_CLAIMS = ("vllm-chunked-fits-alone", "vllm-chunked-fits-alone-caching", "vllm-whole-prefill-within-budget")
V1_CLAIMS = ("v1-budget-without-reuse", "v1-budget-without-reuse-max-util")
# the A+B claims where fix B acts (in C2 nothing outgrows, so fix B never does: a bug in it cannot break that one)
V2_FIX_B_CLAIMS = ("v2-ab-outgrowing", "v2-ab-reserve-all", "v2-ab-outgrowing-first")
SGLANG_CLAIMS = ("sglang-ignore-eos-below-clip", "sglang-ignore-eos-paged")
HF_CLAIMS = ("hf-fits-alone-no-fatal", "hf-fits-alone-no-fatal-prefill-first")


def vllm_spare_block(waiting: int) -> Mutant:
    return Mutant(
        f"vllm-spare-block-{waiting}-waiting",
        f"vLLM's admission keeps a spare block free once {waiting} or more requests wait (counted over the queue), so "
        f"a request that needs the whole pool is never admitted when it is among {waiting}",
        VLLM_CLAIMS,
        (Patch(cores("vllm_v1"), "        wm = ops.ite(num_running > 0, self.watermark_blocks, 0)\n",
               f"        wm = ops.ite(num_running > 0, self.watermark_blocks, 0) + "
               f"ops.ite(ops.count(self.in_waiting) >= {waiting}, 1, 0)\n"),
         Patch(policies("vllm_v1"), "        wm = self.watermark_blocks if self.running else 0\n",
               f"        wm = (self.watermark_blocks if self.running else 0) + (1 if len(self.waiting) >= {waiting} "
               f"else 0)\n")))


def vllm_backoff(running: int) -> Mutant:
    return Mutant(
        f"vllm-backoff-{running}-running",
        f"vLLM's running loop backs off (ends the loop, preempting nothing) when a request is short of blocks while "
        f"{running} or more requests run, so a full pool with {running} runners never moves again",
        VLLM_CLAIMS,
        (Patch(cores("vllm_v1"), "            short = ops.and_(go, need > free)                      # KM:575-579: "
                                 "the allocation fails\n",
               "            short = ops.and_(go, need > free)                      # KM:575-579: the allocation fails\n"
               f"            backoff = ops.and_(short, ops.count(self.in_running) >= {running})\n"
               "            short = ops.and_(short, ops.not_(backoff))\n"),
         Patch(cores("vllm_v1"), "            ok = ops.and_(go, ops.not_(itself))\n",
               "            ok = ops.and_(go, ops.not_(itself), ops.not_(backoff))\n"),
         Patch(cores("vllm_v1"), "            stopped = ops.or_(stopped, itself)\n",
               "            stopped = ops.or_(stopped, itself, backoff)\n"),
         Patch(policies("vllm_v1"), "            ok = False\n            while True:",
               f"            if len(self.running) >= {running} and \\\n"
               "                    self.cfg.blocks_for(min(r.computed + n, self.mml)) - self.held(rid) > self.free:\n"
               "                break\n"
               "            ok = False\n            while True:")))


def v1_fifth_uncharged() -> Mutant:
    return Mutant(
        "v1-fifth-uncharged",
        "TensorRT-LLM V1's micro-batch leaves a generation request uncharged once four requests are in the batch "
        "before it (counted over the batch), so five or more decoders can run more tokens than max_num_tokens",
        V1_CLAIMS,
        (Patch(cores("trtllm_v1"), "            batch_tokens = ops.ite(take_dec, batch_tokens + t, batch_tokens)\n",
               "            full = ops.count(self.batched[j] for j in range(n) if j != i) >= 4\n"
               "            batch_tokens = ops.ite(take_dec, batch_tokens + ops.ite(full, 0, t), batch_tokens)\n"),
         Patch(policies("trtllm_v1"), "                out.append((rid, 1, draft, t))\n                batch_tokens += t\n",
               "                out.append((rid, 1, draft, t))\n"
               "                batch_tokens += t if len(out) <= 4 else 0\n")))


def v1_whole_past_fourth() -> Mutant:
    return Mutant(
        "v1-whole-past-fourth",
        "TensorRT-LLM V1's chunker trims only the contexts of the first four requests (in submission order); a "
        "later one goes whole whatever the budget left",
        V1_CLAIMS[:1],
        (Patch(cores("trtllm_v1"), "            chunks[i] = size\n",
               "            size = size if i < 4 else suggested\n            chunks[i] = size\n"),
         Patch(policies("trtllm_v1"), "            chunks[rid] = size\n            left -= ",
               "            size = size if rid < 4 else suggested\n            chunks[rid] = size\n            left -= ")))


def v1_drafts_past_fourth() -> Mutant:
    return Mutant(
        "v1-drafts-past-fourth",
        "TensorRT-LLM V1 fits draft tokens into the budget only for the first four requests (in submission order); "
        "a later one keeps all its drafts",
        V1_CLAIMS[:1],
        (Patch(cores("trtllm_v1"), "            kept[i] = ops.ite(last, fitted, 0)\n",
               "            kept[i] = ops.ite(last, fitted if i < 4 else d, 0)\n"),
         Patch(policies("trtllm_v1"), "            k = max(0, min(self.o.draft_len, space, capacity - used))\n",
               "            k = max(0, min(self.o.draft_len, space, capacity - used)) if rid < 4 else self.o.draft_len\n")))


def v2_fix_b_from(position: int) -> Mutant:
    """In the micro-steps, which are the core's step for these designs (model/symbolic/cores/trtllm_v2_micro.py)."""
    return Mutant(
        f"v2-fix-b-first-{position}",
        f"TensorRT-LLM V2's fix B checks the reservation only for the first {position} requests of the queue; a "
        f"later one is admitted on its current pages whatever the others reserve",
        V2_FIX_B_CLAIMS,
        (Patch(cores("trtllm_v2_micro"), "                    fits = ops.and_(self.can_fit(st, remaining + d), "
                                         "self.admissible_worst_case(st, r))\n",
               "                    fits = ops.and_(self.can_fit(st, remaining + d),\n"
               f"                                    ops.or_(c >= {position}, self.admissible_worst_case(st, r)))\n"),
         Patch(policies("trtllm_v2"), "        if not self.o.fix_worst_case_admission or self.can_evict or "
                                      "self.cfg.chunked_prefill:\n            return True\n",
               "        if not self.o.fix_worst_case_admission or self.can_evict or self.cfg.chunked_prefill:\n"
               f"            return True\n        if rid >= {position}:\n            return True\n")))


def sglang_page_less(position: int) -> Mutant:
    return Mutant(
        f"sglang-page-less-at-{position}",
        f"SGLang returns one page less than the request held when a request finishes at position {position} or later "
        f"of the running batch, so the pool shrinks under a busy batch until a request no longer fits",
        SGLANG_CLAIMS,
        (Patch(cores("sglang"), "                    with G.when(ops.and_(ops.not_(to_finish), r[\"generated\"] >= r[\"cap\"])):\n"
                                "                        self.finish(G, k, p, x, i)\n",
               "                    with G.when(ops.and_(ops.not_(to_finish), r[\"generated\"] >= r[\"cap\"])):\n"
               f"                        lost = ops.ite(r[\"rpos\"] >= {position}, 1, 0)\n"
               "                        self.finish(G, k, p, x, i)\n"
               "                        G.set(x.g, \"free_blocks\", x.g[\"free_blocks\"] - lost)\n"),
         Patch(policies("sglang_overlap"), "            state = policy.finish(cfg, state, rid)\n            finished.append",
               f"            lost = 1 if rid in s.running and s.running.index(rid) >= {position} else 0\n"
               "            state = policy.finish(cfg, state, rid)\n"
               "            state = replace(state, free_blocks=state.free_blocks - lost)\n"
               "            finished.append")))


def hf_crowded_fatal(active: int) -> Mutant:
    return Mutant(
        f"hf-fatal-with-{active}-active",
        f"transformers declares \"No requests can be scheduled and no requests can be offloaded\" as soon as the batch "
        f"comes back empty with {active} or more active requests, instead of offloading",
        HF_CLAIMS,
        (Patch(cores("hf_cb"), "        dead = self.plan.decided(\"offload1.dead\", ops.or_(ops.not_(ops.or_(evicted, "
                               "offloaded)), none2))\n",
               "        dead = self.plan.decided(\"offload1.dead\", ops.or_(ops.not_(ops.or_(evicted, offloaded)), none2,\n"
               f"                                                        ops.count(active) >= {active}))\n"),
         Patch(policies("hf_cb"), "        while batch is None:                                    # :506\n"
                                  "            if not self.offload_requests():                     # :508\n",
               "        while batch is None:                                    # :506\n"
               f"            crowded = len(self.sched.active) >= {active}\n"
               "            if not self.offload_requests() or crowded:          # :508\n")))


def at(claim_name: str, **numbers) -> EngineConfig:
    """The claim's design with these numbers."""
    return dataclasses.replace(claim(claim_name).design, **numbers)


def witnessed(m: Mutant, cfg: EngineConfig, workload: Workload) -> Mutant:
    return dataclasses.replace(m, witness=Witness(cfg, workload))


# The witnesses were found by `find_witness` (bench/mutants.py --find NAME prints one), except three the search
# did not reach in its draws, written by hand in the shape the bug needs: SGLang's, a batch of small requests
# whose later members finish (the pages lost), then one that asks for nearly the pool; transformers' with six
# active, seven equal requests arriving together on a pool that holds fewer.
MUTANTS: list[Mutant] = [
    witnessed(vllm_spare_block(4), at("vllm-chunked-fits-alone", num_blocks=2, max_num_tokens=29, max_batch_size=11),
              W((6, 4, 0), (8, 7, 0), (6, 1, 0), (8, 5, 1), (9, 1, 2), (11, 1, 3), (12, 3, 3), (2, 12, 3))),
    witnessed(vllm_spare_block(6), at("vllm-chunked-fits-alone", num_blocks=2, max_num_tokens=29, max_batch_size=11),
              W((6, 4, 0), (8, 7, 0), (6, 1, 0), (8, 5, 1), (9, 1, 2), (11, 1, 3), (12, 3, 3), (2, 12, 3))),
    witnessed(vllm_backoff(4), at("vllm-chunked-fits-alone", num_blocks=5, max_num_tokens=41, max_batch_size=34),
              W((1, 1, 0), (3, 6, 0), (5, 11, 0), (4, 6, 0), (6, 5, 0), (9, 1, 1), (4, 6, 2), (10, 2, 2), (11, 9, 3),
                (10, 8, 3), (5, 12, 3), (3, 2, 3), (11, 4, 3), (9, 4, 3), (6, 9, 3))),
    witnessed(vllm_backoff(6), at("vllm-chunked-fits-alone", num_blocks=11, max_num_tokens=33, max_batch_size=14),
              W((12, 12, 0), (4, 2, 0), (10, 9, 0), (1, 8, 0), (7, 6, 0), (3, 2, 1), (6, 7, 1), (8, 10, 2), (11, 8, 2),
                (12, 7, 2), (5, 8, 2), (10, 8, 2), (2, 8, 3), (10, 6, 3), (2, 11, 3))),
    witnessed(v1_fifth_uncharged(), at("v1-budget-without-reuse", block_size=4, num_blocks=40, max_num_tokens=19,
                                       max_batch_size=9),
              W((12, 11, 0), (9, 4, 0), (11, 2, 0), (9, 5, 0), (1, 9, 1), (7, 8, 2), (4, 8, 2), (1, 8, 2), (4, 2, 3))),
    witnessed(v1_whole_past_fourth(), at("v1-budget-without-reuse", block_size=4, num_blocks=27, max_num_tokens=3,
                                         max_batch_size=17),
              W((5, 3, 0), (5, 2, 0), (9, 5, 0), (9, 1, 0), (10, 4, 1), (10, 5, 1), (7, 6, 1), (5, 8, 2), (9, 2, 2),
                (11, 6, 3), (9, 8, 3))),
    witnessed(v1_drafts_past_fourth(), at("v1-budget-without-reuse", block_size=4, num_blocks=26, max_num_tokens=12,
                                          max_batch_size=27),
              W((8, 11, 0), (10, 8, 0), (4, 5, 0), (4, 8, 2), (9, 3, 2), (8, 4, 2), (1, 12, 3))),
    witnessed(v2_fix_b_from(4), at("v2-ab-outgrowing", block_size=4, num_blocks=7, max_num_tokens=10, max_batch_size=15),
              W((1, 10, 0), (1, 10, 0), (1, 12, 0), (4, 10, 0), (5, 10, 0))),
    witnessed(v2_fix_b_from(6), at("v2-ab-outgrowing", block_size=4, num_blocks=7, max_num_tokens=12, max_batch_size=34),
              W((2, 11, 0), (5, 8, 0), (10, 3, 0), (5, 8, 0), (3, 10, 0), (10, 8, 0), (7, 7, 0))),
    witnessed(sglang_page_less(4), at("sglang-ignore-eos-below-clip", block_size=1, num_blocks=20, max_num_tokens=64,
                                      max_batch_size=8),
              W(*[(1, 2, 0)] * 6, (1, 16, 6))),
    witnessed(sglang_page_less(6), at("sglang-ignore-eos-below-clip", block_size=1, num_blocks=30, max_num_tokens=64,
                                      max_batch_size=8),
              W(*[(1, 2, 0)] * 8, (1, 26, 6))),
    witnessed(hf_crowded_fatal(4), at("hf-fits-alone-no-fatal", block_size=4, num_blocks=11, max_num_tokens=16,
                                      max_batch_size=33),
              W((7, 4, 0), (3, 7, 0), (12, 8, 0), (3, 10, 1), (6, 10, 1), (10, 7, 1), (10, 7, 2), (11, 7, 2),
                (9, 10, 3), (10, 12, 3), (11, 10, 3), (4, 7, 3))),
    witnessed(hf_crowded_fatal(6), at("hf-fits-alone-no-fatal", block_size=4, num_blocks=6, max_num_tokens=16,
                                      max_batch_size=16),
              W(*[(2, 4, 0)] * 7)),
]
