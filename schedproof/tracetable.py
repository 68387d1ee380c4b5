"""A trace as rows a person reads: what each step did, in named phases, with long runs folded.

A decode run of hundreds of steps, or a stall that repeats itself a thousand times before the
engine's detector fires, is one row ("steps 20-513 (494 steps): r0, r1, r2 decode"); every step
that changes a request's phase, preempts, offloads, finishes, fails or raises has a row of its own.
"""

from __future__ import annotations

import dataclasses

from model.config import EngineConfig
from model.state import Phase, State, StepRecord


@dataclasses.dataclass
class Row:
    first: int              # engine steps covered, inclusive
    last: int
    what: str               # what the step did
    changes: str            # phase changes, "r3 decoding -> preempted"
    pages: str              # GPU pages in use / pool (host tier too, where there is one)
    tokens: str             # tokens run / budget

    @property
    def steps(self) -> str:
        if self.first == self.last:
            return str(self.first)
        return f"{self.first}-{self.last} ({self.last - self.first + 1} steps)"

    def as_dict(self) -> dict:
        return {"steps": self.steps, "first": self.first, "last": self.last, "what": self.what,
                "changes": self.changes, "pages": self.pages, "tokens": self.tokens}


def phase_name(p: Phase) -> str:
    return p.name.lower()


def rows(cfg: EngineConfig, states: list[State], records: list[StepRecord]) -> list[Row]:
    out: list[Row] = []
    for k, rec in enumerate(records):
        pre, post = states[k], states[k + 1]
        what, changes = describe(pre, post, rec), _changes(pre, post)
        row = Row(rec.step, rec.step, what, changes, _pages(cfg, post), f"{rec.num_tokens} / {cfg.max_num_tokens}")
        if out and _folds(out[-1], row):
            prev = out[-1]
            prev.last = row.last
            prev.pages = _range(prev.pages, row.pages)
            prev.tokens = _range(prev.tokens, row.tokens)
        else:
            out.append(row)
    return out


def _folds(prev: Row, row: Row) -> bool:
    """A step folds into the row before it when nothing but the same decodes (or the same
    nothing) happened in both."""
    return not prev.changes and not row.changes and prev.what == row.what and row.first == prev.last + 1


def _range(a: str, b: str) -> str:
    lo_a = a.split(" .. ")[0]
    return lo_a if lo_a == b else f"{lo_a} .. {b}"


def describe(pre: State, post: State, rec: StepRecord) -> str:
    parts = []
    arrived = [r.rid for r, q in zip(pre.requests, post.requests)
               if r.phase == Phase.PENDING and q.phase != Phase.PENDING]
    if arrived:
        parts.append(f"{_names(arrived)} arrive{'s' if len(arrived) == 1 else ''}")
    decoding = [rid for rid, _ in rec.scheduled if pre.req(rid).phase == Phase.DECODING]
    context = [(rid, tok) for rid, tok in rec.scheduled if rid not in decoding]
    if context:
        parts.append(", ".join(f"r{rid} context {tok}" for rid, tok in context))
    if decoding:
        parts.append(f"{_names(decoding)} decode{'s' if len(decoding) == 1 else ''}")
    for who, verb in ((rec.preempted, "preempted for recompute"), (rec.offloaded, "suspended/offloaded"),
                      (rec.finished, "finish"), (rec.rejected, "rejected"), (rec.failed, "fail")):
        if who:
            parts.append(f"{_names(sorted(who))} {verb}")
    cancelled = [q.rid for r, q in zip(pre.requests, post.requests)
                 if q.phase == Phase.CANCELLED and r.phase != Phase.CANCELLED]
    if cancelled:
        parts.append(f"{_names(cancelled)} cancelled")
    if rec.error:
        parts.append(f"the engine raises ({rec.error_kind or 'error'})")
    if not parts:
        parts.append("nothing is scheduled and no request changes")
    return "; ".join(parts)


def _changes(pre: State, post: State) -> str:
    """Phase changes, requests with the same change named together ("r5-r11 waiting -> failed")."""
    groups: dict[str, list[int]] = {}
    for r, q in zip(pre.requests, post.requests):
        if r.phase != q.phase and r.phase != Phase.PENDING:
            groups.setdefault(f"{phase_name(r.phase)} -> {phase_name(q.phase)}", []).append(q.rid)
        elif q.suspended != r.suspended:
            groups.setdefault("suspended" if q.suspended else "resumed", []).append(q.rid)
    return ", ".join(f"{_names(rids)} {change}" for change, rids in groups.items())


def _pages(cfg: EngineConfig, s: State) -> str:
    text = f"{cfg.num_blocks - s.free_blocks} / {cfg.num_blocks}"
    if cfg.host_blocks:
        text += f" (host {cfg.host_blocks - s.free_host_blocks} / {cfg.host_blocks})"
    return text


def _names(rids) -> str:
    rids = sorted(rids)
    if len(rids) > 3 and rids == list(range(rids[0], rids[-1] + 1)):
        return f"r{rids[0]}-r{rids[-1]}"
    return ", ".join(f"r{i}" for i in rids)
