"""Evaluate every registered property on one trace and turn the result into a verdict."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .registry import REGISTRY, Context, TraceLike, Violation

VERDICTS = ("ok", "deadlock", "livelock", "crash", "violation", "unknown")


@dataclasses.dataclass
class Evaluation:
    violations: list[Violation]
    witnessed: dict[str, int]        # sometimes-property id -> first step it was seen (absent: not seen)
    verdict: str
    complete: bool                   # False when the run hit its step limit

    def violated(self, prop_id: str) -> bool:
        return any(v.property == prop_id for v in self.violations)


def evaluate(trace: TraceLike, fits_alone: Callable[[int], bool], max_overtakes: int) -> Evaluation:
    violations: list[Violation] = []
    for p in REGISTRY.values():
        if p.step_check is None:
            continue
        for prev, rec, cur in zip(trace.states, trace.records, trace.states[1:]):
            message = p.step_check(trace.cfg, prev, rec, cur)
            if message:
                violations.append(Violation(p.id, rec.step, message))
                break   # the first violating step is the one to read; later ones repeat it
    ctx = Context(trace, fits_alone, max_overtakes)
    for p in REGISTRY.values():
        if p.trace_check is not None:
            violations.extend(p.trace_check(ctx))
    witnessed = {}
    for p in REGISTRY.values():
        if p.witness is None:
            continue
        step = next((rec.step for rec in trace.records if p.witness(rec)), None)
        if step is not None:
            witnessed[p.id] = step
    violations.sort(key=lambda v: (v.step, v.property))
    return Evaluation(violations, witnessed, verdict_of(trace, violations), trace.end != "limit")


def verdict_of(trace: TraceLike, violations: list[Violation]) -> str:
    """The headline, most specific first: a stall (found by us or by the engine's own detector)
    is a deadlock; a cycle without completion a livelock; any other engine error a crash."""
    ids = {v.property for v in violations}
    error_kinds = {rec.error_kind for rec in trace.records if rec.error}
    if "LIVE-NO-PROGRESS" in ids or "deadlock" in error_kinds:
        return "deadlock"
    if "LIVE-LIVELOCK" in ids:
        return "livelock"
    if error_kinds:
        return "crash"
    if violations:
        return "violation"
    if trace.end == "limit":
        return "unknown"
    return "ok"
