"""The named properties, written once and evaluated on any trace.

A trace is a list of states and the step records between them. The model's simulator
produces one; a real-engine target produces one from what the engine exposes. Each property
has a stable ID that every failure message cites, a kind (stateright's vocabulary:
`always` must hold at every step, `sometimes` must be witnessed somewhere so the others do
not pass vacuously, `progress` speaks about where a run ends up), a statement, and the
evidence it answers (bug reports of ../shared/reference/known_bugs.md and seeds.md).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Protocol, Sequence

from model.config import EngineConfig
from model.policy import POLICIES
from model.state import Phase, State, StepRecord


class TraceLike(Protocol):
    cfg: EngineConfig
    states: Sequence[State]
    records: Sequence[StepRecord]
    end: str


@dataclasses.dataclass(frozen=True)
class Violation:
    property: str
    step: int
    message: str

    def as_dict(self) -> dict:
        return {"property": self.property, "step": self.step, "message": self.message}


StepCheck = Callable[[EngineConfig, State, StepRecord, State], Optional[str]]
TraceCheck = Callable[["Context"], list[Violation]]


@dataclasses.dataclass(frozen=True)
class Property:
    id: str
    kind: str            # always | sometimes | progress
    statement: str
    evidence: tuple[str, ...]
    step_check: Optional[StepCheck] = None     # always: one message per violating step
    trace_check: Optional[TraceCheck] = None   # progress: looks at the whole run
    witness: Optional[Callable[[StepRecord], bool]] = None  # sometimes


@dataclasses.dataclass
class Context:
    """What trace-level checks may use: the trace and the policy's own notion of fitting alone."""

    trace: TraceLike
    fits_alone: Callable[[int], bool]
    max_overtakes: int


REGISTRY: dict[str, Property] = {}


def prop(**kw) -> Property:
    p = Property(**kw)
    assert p.id not in REGISTRY, p.id
    REGISTRY[p.id] = p
    return p


def _unfinished(state: State) -> list[int]:
    return [r.rid for r in state.requests if r.phase.unfinished]


# -- always -------------------------------------------------------------------------------

def _budget(cfg, prev, rec, cur):
    policy = POLICIES.get(cfg.policy)
    if policy is not None and not policy.hard_step_budget:   # a budget the engine passes by design
        return None
    if rec.num_tokens > cfg.max_num_tokens:
        return (f"the step runs {rec.num_tokens} tokens (drafts included), over the budget of "
                f"{cfg.max_num_tokens} (the scheduler charged {rec.charged})")
    return None


prop(id="SAFE-BUDGET", kind="always",
     statement="Every step runs at most the per-step token budget, draft tokens included.",
     evidence=("TRT-LLM #13318 (reuse-adjusted charge)", "TRT-LLM PR #16101 (draft tokens under-reserved)",
               "seeds.md 2: assert total_num_tokens <= self.max_num_tokens"),
     step_check=_budget)


def _batch(cfg, prev, rec, cur):
    if len(rec.scheduled) > cfg.max_batch_size:
        return f"the step schedules {len(rec.scheduled)} requests, over the cap of {cfg.max_batch_size}"
    return None


prop(id="SAFE-BATCH", kind="always",
     statement="Every step schedules at most the per-step request cap.",
     evidence=("vLLM max_num_seqs; TRT-LLM max_batch_size; transformers max_requests_per_batch",),
     step_check=_batch)


def _blocks(cfg, prev, rec, cur):
    held = sum(r.blocks for r in cur.requests) + cur.cached_blocks
    if cur.free_blocks < 0 or cur.free_blocks + held != cfg.num_blocks:
        return (f"GPU blocks do not add up: {cur.free_blocks} free + {held} held (cache included) "
                f"!= {cfg.num_blocks} in the pool")
    host_held = sum(r.host_blocks for r in cur.requests)
    if cur.free_host_blocks < 0 or cur.free_host_blocks + host_held != cfg.host_blocks:
        return (f"host blocks do not add up: {cur.free_host_blocks} free + {host_held} held "
                f"!= {cfg.host_blocks} in the tier")
    return None


prop(id="SAFE-BLOCKS", kind="always",
     statement="On every tier, free blocks plus blocks held (prefix cache included) equal the pool, and none is negative.",
     evidence=("known_bugs P6 (allocated + free = total)", "vLLM #49674 (blocks fenced, not freed)"),
     step_check=_blocks)


def _no_leak(cfg, prev, rec, cur):
    leaking = [r.rid for r in cur.requests if r.phase.terminal and (r.blocks or r.host_blocks or r.shared_blocks)]
    if leaking:
        return f"requests {leaking} are done but still hold blocks"
    if all(r.phase.terminal for r in cur.requests):
        live_refs = sum(e.refs for e in cur.prefix_cache)
        if live_refs:
            return f"all requests are done but the prefix cache still counts {live_refs} live references"
    return None


prop(id="SAFE-NO-LEAK", kind="always",
     statement="A finished, failed or cancelled request holds no block, and when all are done no block is referenced.",
     evidence=("TRT-LLM #18115 (paused requests never freed under PP)",),
     step_check=_no_leak)


def _requests(cfg, prev, rec, cur):
    for a, b in zip(prev.requests, cur.requests):
        if a.phase.terminal and b.phase != a.phase:
            return f"r{a.rid} left the terminal phase {a.phase.name} for {b.phase.name}"
        if a.phase != Phase.PENDING and b.phase == Phase.PENDING:
            return f"r{a.rid} was lost: it went back to not-submitted"
        if b.generated > b.max_new:
            return f"r{b.rid} generated {b.generated} tokens, more than its max_new {b.max_new}"
        if b.generated < a.generated:
            return f"r{b.rid} lost generated tokens ({a.generated} -> {b.generated})"
    answered = list(rec.finished) + list(rec.failed) + list(rec.rejected)
    twice = [rid for rid in answered if prev.requests[rid].phase.terminal or answered.count(rid) > 1]
    if twice:
        return f"requests {sorted(set(twice))} were answered twice"
    return None


prop(id="SAFE-REQUESTS", kind="always",
     statement="Every request is in exactly one place: once submitted it is never lost, a final answer is given once and never taken back.",
     evidence=("vLLM-HabanaAI PR #2247 (preempted groups left in running)", "known_bugs P6"),
     step_check=_requests)


def _engine_error(cfg, prev, rec, cur):
    if rec.error:
        return f"the engine raised ({rec.error_kind}): {rec.error}"
    return None


prop(id="ENGINE-ERROR", kind="always",
     statement="The engine never raises: an assertion or a stall detector firing is a violation in its own right.",
     evidence=("seeds.md 1 (transformers RuntimeError)", "seeds.md 3 (V2 scheduler deadlock error)",
               "TRT-LLM #13318 (AssertionError kills the event loop)"),
     step_check=_engine_error)


# -- progress -----------------------------------------------------------------------------

def _no_progress(ctx: Context) -> list[Violation]:
    t = ctx.trace
    for prev, rec, cur in zip(t.states, t.records, t.states[1:]):
        stuck = _unfinished(prev)
        if stuck and not rec.scheduled and not rec.error and prev.requests == cur.requests:
            # a request suspended and resumed (or paused and re-admitted) in one step is in the
            # record but ends the step as it began: say so rather than "nothing offloaded"
            moved = sorted(set(rec.offloaded) | set(rec.preempted))
            how = (f"requests {moved} are offloaded or preempted and end the step as they began, nothing is "
                   f"scheduled" if moved else "nothing is scheduled, preempted or offloaded")
            return [Violation("LIVE-NO-PROGRESS", rec.step,
                              f"requests {stuck} are unfinished and the step changes none of them: {how}")]
    return []


prop(id="LIVE-NO-PROGRESS", kind="progress",
     statement="Never: unfinished work, and the scheduler's step changes nothing.",
     evidence=("seeds.md 3 (#21826)", "vLLM #39734, #53130, #45387 (Waiting N, Running 0)", "known_bugs P2"),
     trace_check=_no_progress)


def _livelock(ctx: Context) -> list[Violation]:
    t = ctx.trace
    if t.end != "cycle":
        return []
    start = t.cycle_start
    length = len(t.states) - 1 - start
    stuck = _unfinished(t.states[-1])
    return [Violation("LIVE-LIVELOCK", t.records[start].step if start < len(t.records) else t.records[-1].step,
                      f"the run enters a cycle of {length} steps in which nothing completes; "
                      f"requests {stuck} never finish")]


prop(id="LIVE-LIVELOCK", kind="progress",
     statement="No cycle of states without a completion (work keeps moving but nothing ever finishes).",
     evidence=("BLIS INV-4/INV-8 (preempt-requeue livelock)", "vLLM #49674 (cascading preemptions, 0 tok/s)",
               "known_bugs P5"),
     trace_check=_livelock)


def _fits_alone_completes(ctx: Context) -> list[Violation]:
    t = ctx.trace
    if t.end == "limit":
        return []   # the run is incomplete: nothing can be said about eventually
    final = t.states[-1]
    stuck = [r for r in final.requests
             if ctx.fits_alone(r.rid) and r.phase not in (Phase.FINISHED, Phase.REJECTED, Phase.CANCELLED)]
    if not stuck:
        return []
    ends = sorted({r.phase.name for r in stuck})
    reason = next((r.reason for r in stuck if r.reason), "")
    return [Violation("LIVE-FITS-ALONE-COMPLETES", t.records[-1].step if t.records else 0,
                      f"requests {[r.rid for r in stuck]} fit the engine alone but end {'/'.join(ends)}"
                      + (f": {reason}" if reason else ""))]


prop(id="LIVE-FITS-ALONE-COMPLETES", kind="progress",
     statement="Every request that fits the engine alone eventually completes, or is rejected at admission with a clear error.",
     evidence=("vLLM #39734 (head of queue never fits)", "vLLM #52520", "seeds.md 3"),
     trace_check=_fits_alone_completes)


def _no_interference(ctx: Context) -> list[Violation]:
    out = []
    for rec in ctx.trace.records:
        victims = [rid for rid in rec.failed if ctx.fits_alone(rid)]
        if victims:
            out.append(Violation("LIVE-NO-INTERFERENCE", rec.step,
                                 f"requests {victims} fit the engine alone but failed with the others: "
                                 f"{rec.error or 'failed'}"))
    return out


prop(id="LIVE-NO-INTERFERENCE", kind="progress",
     statement="No request that fits the engine alone fails because of another request.",
     evidence=("seeds.md 1 (one oversized request fails every request in flight)",),
     trace_check=_no_interference)


def _bounded_wait(ctx: Context) -> list[Violation]:
    t = ctx.trace
    overtaken: dict[int, int] = {}
    out = []
    for prev, rec in zip(t.states, t.records):
        waiting = [r.rid for r in prev.requests if r.phase.unfinished and ctx.fits_alone(r.rid)]
        for done in rec.finished:
            for rid in waiting:
                if prev.requests[done].arrival > prev.requests[rid].arrival and rid not in rec.finished:
                    overtaken[rid] = overtaken.get(rid, 0) + 1
                    if overtaken[rid] == ctx.max_overtakes + 1:
                        out.append(Violation("LIVE-BOUNDED-WAIT", rec.step,
                                             f"r{rid} has been overtaken by {ctx.max_overtakes + 1} later "
                                             f"requests that completed while it waited"))
    return out


prop(id="LIVE-BOUNDED-WAIT", kind="progress",
     statement="No request that fits alone is overtaken by more than `max_overtakes` later arrivals completing (starvation).",
     evidence=("TRT-LLM #2866 (requests serialised behind one)", "known_bugs P5"),
     trace_check=_bounded_wait)


# -- sometimes ----------------------------------------------------------------------------

prop(id="SOME-COMPLETION", kind="sometimes", statement="Some request completes.",
     evidence=("stateright: sometimes properties keep the others from passing vacuously",),
     witness=lambda rec: bool(rec.finished))
prop(id="SOME-PREEMPTION", kind="sometimes", statement="Some request is preempted for recompute.",
     evidence=("seeds.md 3 step 1",), witness=lambda rec: bool(rec.preempted))
prop(id="SOME-OFFLOAD", kind="sometimes", statement="Some request is offloaded, suspended or soft-reset.",
     evidence=("seeds.md 1 (offloading manager)",), witness=lambda rec: bool(rec.offloaded))
