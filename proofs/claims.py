"""The claims `schedproof prove` decides: each a design, a parametric class, and the expected outcome.

A claim says: for every design of `design`'s structure whose numeric knobs lie in `knob_bounds`,
and every workload satisfying `workload` (on top of induction.workload_constraints: any prompt,
output, arrival, early stop and cancellation), no reachable state is a no-progress state
(LIVE-NO-PROGRESS: the environment quiet, work unfinished, a step that schedules nothing and
changes no request).

- method "induction": the core's invariants plus the claim's `invariants` are proved inductive
  (init, step, decode-run) for `slots` request slots, and then the progress obligation
  (checkers/induction.py `progress_obligation`) from them alone. Holds at every depth, for up to
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
from model.policies.trtllm_v2 import Options as V2Options
from checkers.space import Group, Space
from model.symbolic.slots import DECODING, PREEMPTED, Knobs, Params, SlotState, unfinished

HOLDS, FAILS = "holds", "fails"


@dataclasses.dataclass(frozen=True)
class Claim:
    policy: str
    name: str
    statement: str                   # one line
    design: EngineConfig             # structure and options; numbers are the template's
    class_text: str                  # the class, in words (exactly what knob_bounds and workload say)
    expected: str                    # HOLDS | FAILS
    method: str                      # "induction" | "bmc"
    knob_bounds: dict = dataclasses.field(default_factory=dict)   # Knobs.NUMERIC name -> (lo, hi | None)
    workload: Optional[Callable[[object, Knobs, Params], list]] = None   # (ops, k, p) -> constraints
    invariants: Optional[Callable[[object, Knobs, Params, SlotState], dict]] = None   # extra, named
    block_sizes: tuple[int, ...] = ()   # induction: one proof per concrete block size
    slots: tuple[int, ...] = (2, 3)     # induction: request slots
    space: Optional[Space] = None       # bmc: the design and workloads searched
    max_depth: int = 12                 # bmc
    # induction: the argument for any number of requests (checkers/parametric), if there is one
    # for this claim: "c1" (trtllm_v2 with fixes A+B in C1; `workload` must constrain each request
    # alone, since the array model applies it to one index at a time)
    parametric: Optional[str] = None
    property: str = "LIVE-NO-PROGRESS"


# -- the class vocabulary ----------------------------------------------------------------
def worst_pages(ops, k: Knobs, w: dict):
    return k.blocks_for(ops, w["prompt"] + w["max_new"] + k.options.draft_len)


def outgrows(k: Knobs, w: dict):
    return w["prompt"] + w["max_new"] + k.options.draft_len > k.max_num_tokens


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
    can outgrow their replay fit the pool together. B checks exactly this sum (plus the current
    pages of the others) before it admits one; a paused request leaves the sum and re-enters it
    only through B again."""
    held = []
    for w, r in zip(p.slots, s.req):
        counted = ops.and_(w["present"], unfinished(ops, r["phase"]), outgrows(k, w),
                           ops.or_(r["blocks"] > 0, r["phase"] == DECODING))
        held.append(ops.ite(counted, worst_pages(ops, k, w), 0))
    return {"reservation": ops.sum(held) <= k.num_blocks}


def c1_invariants(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """In C1 with fix B every admitted request is in the reservation, so no growth ever fails: no
    eviction (suspension), no recompute pause, no preemption for pages happens."""
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


def c3_invariants(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    return {**reservation(ops, k, p, s), **paused_replay_fits(ops, k, p, s)}


# -- designs -------------------------------------------------------------------------------
def v2(num_blocks=272, max_num_tokens=2048, block_size=32, max_batch_size=64, **options) -> EngineConfig:
    """The field report's design (seeds.md 3): chunked prefill off, GPU-only KV cache."""
    return EngineConfig("trtllm_v2", block_size, num_blocks, max_num_tokens, max_batch_size, 0, False, 0,
                        V2Options(**options))


AB = dict(fix_replay_fit=True, fix_worst_case_admission=True)
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
          HOLDS, "induction", knob_bounds=ANY, workload=all_outgrow, invariants=c1_invariants, parametric="c1"),
    Claim("trtllm_v2", "v2-ab-outgrowing-first",
          "V2 with fixes A+B and max_util_for_resume 1.0: no no-progress state when the requests that can outgrow "
          "their replay arrive before those that cannot",
          v2(max_util_for_resume=1.0, **AB),
          "C3: block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len d = 0; "
          "max_util_for_resume 1.0; any arrivals, early stops, cancellations; every request: "
          "prompt + d <= max_num_tokens, worst <= num_blocks; no outgrowing request after one that is not "
          "(in arrival order)",
          HOLDS, "induction", knob_bounds=ANY, workload=outgrowing_first, invariants=c3_invariants),
    Claim("trtllm_v2", "v2-ab-within-budget",
          "V2 with fixes A+B (inactive here, so also V2 as released), chunking off: no no-progress state when no "
          "replay can outgrow the budget and every worst case is within the resume gate (row 2)",
          v2(**AB),
          "C2: block_size, num_blocks, max_num_tokens, max_batch_size >= 1 symbolic; draft_len d = 0; "
          "max_util_for_resume 0.95; any arrivals, early stops, cancellations; every request: "
          "prompt + max_new + d <= max_num_tokens, worst <= 0.95 * num_blocks",
          HOLDS, "induction", knob_bounds=ANY, workload=none_outgrow_within_gate),
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
]


def claims_for(policy: Optional[str]) -> list[Claim]:
    return [c for c in CLAIMS if policy is None or c.policy == policy]
