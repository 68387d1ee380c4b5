"""Each claim in its engine's default loop: re-decided where the symbolic core expresses that loop, else the core's
one-line refusal.

A claim's design (proofs/claims.py) names the loop it is decided in. Where an engine has two loops, the claims were
written for the one the cores first expressed, the synchronous one (TensorRT-LLM's `_executor_loop`, vLLM's
`Scheduler`, SGLang's `event_loop_normal`), while the engines run the other by default. `in_default_loop(claim)` is
the claim's twin there: the same class, property, method, slot counts and bounded-search space, with one knob
changed, the policy's `loop_knob` set to its dataclass default (the engine's default loop). Nothing else about the
design moves, so the twin asks exactly "does the claim survive the default loop?".

- The twin is decided only where the policy's core expresses the default loop (`Core.unsupported` is None for its
  design, and for a bounded search for its space's template). Elsewhere `refusal(claim)` is the core's one line,
  naming the knob, and `prove` prints it as the claim's default-loop entry: not decided, never assumed.
- Its scope: the argument for any number of requests (checkers/parametric) takes apart the synchronous step (the
  micro-steps of trtllm_v2_micro.py, the one-request step of checkers/parametric/local.py), so the twin carries no
  such argument: an induction twin is proved for up to max(slots) requests, and says so.
- Its expectation is measured, not inherited: `MEASURED` holds what `prove --loop default` found for each twin
  where it differs from its claim (the outcome, why, and for a bounded search the depth the default loop needs); a
  twin missing from it is expected to come out as its claim does, and a different outcome is reported like any
  claim not as expected. OPEN (proofs/claims.py) is an outcome too: neither proved nor refuted, said so.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.policy import POLICIES
from model.symbolic.core import CORES

from .claims import CLAIMS, FAILS, Claim

# The suffix a twin's name takes: claims are named once, a twin is its claim's name in its loop.
SUFFIX = "@default-loop"


@dataclasses.dataclass(frozen=True)
class Measured:
    """What `prove --loop default` found for a twin where it differs from its claim's expectation or search."""
    expected: str                    # HOLDS | FAILS | OPEN (proofs/claims.py)
    why: str                         # one line: why it differs from the claim's
    max_depth: Optional[int] = None  # a bounded search's depth in the default loop, where the claim's is too short


# The default loop's step is one engine step: no decode run is accelerated there (the cores' `decode_guard` is
# false in the overlap loop), so a wedge the synchronous search reaches at depth 4-7 through decode runs takes its
# engine steps one by one. Measured 2026-12-06 (`bench/default_loop_depths.py`, the twin's own search): v2-ab-mixed
# at depth 14 (37 s), v2-ab-resume-gate and its within-budget variant at 41 (27 s, 23 s), v1-budget-reuse-trim-floor
# at 9 (146 s), each trace replayed; at their claims' depths (12, 12, 12, 8) none is reached.
# Keyed by the claim's name.
MEASURED: dict[str, Measured] = {
    "v2-ab-mixed": Measured(FAILS, "fails too, its trace 14 engine steps long (no decode run is accelerated there)",
                            max_depth=18),
    "v2-ab-resume-gate": Measured(FAILS, "fails too, its trace 41 engine steps long (no decode run is accelerated "
                                        "there)", max_depth=48),
    "v2-ab-resume-gate-within-budget": Measured(FAILS, "fails too, its trace longer in engine steps", max_depth=48),
    "v1-budget-reuse-trim-floor": Measured(FAILS, "fails too, its trace 9 engine steps long (7 in the synchronous "
                                                  "loop; its claim searches to 8)", max_depth=12),
    # vLLM's async scheduling (measured 2026-12-06, the same script): none within 12 engine steps (33 s), violated at
    # 18 (202 s), the trace replayed; the two requests' decode runs to a full block take their calls one by one
    "vllm-whole-prefill-scheduled-tokens-wedge": Measured(FAILS, "fails too, its trace 18 engine steps long (none "
                                                                 "within 12; no decode run is accelerated there)",
                                                          max_depth=18),
}


def loop_knob(claim: Claim) -> Optional[str]:
    """The option choosing the claim's engine loop, or None: the engine has one loop."""
    return POLICIES[claim.policy].loop_knob


def default_value(options, knob: str):
    field = next(f for f in dataclasses.fields(options) if f.name == knob)
    return field.default


def runs_default_loop(claim: Claim) -> bool:
    knob = loop_knob(claim)
    return knob is None or getattr(claim.design.options, knob) == default_value(claim.design.options, knob)


def _in_default_loop_design(cfg):
    knob = POLICIES[cfg.policy].loop_knob
    return dataclasses.replace(cfg, options=dataclasses.replace(
        cfg.options, **{knob: default_value(cfg.options, knob)}))


def refusal(claim: Claim) -> Optional[str]:
    """The core's one line where it does not express the claim's default loop; None where it does (or the claim
    runs it already)."""
    if runs_default_loop(claim):
        return None
    core = CORES[claim.policy]
    designs = [_in_default_loop_design(claim.design)]
    if claim.space is not None:
        designs.append(_in_default_loop_design(claim.space.template))
    for cfg in designs:
        refused = core.unsupported(cfg)
        if refused is not None:
            field, reason = refused
            return f"{field}: {reason}"
    return None


def in_default_loop(claim: Claim) -> Optional[Claim]:
    """The claim's twin in its engine's default loop, where the core expresses it; None where the claim runs that
    loop already or the core refuses it (`refusal`)."""
    if runs_default_loop(claim) or refusal(claim) is not None:
        return None
    measured = MEASURED.get(claim.name)
    space = None if claim.space is None else dataclasses.replace(
        claim.space, template=_in_default_loop_design(claim.space.template))
    return dataclasses.replace(
        claim, name=claim.name + SUFFIX, design=_in_default_loop_design(claim.design), space=space,
        expected=claim.expected if measured is None else measured.expected,
        max_depth=claim.max_depth if measured is None or measured.max_depth is None else measured.max_depth,
        statement=f"{claim.statement} (in the engine's default loop)", parametric=None, any_n=False)


def twins(claims: list[Claim]) -> list[Claim]:
    return [t for t in (in_default_loop(c) for c in claims) if t is not None]


def original(name: str) -> Claim:
    """A claim or a twin by name (a twin is rebuilt from its claim: claims hold functions, which do not cross
    processes)."""
    base = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
    claim = next(c for c in CLAIMS if c.name == base)
    if base == name:
        return claim
    twin = in_default_loop(claim)
    if twin is None:
        raise LookupError(f"{name}: the core does not express {base}'s default loop")
    return twin


def entry(claim: Claim) -> dict:
    """A claim's default-loop entry for `prove`'s listing: where it runs that loop already, where its twin is
    decided (the twin's own verdict says how), or the core's refusal."""
    loop = POLICIES[claim.policy].loop
    if runs_default_loop(claim):
        return {"status": "same", "loop": loop(claim.design.options)}
    default_loop = loop(_in_default_loop_design(claim.design).options)
    refused = refusal(claim)
    if refused is not None:
        return {"status": "not decided", "loop": default_loop, "reason": refused}
    measured = MEASURED.get(claim.name)
    return {"status": "decided", "loop": default_loop, "twin": claim.name + SUFFIX,
            **({"differs": measured.why} if measured is not None else {})}
