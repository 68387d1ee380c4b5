"""The claims `schedproof prove` decides: each a design, a parametric class, and the expected outcome.

A claim says: for every design of `design`'s structure whose numeric knobs lie in `knob_bounds`,
and every workload satisfying `workload` (on top of induction.workload_constraints: any prompt,
output, arrival, early stop and cancellation), no step of any run violates `property`: by default
LIVE-NO-PROGRESS (the environment quiet, work unfinished, a step that schedules nothing and
changes no request), or a one-step safety property (ENGINE-ERROR, SAFE-BUDGET, ...).

- method "induction": the core's invariants plus the claim's `invariants` are proved inductive
  (init, step, decode-run) for `slots` request slots, and then the property's obligation
  (checkers/induction.py `property_obligation`) from them alone. Holds at every depth, for up to
  max(slots) requests; for any number of requests where `parametric` names an argument of
  checkers/parametric and it goes through.
- method "bmc": the claim is expected to fail; the bounded search over `space` must find the
  property, and the counterexample must replay on the core and the engine-checked simulator.

Symbols used in the classes (draft length d, the design's option; block_size b):
  worst(r)  = cdiv(prompt + max_new + d, b)   fix B's worst case (a bound on the pages r ever holds)
  outgrows  = prompt + max_new + d > max_num_tokens   (its replay can outgrow the budget)
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Callable, Optional

import model.policies  # noqa: F401  (registers the policies)
from model.config import EngineConfig
from model.policies.hf_cb import Options as HfOptions
from model.policies.sglang import Options as SglangOptions
from model.policies.trtllm_v1 import MAX_UTIL
from model.policies.trtllm_v1 import Options as V1Options
from model.policies.trtllm_v2 import Options as V2Options
from model.policies.vllm_v1 import NULL_BLOCKS
from model.symbolic.core import CORES
from model.symbolic.cores.vllm_v1 import pool_facts as vllm_pool_facts
from model.policies.vllm_v1 import Options as VllmOptions
from checkers.induction import any_params, symbolic_knobs, workload_constraints
from checkers.space import Group, Space
from model.symbolic.ops import Symbolic
from model.symbolic.overlap import FIELD as OVERLAP_FIELD
from model.symbolic.overlap import overlap
from model.symbolic.slots import (DECODING, OFFLOADED, PREEMPTED, PREFILLING, Knobs, Params, SlotState,
                                  unfinished)

HOLDS, FAILS = "holds", "fails"
# neither proved nor refuted, and recorded so (proofs/modes.py: a claim's twin in its engine's default loop, where
# the claim's own argument does not go through and no trace was found): reported as it comes out, never unexpected
OPEN = "open"
_SYM = Symbolic()


@dataclasses.dataclass(frozen=True)
class Claim:
    policy: str
    name: str
    statement: str                   # one line
    design: EngineConfig             # structure and options; numbers are the template's
    class_text: str                  # the class, in words (exactly what knob_bounds and workload say)
    expected: str                    # HOLDS | FAILS | OPEN
    method: str                      # "induction" | "bmc"
    knob_bounds: dict = dataclasses.field(default_factory=dict)   # Knobs.NUMERIC name -> (lo, hi | None)
    workload: Optional[Callable[[object, Knobs, Params], list]] = None   # (ops, k, p) -> constraints
    invariants: Optional[Callable[[object, Knobs, Params, SlotState], dict]] = None   # extra, named
    block_sizes: tuple[int, ...] = ()   # induction: one proof per concrete block size
    slots: tuple[int, ...] = (2, 3)     # induction: request slots
    space: Optional[Space] = None       # bmc: the design and workloads searched
    max_depth: int = 12                 # bmc
    # induction: the argument for any number of requests (checkers/parametric), if there is one
    # for this claim: "c1" (trtllm_v2 with fixes A+B in C1, or A+B* in C0), "c2" (trtllm_v2 in
    # C2) or "c3" (A+B in C3); the array model applies the class to one index at a time: `workload`
    # on one slot, or `per_request` where the class relates requests. "local": one request's step
    # with the others as an environment (checkers/parametric/local.py: trtllm_v1's SAFE-BUDGET;
    # local_vllm.py and local_sglang.py: LIVE-NO-PROGRESS; local_hf.py: transformers' ENGINE-ERROR)
    parametric: Optional[str] = None
    # expected to hold for any number of requests: the argument's every premise checked on the core as
    # written (docs/symbolic.md, "Any number of requests: the checked route"); a claim that then comes out
    # only "for up to n" is not as expected (`prove` exits 1 and names it)
    any_n: bool = False
    # the class at one request of the array model, where `workload` relates several requests (C3)
    per_request: Optional[Callable[[object, Knobs, dict], list]] = None
    property: str = "LIVE-NO-PROGRESS"
    # its share of `prove`'s time against the others' (proofs/run.py decide_claims): about its cost,
    # measured on a loaded 2-core machine in units of about 30 s
    weight: float = 1.0



# -- the class vocabulary ----------------------------------------------------------------
def worst_pages(ops, k: Knobs, w: dict):
    return k.blocks_for(ops, w["prompt"] + w["max_new"] + k.options.draft_len)


def outgrows(k: Knobs, w: dict):
    return w["prompt"] + w["max_new"] + k.options.draft_len > k.max_num_tokens


def reserved(k: Knobs, w: dict):
    """Whose worst case fix B counts: the requests that can outgrow their replay, or every request
    with the repair B* (`reserve_every_worst_case`)."""
    return True if k.options.reserve_every_worst_case else outgrows(k, w)


def fits_alone(ops, k: Knobs, w: dict):
    """The request can ever run with chunking off (its prompt fits the budget) and fix B can admit it
    (its worst case fits the pool): fact (1); outside this, fix B leaves it waiting forever."""
    return ops.and_(w["prompt"] + k.options.draft_len <= k.max_num_tokens, worst_pages(ops, k, w) <= k.num_blocks)


def util_fraction(k: Knobs) -> tuple[int, int]:
    f = Fraction(k.options.max_util_for_resume).limit_denominator(10 ** 6)
    return f.numerator, f.denominator


def all_outgrow(ops, k: Knobs, p: Params) -> list:
    """C1: every request fits alone and can outgrow its replay budget (the field report's row 1)."""
    return [ops.implies(w["present"], ops.and_(fits_alone(ops, k, w), outgrows(k, w))) for w in p.slots]


def outgrowing_first(ops, k: Knobs, p: Params) -> list:
    """C3: every request fits alone, and the requests that can outgrow their replay come first in
    arrival order (slot order; ties keep submission order): none arrives after one that cannot."""
    out = [ops.implies(w["present"], fits_alone(ops, k, w)) for w in p.slots]
    for a, b in zip(p.slots, p.slots[1:]):
        out.append(ops.implies(ops.and_(b["present"], outgrows(k, b)), outgrows(k, a)))
    return out


def outgrowing_first_at(ops, k: Knobs, r: dict) -> list:
    """C3 at one request of the array model (checkers/parametric): it fits alone, and it can outgrow
    exactly when its queue position is below the workload's number of requests that can, i.e. those
    come first. For n slots this is `outgrowing_first` with `outgrowing` = how many present slots
    outgrow (present slots come first)."""
    return [ops.implies(r["present"], ops.and_(fits_alone(ops, k, r), outgrows(k, r) == (r["index"] < r["outgrowing"])))]


def every_request_fits_alone(ops, k: Knobs, p: Params) -> list:
    """C0: every request fits alone (what any class needs, fact (1) below); nothing else."""
    return [ops.implies(w["present"], fits_alone(ops, k, w)) for w in p.slots]


def none_outgrow_within_gate(ops, k: Knobs, p: Params) -> list:
    """C2: no request can outgrow its replay budget (row 2), and its worst case stays within the
    resume gate: worst(r) <= max_util_for_resume * num_blocks."""
    num, den = util_fraction(k)
    return [ops.implies(w["present"], ops.and_(ops.not_(outgrows(k, w)),
                                               worst_pages(ops, k, w) * den <= num * k.num_blocks))
            for w in p.slots]


# -- invariants that hold only under the fixes or only in a class ---------------------------
def reservation(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Fix B's invariant (chunking off, no host tier): the worst cases of the admitted requests that
    can outgrow their replay (every admitted request, with B*) fit the pool together. B checks
    exactly this sum (plus the current pages of the others) before it admits one; a paused request
    leaves the sum and re-enters it only through B again."""
    held = []
    for w, r in zip(p.slots, s.req):
        counted = ops.and_(w["present"], unfinished(ops, r["phase"]), reserved(k, w),
                           ops.or_(r["blocks"] > 0, r["phase"] == DECODING))
        held.append(ops.ite(counted, worst_pages(ops, k, w), 0))
    return {"reservation": ops.sum(held) <= k.num_blocks}


def c1_invariants(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """In C1 with fix B (or in C0 with B*) every admitted request is in the reservation, so no growth
    ever fails: no eviction (suspension), no recompute pause, no preemption for pages happens."""
    inv = reservation(ops, k, p, s)
    for i, r in enumerate(s.req):
        inv[f"r{i}.never-suspended"] = ops.not_(r["suspended"])
        inv[f"r{i}.never-paused"] = r["phase"] != PREEMPTED
    return inv


def paused_replay_fits(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Fix A's invariant (chunking off): a recompute-paused request's replay fits the budget. A
    pauses only such requests, and a paused request generates nothing until it is replayed."""
    return {f"r{i}.paused-replay-fits": ops.implies(r["phase"] == PREEMPTED,
                                                    w["prompt"] + r["generated"] + k.options.draft_len
                                                    <= k.max_num_tokens)
            for i, (w, r) in enumerate(zip(p.slots, s.req))}


def paused_replay_fits_overlap(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """`paused_replay_fits` in the overlap loop (model/symbolic/overlap.py), where a victim's in-flight token still
    lands after fix A checked its replay (prompt + generated, that token not yet counted): A's check stays exact
    because no victim is in flight. A recompute-pause victim is one this pass did not suspend (no host tier), so
    it is not evictable: suspended in an earlier pass, which a request in flight never is (a suspended request is
    not scheduled, and the pass suspends only requests it has not scheduled; the launch clears `in_flight` of the
    others); a context's preemption victim is never in flight either (the generation loop suspended every decoder
    after the one it stopped at)."""
    inv = paused_replay_fits(ops, k, p, s)
    for i, r in enumerate(s.req):
        inv[f"r{i}.in-flight-not-suspended"] = ops.implies(r[OVERLAP_FIELD], ops.not_(r["suspended"]))
    return inv


def c3_invariants(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """C3's invariants; in the overlap loop with `paused_replay_fits_overlap` (in `_executor_loop` exactly
    `reservation` and `paused_replay_fits`)."""
    replay = paused_replay_fits_overlap if overlap(k) else paused_replay_fits
    return {**reservation(ops, k, p, s), **replay(ops, k, p, s)}


# -- transformers continuous batching (hf_cb) ------------------------------------------------
def hf_fits_alone(ops, k: Knobs, w: dict):
    """The policy's own `HfCb.fits_alone` (R18 / R15, verified 54/54 on the real engine): the last
    sampled token's KV is never written, so alone a request needs prompt + max_new - 1 tokens of pages."""
    return w["prompt"] + w["max_new"] - 1 <= k.num_blocks * k.block_size


def hf_every_request_fits(ops, k: Knobs, p: Params) -> list:
    return [ops.implies(w["present"], hf_fits_alone(ops, k, w)) for w in p.slots]


def hf_pages_match(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Between steps a running request holds exactly the pages of its computed tokens, its own plus
    the shared prefix blocks it references (a chunk's pages are allocated when it is scheduled and
    its tokens are computed in that step; de-duplication moves a page from one count to the other),
    and no request is ever OFFLOADED (no CPU swap pool: every offload is a soft reset). With these
    the lone request the offload loop keeps always fits once the cache is evicted."""
    inv = {}
    for i, r in enumerate(s.req):
        running = ops.or_(r["phase"] == PREFILLING, r["phase"] == DECODING)
        inv[f"r{i}.hf-no-offloaded"] = r["phase"] != OFFLOADED
        inv[f"r{i}.hf-pages"] = ops.implies(running, r["blocks"] + r["shared_blocks"]
                                            == k.blocks_for(ops, r["computed"]))
    return inv


def hf(num_blocks=4, max_num_tokens=8, block_size=4, max_batch_size=8, **options) -> EngineConfig:
    """transformers continuous batching: page_size, num_blocks, max_batch_tokens, max_requests_per_batch;
    prefills always split by the budget (chunked prefill on), no CPU offload pool."""
    return EngineConfig("hf_cb", block_size, num_blocks, max_num_tokens, max_batch_size, 0, True, 0,
                        HfOptions(**options))


# hf_cb refuses more than 2^15 blocks (its exact safety-margin test, model/symbolic/cores/hf_cb.py)
HF_ANY = {"num_blocks": (1, 1 << 15), "max_num_tokens": (1, None), "max_batch_size": (1, None)}


# -- SGLang (sglang) ---------------------------------------------------------------------------
def sglang(num_blocks=64, max_num_tokens=64, block_size=1, max_batch_size=4, **options) -> EngineConfig:
    """SGLang 0.5.23 with the radix cache off, chunked prefill off and ignore_eos requests, in event_loop_normal
    (the sglang core's subset: model/symbolic/cores/sglang.py; the core also expresses the default overlap loop,
    where each claim's twin is decided: proofs/modes.py)."""
    options = {"ignore_eos": True, "disable_radix_cache": True, "disable_overlap_schedule": True, **options}
    return EngineConfig("sglang", block_size, num_blocks, max_num_tokens, max_batch_size,
                        options=SglangOptions(**options))


# check_config: max_req_len - 5 = pool - 6 must be positive
SGLANG_ANY = {"num_blocks": (7, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)}


def sglang_below_clip(ops, k: Knobs, p: Params) -> list:
    """Every request asks for at most the pool less its page-rounded prompt, a page and 2 tokens: one token below
    what the arrival clip lets through (max_new_tokens_for_memory: pool - ceil_page(prompt) - page - 1)."""
    pool = k.num_blocks * k.block_size
    return [ops.implies(w["present"], w["max_new"] + k.blocks_for(ops, w["prompt"]) * k.block_size + k.block_size + 2
                        <= pool) for w in p.slots]


def sglang_within_two_pages(ops, k: Knobs, p: Params) -> list:
    """Every request asks for at most the pool less its prompt, two pages and a token: for page size 1 the same bound
    as `sglang_below_clip`; for larger pages up to a page below the arrival clip's bound, which leaves room for a
    queued request's context rounded up to a page."""
    pool = k.num_blocks * k.block_size
    return [ops.implies(w["present"], w["max_new"] + w["prompt"] + 2 * k.block_size + 1 <= pool) for w in p.slots]


# -- vLLM V1 (vllm_v1) -------------------------------------------------------------------------
# max_model_len in the designs below is far above every request, so vLLM's refusal of longer prompts
# (IP:557-602) and its stop at max_model_len (U:114-119) never act. That loses nothing: a design with a
# smaller max_model_len M runs a workload as this one runs the workload with the refused requests
# removed and each max_new cut to M - prompt, and its start-up check (num_blocks - 1 >= cdiv(M, b))
# makes every such request fit the pool alone, which is the class below.
VLLM_MML = 1 << 20


def vllm_fits_alone(ops, k: Knobs, w: dict):
    """The policy's `VllmV1.fits_alone` with max_model_len out of reach: the largest footprint,
    prompt + max_new - 1 tokens (the last sampled token is never written), fits the usable pool (the
    null block is not usable, BP:184-188)."""
    return ops.and_(w["prompt"] + w["max_new"] <= VLLM_MML,
                    k.blocks_for(ops, w["prompt"] + w["max_new"] - 1) <= k.num_blocks - NULL_BLOCKS)


def vllm_every_request_fits(ops, k: Knobs, p: Params) -> list:
    return [ops.implies(w["present"], vllm_fits_alone(ops, k, w)) for w in p.slots]


def vllm_pages_match(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Prefix caching off: a running request holds exactly the pages of its computed tokens
    (`allocate_slots` tops its blocks up to the tokens it schedules, which the step computes; a
    preemption frees them all), and vLLM never suspends or offloads (no such state exists)."""
    inv = {}
    for i, r in enumerate(s.req):
        running = ops.or_(r["phase"] == PREFILLING, r["phase"] == DECODING)
        inv[f"r{i}.vllm-no-suspension"] = ops.and_(ops.not_(r["suspended"]), r["phase"] != OFFLOADED)
        inv[f"r{i}.vllm-pages"] = ops.implies(running, r["blocks"] == k.blocks_for(ops, r["computed"]))
    return inv


def vllm_pages_match_cached(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Prefix caching on: the same, plus what the core's pool encoding rests on (`pool_facts`:
    hashed full blocks, the packing of cached copies, a queued request's own run after its group's
    cached prefix), which together with the core's pool invariants is inductive here."""
    return {**vllm_pages_match(ops, k, p, s), **vllm_pool_facts(ops, k, p, s)}


def no_shared_prefixes(ops, k: Knobs, p: Params) -> list:
    return [w["prefix_group"] < 0 for w in p.slots]


def vllm(num_blocks=8, max_num_tokens=16, block_size=16, max_batch_size=4, chunked_prefill=True,
         **options) -> EngineConfig:
    """vLLM V1: num_gpu_blocks (null block included), max_num_batched_tokens, max_num_seqs. The claims are about
    the synchronous `Scheduler` loop (async_scheduling off); their twins in vLLM's default loop (async scheduling,
    expressed by the symbolic core with prefix caching off and on) are proofs/modes.py's."""
    options = {"max_model_len": VLLM_MML, "async_scheduling": False, **options}
    return EngineConfig("vllm_v1", block_size, num_blocks, max_num_tokens, max_batch_size, 0, chunked_prefill, 0,
                        VllmOptions(**options))


# SchedulerConfig: max_num_batched_tokens >= max_num_seqs (SC:315-326)
VLLM_ANY = {"num_blocks": (2, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)}


def replay_within_budget(ops, k: Knobs, p: Params) -> list:
    return [ops.implies(w["present"], w["prompt"] + w["max_new"] <= k.max_num_tokens) for w in p.slots]


def vllm_batch_within_budget(ops, k: Knobs, p: Params) -> list:
    return [k.max_batch_size <= k.max_num_tokens]


def vllm_class(*extra):
    """The workload of a vLLM claim: what SchedulerConfig requires (max_num_seqs <= max_num_batched_tokens),
    every request fitting the pool alone, and the `extra` conditions."""
    def workload(ops, k: Knobs, p: Params) -> list:
        out = vllm_batch_within_budget(ops, k, p) + vllm_every_request_fits(ops, k, p)
        for more in extra:
            out += more(ops, k, p)
        return out
    return workload


VLLM_KNOBS = "block_size 16; num_gpu_blocks >= 2, max_num_batched_tokens >= max_num_seqs >= 1 symbolic; FCFS; "
# the recompute wedge's design (scenarios/vllm-chunked-off-recompute-wedge.toml)
VLLM_WEDGE = vllm(3, 32, 16, 2, chunked_prefill=False, max_model_len=32, max_num_scheduled_tokens=2,
                  enable_prefix_caching=False)


# -- TensorRT-LLM V1 (trtllm_v1) ---------------------------------------------------------------
def v1(num_blocks=64, max_num_tokens=192, block_size=4, max_batch_size=8, chunked_prefill=True,
       **options) -> EngineConfig:
    """TensorRT-LLM V1 `SimpleScheduler`: tokens_per_block, primary blocks, max_num_tokens, max_batch_size; in
    `_executor_loop` (disable_overlap_scheduler, the loop the claims were written for and the any-n arguments take
    apart; the default loop is each claim's twin, proofs/modes.py)."""
    options = {"disable_overlap_scheduler": True, **options}
    return EngineConfig("trtllm_v1", block_size, num_blocks, max_num_tokens, max_batch_size, 0, chunked_prefill, 0,
                        V1Options(**options))


def v1_reuse_space(design: EngineConfig) -> Space:
    """#13318's shape (scenarios/trtllm-v1-reuse-budget-overshoot.toml) at 1/8 of its sizes, the two late
    prompts ranged: r0 and r1 leave idle prefixes of groups 1 (20 blocks, the older) and 2 (10 blocks);
    r2 and r3 (group 1's prefix) arrive together at step 3."""
    return small_space(design,
                       Group(1, {"prompt": 81, "max_new": 2, "arrival": 0, "prefix_len": 80}, prefix_group=1),
                       Group(1, {"prompt": 41, "max_new": 2, "arrival": 0, "prefix_len": 40}, prefix_group=2),
                       Group(1, {"prompt": (100, 140), "max_new": 8, "arrival": 3}),
                       Group(1, {"prompt": (81, 90), "max_new": 8, "arrival": 3, "prefix_len": 80}, prefix_group=1))


def v1_trim_floor_space(design: EngineConfig) -> Space:
    """The trim's floor: r0 and r1 (prompt 9, groups 1 and 2's 8-token prefixes) run one after the other
    and leave idle prefixes (group 1 the older); r2 (prompt 2-12) and r3 (prompt 5-12, group 1's prefix)
    arrive together at step 6; the budget ranged 4-16."""
    space = small_space(design,
                        Group(1, {"prompt": 9, "max_new": 2, "arrival": 0, "prefix_len": 8}, prefix_group=1),
                        Group(1, {"prompt": 9, "max_new": 2, "arrival": 3, "prefix_len": 8}, prefix_group=2),
                        Group(1, {"prompt": (2, 12), "max_new": 1, "arrival": 6}),
                        Group(1, {"prompt": (5, 12), "max_new": 1, "arrival": 6, "prefix_len": 8}, prefix_group=1))
    return dataclasses.replace(space, knobs={**space.knobs, "max_num_tokens": (4, 16)})


V1_WITHOUT_REUSE_CLASS = ("block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len 1; block "
                          "reuse off; any workload, arrivals, early stops, cancellations")
V1_REUSE_UNTRIMMED = v1(enable_block_reuse=True, token_budget_trim=False)
V1_REUSE_WHOLE = v1(chunked_prefill=False, enable_block_reuse=True)
V1_TRIM_FLOOR = v1(num_blocks=5, max_num_tokens=4, block_size=4, enable_block_reuse=True)
V1_REUSE_CLASS = ("block_size 4, 64 blocks, max_num_tokens 192, max_batch_size 8, GUARANTEED_NO_EVICT; r0 81 tokens "
                  "(group 1's 80-token prefix) and r1 41 (group 2's 40) at step 0; r2 prompt 100-140 and r3 prompt "
                  "81-90 (group 1) at step 3")


# -- designs -------------------------------------------------------------------------------
def v2(num_blocks=272, max_num_tokens=2048, block_size=32, max_batch_size=64, **options) -> EngineConfig:
    """The field report's design (seeds.md 3): chunked prefill off, GPU-only KV cache; in `_executor_loop`
    (disable_overlap_scheduler, the loop the claims were written for and the any-n arguments take apart; the default
    loop is each claim's twin, proofs/modes.py)."""
    options = {"disable_overlap_scheduler": True, **options}
    return EngineConfig("trtllm_v2", block_size, num_blocks, max_num_tokens, max_batch_size, 0, False, 0,
                        V2Options(**options))


AB = dict(fix_replay_fit=True, fix_worst_case_admission=True)
AB_STAR = dict(AB, reserve_every_worst_case=True)   # the repair of B for mixed workloads (B*)
ANY = {"block_size": (1, None), "num_blocks": (1, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)}


def small_space(design: EngineConfig, *groups: Group) -> Space:
    knobs = {name: getattr(design, name) for name in Knobs.NUMERIC}
    return Space(design, knobs, tuple(groups), early_stops=False, cancellations=False)


CLAIMS: list[Claim] = [
    # -- proved ---------------------------------------------------------------------------------
    Claim("trtllm_v2", "v2-ab-outgrowing",
          "V2 with fixes A+B, chunking off, no host tier: no no-progress state when every request can outgrow its "
          "replay (the field report's row 1)",
          v2(**AB),
          "C1: block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len d = 0; "
          "max_util_for_resume 0.95; any arrivals, early stops, cancellations; every request: "
          "prompt + d <= max_num_tokens, worst <= num_blocks, prompt + max_new + d > max_num_tokens",
          HOLDS, "induction", knob_bounds=ANY, workload=all_outgrow, invariants=c1_invariants, parametric="c1",
          any_n=True, weight=3),
    Claim("trtllm_v2", "v2-ab-reserve-all",
          "V2 with fix A and the repair B* (fix B reserving the worst case of every admitted request, not only of "
          "those that can outgrow their replay), chunking off, no host tier: no no-progress state for any "
          "workload whose requests each fit alone (closes v2-ab-mixed)",
          v2(**AB_STAR),
          "C0: block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len d = 0; "
          "max_util_for_resume 0.95; any arrivals, early stops, cancellations; every request: "
          "prompt + d <= max_num_tokens, worst <= num_blocks",
          HOLDS, "induction", knob_bounds=ANY, workload=every_request_fits_alone, invariants=c1_invariants,
          parametric="c1", any_n=True, weight=3),
    Claim("trtllm_v2", "v2-ab-outgrowing-first",
          "V2 with fixes A+B and max_util_for_resume 1.0: no no-progress state when the requests that can outgrow "
          "their replay arrive before those that cannot",
          v2(max_util_for_resume=1.0, **AB),
          "C3: block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len d = 0; "
          "max_util_for_resume 1.0; any arrivals, early stops, cancellations; every request: "
          "prompt + d <= max_num_tokens, worst <= num_blocks; no outgrowing request after one that is not "
          "(in arrival order)",
          HOLDS, "induction", knob_bounds=ANY, workload=outgrowing_first, invariants=c3_invariants, parametric="c3",
          per_request=outgrowing_first_at, any_n=True, weight=2),
    Claim("trtllm_v2", "v2-ab-within-budget",
          "V2 with fixes A+B (inactive here, so also V2 as released), chunking off: no no-progress state when no "
          "replay can outgrow the budget and every worst case is within the resume gate (row 2)",
          v2(**AB),
          "C2: block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len d = 0; "
          "max_util_for_resume 0.95; any arrivals, early stops, cancellations; every request: "
          "prompt + max_new + d <= max_num_tokens, worst <= 0.95 * num_blocks",
          HOLDS, "induction", knob_bounds=ANY, workload=none_outgrow_within_gate, parametric="c2", any_n=True,
          weight=1.5),
    # -- refuted --------------------------------------------------------------------------------
    Claim("trtllm_v2", "v2-fix-a-alone",
          "V2 with fix A alone, chunking off: a no-progress state is reachable even in class C1",
          v2(fix_replay_fit=True),
          "inside C1: block_size 4, num_blocks 10, max_num_tokens 16, max_batch_size 8; 1-3 requests, prompt 9-16, "
          "max_new 8-24 (every request outgrows, worst <= 10 pages), arrivals 0-6",
          FAILS, "bmc",
          space=small_space(v2(fix_replay_fit=True, num_blocks=10, max_num_tokens=16, block_size=4, max_batch_size=8),
                            Group((1, 3), {"prompt": (9, 16), "max_new": (8, 24), "arrival": (0, 6)}))),
    Claim("trtllm_v2", "v2-original",
          "V2 as released (no fixes), chunking off: a no-progress state is reachable in class C1 (the field "
          "failure, #21826)",
          v2(),
          "inside C1: block_size 4, num_blocks 10, max_num_tokens 16, max_batch_size 8; 1-3 requests, prompt 9-16, "
          "max_new 8-24, arrivals 0-6",
          FAILS, "bmc",
          space=small_space(v2(num_blocks=10, max_num_tokens=16, block_size=4, max_batch_size=8),
                            Group((1, 3), {"prompt": (9, 16), "max_new": (8, 24), "arrival": (0, 6)}))),
    Claim("trtllm_v2", "v2-ab-mixed",
          "V2 with fixes A+B, even with max_util_for_resume 1.0: a no-progress state is reachable when a request "
          "that cannot outgrow runs ahead of one that can (outside C3; every request fits alone)",
          v2(max_util_for_resume=1.0, **AB),
          "block_size 4, num_blocks 10, max_num_tokens 16, max_batch_size 8, max_util_for_resume 1.0; 1-2 requests, "
          "prompt 1-16, max_new 1-24 (every worst case <= 10 pages), arrivals 0-6",
          FAILS, "bmc",
          space=small_space(v2(max_util_for_resume=1.0, num_blocks=10, max_num_tokens=16, block_size=4,
                               max_batch_size=8, **AB),
                            Group((1, 2), {"prompt": (1, 16), "max_new": (1, 24), "arrival": (0, 6)}))),
    Claim("trtllm_v2", "v2-ab-resume-gate",
          "V2 with fixes A+B at max_util_for_resume 0.95: the resume gate wedges a suspended outgrowing request "
          "whose reserved pages exceed 0.95 of the pool (C3 needs the gate off)",
          v2(**AB),
          "inside C3 but at 0.95: block_size 1, num_blocks 41, max_num_tokens 20, max_batch_size 8; r0 1+40 "
          "(outgrows, worst 41 pages) at step 0, then r1 prompt 1, max_new 1-10, arriving 0-40",
          FAILS, "bmc",
          space=small_space(v2(num_blocks=41, max_num_tokens=20, block_size=1, max_batch_size=8, **AB),
                            Group(1, {"prompt": 1, "max_new": 40, "arrival": 0}),
                            Group(1, {"prompt": 1, "max_new": (1, 10), "arrival": (0, 40)}))),
    Claim("trtllm_v2", "v2-ab-resume-gate-within-budget",
          "V2 with fixes A+B at 0.95, no replay can outgrow the budget, but a worst case above 0.95 of the pool: "
          "the resume gate wedges a lone suspended request (C2 needs its gate bound)",
          v2(**AB),
          "C2 without its gate bound: block_size 1, num_blocks 41, max_num_tokens 41, max_batch_size 8; r0 1+40 "
          "(worst 41 pages) at step 0, then r1 prompt 1, max_new 1-10, arriving 0-40",
          FAILS, "bmc",
          space=small_space(v2(num_blocks=41, max_num_tokens=41, block_size=1, max_batch_size=8, **AB),
                            Group(1, {"prompt": 1, "max_new": 40, "arrival": 0}),
                            Group(1, {"prompt": 1, "max_new": (1, 10), "arrival": (0, 40)}))),
    # -- transformers continuous batching ----------------------------------------------------------
    Claim("hf_cb", "hf-fits-alone-no-fatal",
          "transformers CB (FIFO scheduler, block sharing on, default safety margin): the fatal RuntimeError "
          "\"No requests can be scheduled and no requests can be offloaded\" never fires when every request fits "
          "the cache alone",
          hf(),
          "page_size 4 and 16; num_blocks 1..2^15, max_batch_tokens, max_requests_per_batch >= 1 symbolic; any "
          "arrivals, early stops, cancellations, shared prefixes; every request: prompt + max_new - 1 <= "
          "num_blocks * page_size",
          HOLDS, "induction", knob_bounds=HF_ANY, workload=hf_every_request_fits, invariants=hf_pages_match,
          block_sizes=(4, 16), property="ENGINE-ERROR", parametric="local", weight=25),
    Claim("hf_cb", "hf-fits-alone-no-fatal-prefill-first",
          "transformers CB with the prefill-first scheduler (block sharing on): the fatal RuntimeError never fires "
          "when every request fits the cache alone",
          hf(scheduler_type="prefill_first"),
          "page_size 4; num_blocks 1..2^15, max_batch_tokens, max_requests_per_batch >= 1 symbolic; any "
          "arrivals, early stops, cancellations, shared prefixes; every request: prompt + max_new - 1 <= "
          "num_blocks * page_size",
          HOLDS, "induction", knob_bounds=HF_ANY, workload=hf_every_request_fits, invariants=hf_pages_match,
          block_sizes=(4,), property="ENGINE-ERROR", parametric="local", weight=10),
    Claim("hf_cb", "hf-too-large-fatal",
          "transformers CB: one request that does not fit the cache alone kills the engine with the fatal "
          "RuntimeError, failing every request in flight (seeds.md 1; with hf-fits-alone-no-fatal: fatal iff some "
          "request does not fit alone)",
          hf(),
          "page_size 4, 4 pages, max_batch_tokens 8, 8 requests per batch; 1-3 requests, prompt 1-20, max_new 1-4, "
          "arrivals 0-1",
          FAILS, "bmc", property="ENGINE-ERROR", max_depth=8, weight=4,
          space=small_space(hf(), Group((1, 3), {"prompt": (1, 20), "max_new": (1, 4), "arrival": (0, 1)}))),
    Claim("hf_cb", "hf-cancel-after-soft-reset",
          "transformers CB: cancelling the only active request right after a soft reset leaves block_new_requests "
          "set, and the soft-reset request is never scheduled again (a permanent idle with a request owed an "
          "answer), though every request fits alone",
          hf(),
          "page_size 4, 4 pages, max_batch_tokens 8, 8 requests per batch; two requests of prompt 5, max_new 8 "
          "(12 tokens each: both fit alone, not together) at step 0, the second cancelled at step 1-6",
          FAILS, "bmc", max_depth=8,
          space=small_space(hf(), Group(1, {"prompt": 5, "max_new": 8, "arrival": 0}),
                            Group(1, {"prompt": 5, "max_new": 8, "arrival": 0, "cancel_at": (1, 6)}))),
    # -- vLLM V1 -------------------------------------------------------------------------------------
    Claim("vllm_v1", "vllm-chunked-fits-alone",
          "vLLM V1 with chunked prefill on (FCFS, prefix caching off, no watermark): no no-progress state when every "
          "request fits the pool alone (what vLLM's start-up check gives every request within max_model_len)",
          vllm(enable_prefix_caching=False),
          VLLM_KNOBS + "prefix caching off; watermark 0; any arrivals, early stops, cancellations; every request: "
          "cdiv(prompt + max_new - 1, 16) <= num_gpu_blocks - 1 (and prompt + max_new <= max_model_len = 2^20)",
          HOLDS, "induction", knob_bounds=VLLM_ANY, invariants=vllm_pages_match,
          parametric="local", weight=1.5, workload=vllm_class()),
    Claim("vllm_v1", "vllm-chunked-fits-alone-caching",
          "vLLM V1 as shipped (chunked prefill on, prefix caching on, FCFS): no no-progress state when every request "
          "fits the pool alone and no two requests share a prefix (a preempted request hits its own cached blocks)",
          vllm(),
          VLLM_KNOBS + "prefix caching on; watermark 0; any arrivals, early stops, cancellations; no shared prefixes; every "
          "request: cdiv(prompt + max_new - 1, 16) <= num_gpu_blocks - 1 (and prompt + max_new <= max_model_len = "
          "2^20)",
          HOLDS, "induction", knob_bounds=VLLM_ANY, invariants=vllm_pages_match_cached, weight=5,
          parametric="local", workload=vllm_class(no_shared_prefixes)),
    Claim("vllm_v1", "vllm-whole-prefill-within-budget",
          "vLLM V1 with chunked prefill off (FCFS, prefix caching off): no no-progress state when every request's "
          "prompt plus output fits one step's budget (what SchedulerConfig's max_num_batched_tokens >= "
          "max_model_len gives, as long as max_num_scheduled_tokens is not set below it)",
          vllm(chunked_prefill=False, enable_prefix_caching=False),
          VLLM_KNOBS + "prefix caching off; max_num_scheduled_tokens unset; any arrivals, early stops, cancellations; every "
          "request fits the pool alone and prompt + max_new <= max_num_batched_tokens",
          HOLDS, "induction", knob_bounds=VLLM_ANY, invariants=vllm_pages_match,
          parametric="local", weight=1.5, workload=vllm_class(replay_within_budget)),
    Claim("vllm_v1", "vllm-whole-prefill-scheduled-tokens-wedge",
          "vLLM V1 with chunked prefill off and max_num_scheduled_tokens below max_model_len (SchedulerConfig "
          "never compares them): a recompute-preempted request whose replay exceeds the step's budget wedges "
          "(Running 0 / Waiting 1 forever), though every request fits the pool and was accepted",
          VLLM_WEDGE,
          "block_size 16, 3 GPU blocks (2 usable = cdiv(max_model_len 32, 16)), max_num_batched_tokens 32, "
          "max_num_seqs 2, max_num_scheduled_tokens 2; 1-2 requests, prompt 1, max_new 1-30, arrival 0",
          FAILS, "bmc", max_depth=8,
          space=small_space(VLLM_WEDGE,
                            Group((1, 2), {"prompt": 1, "max_new": (1, 30), "arrival": 0}))),
    # -- TensorRT-LLM V1 ------------------------------------------------------------------------------
    Claim("trtllm_v1", "v1-budget-without-reuse",
          "TensorRT-LLM V1 (GUARANTEED_NO_EVICT, chunked prefill, one draft token), block reuse off: no step runs "
          "more tokens than max_num_tokens, drafts included",
          v1(draft_len=1),
          V1_WITHOUT_REUSE_CLASS,
          HOLDS, "induction", knob_bounds=ANY, property="SAFE-BUDGET", parametric="local", any_n=True),
    Claim("trtllm_v1", "v1-budget-without-reuse-max-util",
          "TensorRT-LLM V1 (MAX_UTILIZATION, chunked prefill off, one draft token), block reuse off: no step runs "
          "more tokens than max_num_tokens, drafts included",
          v1(chunked_prefill=False, capacity_scheduler_policy=MAX_UTIL, draft_len=1),
          V1_WITHOUT_REUSE_CLASS,
          HOLDS, "induction", knob_bounds=ANY, property="SAFE-BUDGET", parametric="local"),
    Claim("trtllm_v1", "v1-budget-reuse-untrimmed",
          "TensorRT-LLM V1 with block reuse on a build without the post-allocation trim (PR #15187; the build #13318 "
          "was reported on): a reuse estimate above the reuse obtained runs a step over max_num_tokens and the "
          "forward pass's assert fires",
          V1_REUSE_UNTRIMMED,
          V1_REUSE_CLASS + "; chunked prefill on; no trim",
          FAILS, "bmc", property="SAFE-BUDGET", max_depth=5, weight=3,
          space=v1_reuse_space(V1_REUSE_UNTRIMMED)),
    Claim("trtllm_v1", "v1-budget-reuse-whole-contexts",
          "TensorRT-LLM V1 with block reuse on and chunked prefill off, even with the post-allocation trim (it only "
          "warns when it cannot chunk): a reuse estimate above the reuse obtained runs a step over max_num_tokens",
          V1_REUSE_WHOLE,
          V1_REUSE_CLASS + "; chunked prefill off; trim on",
          FAILS, "bmc", property="SAFE-BUDGET", max_depth=5, weight=3,
          space=v1_reuse_space(V1_REUSE_WHOLE)),
    Claim("trtllm_v1", "v1-budget-reuse-trim-floor",
          "TensorRT-LLM V1 with block reuse, chunked prefill and the post-allocation trim as modelled (without the "
          "discard stage of a later upstream revision, docs/fidelity/trtllm_v1.md): the trim keeps every context "
          "chunk at least one block of progress, so when those floors do not fit max_num_tokens a reuse shortfall "
          "still runs a step over it and the forward pass's assert fires",
          V1_TRIM_FLOOR,
          "block_size 4, 5 blocks, max_num_tokens 4-16, max_batch_size 8, GUARANTEED_NO_EVICT, chunked prefill, "
          "trim on; r0 (9 tokens, group 1's 8-token prefix) at step 0, r1 (9, group 2's) at step 3, then r2 "
          "prompt 2-12 and r3 prompt 5-12 (group 1's prefix) at step 6",
          FAILS, "bmc", property="SAFE-BUDGET", max_depth=8, weight=7,
          space=v1_trim_floor_space(V1_TRIM_FLOOR)),
    # -- SGLang ----------------------------------------------------------------------------------------
    Claim("sglang", "sglang-ignore-eos-below-clip",
          "SGLang 0.5.23 (radix cache off, chunked prefill off, FCFS, ignore_eos requests): no no-progress state when "
          "every request asks for at least one token less than the arrival clip lets through",
          sglang(),
          "page_size 1; a pool of num_blocks >= 7 tokens, max_prefill_tokens, max_running_requests >= 1 symbolic; "
          "any arrivals and cancellations (early stops end nothing with ignore_eos); every request: max_new <= "
          "pool - prompt - 3",
          HOLDS, "induction", knob_bounds=SGLANG_ANY, workload=sglang_below_clip, block_sizes=(1,), parametric="local",
          weight=2),
    Claim("sglang", "sglang-ignore-eos-paged",
          "SGLang 0.5.23 (radix cache off, chunked prefill off, FCFS, ignore_eos requests) with pages of 4, 8 or 16 "
          "tokens: no no-progress state when every request asks for at most the pool less its prompt, two pages "
          "and a token (within a page of the arrival clip's bound)",
          sglang(block_size=16),
          "page_size 4, 8 and 16; num_blocks >= 7 pages, max_prefill_tokens, max_running_requests >= 1 symbolic; any "
          "arrivals and cancellations; every request: max_new <= pool - prompt - 2 * page - 1",
          HOLDS, "induction", knob_bounds=SGLANG_ANY, workload=sglang_within_two_pages, block_sizes=(4, 8, 16),
          parametric="local", weight=3),
    Claim("sglang", "sglang-ignore-eos-clip-stall",
          "SGLang 0.5.23 (radix cache off, ignore_eos requests): a request that asks for what the arrival clip lets "
          "through (pool - ceil_page(prompt) - page - 1) is refused by admission's one-token reserve on an empty "
          "engine, every iteration, and the FCFS queue behind it starves",
          sglang(num_blocks=16, max_num_tokens=16, max_batch_size=2),
          "page_size 1, a 16-token pool, max_prefill_tokens 16, 2 running requests; 1-2 requests, prompt 1-16, "
          "max_new 1-32, arrival 0-1",
          FAILS, "bmc", max_depth=4, weight=1,
          space=small_space(sglang(num_blocks=16, max_num_tokens=16, max_batch_size=2),
                            Group((1, 2), {"prompt": (1, 16), "max_new": (1, 32), "arrival": (0, 1)}))),
    Claim("sglang", "sglang-page-rounding-stall",
          "SGLang 0.5.23 with pages of 8 tokens (radix cache off, ignore_eos): a prompt the input-length check "
          "accepts (up to pool - 7 tokens) but whose page-rounded size plus a page exceeds the pool is never "
          "admitted, even alone (the mechanism of sgl-project/sglang #39271)",
          sglang(block_size=8, num_blocks=8, max_num_tokens=64, max_batch_size=2),
          "page_size 8, a 64-token pool, max_prefill_tokens 64, 2 running requests; 1 request, prompt 40-64, "
          "max_new 1-16, arrival 0",
          FAILS, "bmc", max_depth=4, weight=1,
          space=small_space(sglang(block_size=8, num_blocks=8, max_num_tokens=64, max_batch_size=2),
                            Group(1, {"prompt": (40, 64), "max_new": (1, 16), "arrival": 0}))),
]


def claims_for(policy: Optional[str]) -> list[Claim]:
    return [c for c in CLAIMS if policy is None or c.policy == policy]


# -- the invariant set of a claim -----------------------------------------------------------
def invariant_set(claim: Claim):
    """The core's invariants and the claim's own: what its induction assumes of a pre-state."""
    core = CORES[claim.policy]

    def invs(ops, k, p, s):
        inv = core.invariants(ops, k, p, s)
        if claim.invariants is not None:
            inv.update(claim.invariants(ops, k, p, s))
        return inv
    return invs


def case_class(claim: Claim, n: int, block_size: Optional[int]) -> tuple:
    """One proof case of a claim, over symbolic knobs and workload: (knobs, params, what the class assumes of
    them: the knob bounds, the workload's own constraints and the claim's workload class). What proofs/run.py
    `prove` proves the obligations over, and proofs/release_carry.py compares the releases over."""
    design = claim.design if block_size is None else dataclasses.replace(claim.design, block_size=block_size)
    knobs, cons = symbolic_knobs(design, claim.knob_bounds)
    params = any_params(n)
    assume = cons + workload_constraints(params)
    if claim.workload is not None:
        assume += [c for c in claim.workload(_SYM, knobs, params) if c is not True]
    return knobs, params, assume
