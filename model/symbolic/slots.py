"""The slot state a policy core reads and writes: a fixed number of request slots, each a table
of named fields, plus global fields; the workload as per-slot parameters; the step record.

Values are ints/bools (the `Concrete` interpretation) or Z3 terms (`Symbolic`). The field names
follow model/state.py, so the abstraction from a simulator `State` to a slot state is a copy
(`Core.abstract`), and a difference between the two is a difference of one named field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .. import releases
from ..config import EngineConfig
from ..simulator import Workload
from ..state import Phase

PENDING, WAITING, PREFILLING, DECODING, PREEMPTED, OFFLOADED, FINISHED, FAILED, REJECTED, CANCELLED = (
    int(p) for p in Phase)

ERROR_NONE, ERROR_DEADLOCK, ERROR_CRASH = 0, 1, 2
ERROR_KINDS = {None: ERROR_NONE, "deadlock": ERROR_DEADLOCK, "crash": ERROR_CRASH}

PARAM_FIELDS = ("present", "prompt", "max_new", "arrival", "output_len", "cancel_at",
                "prefix_group", "prefix_len", "priority")
RECORD_FLAGS = ("scheduled", "preempted", "offloaded", "finished", "failed", "rejected")


@dataclasses.dataclass
class Knobs:
    """The engine's numeric knobs (ints or terms) and its structural ones (always concrete)."""

    block_size: Any
    num_blocks: Any
    max_num_tokens: Any
    max_batch_size: Any
    host_blocks: Any
    chunked_prefill: bool
    chunk_unit: int
    options: Any
    release: str = ""   # the engine release the design runs on (model/releases.py; always concrete)

    NUMERIC = ("block_size", "num_blocks", "max_num_tokens", "max_batch_size", "host_blocks")

    @classmethod
    def of(cls, cfg: EngineConfig) -> "Knobs":
        return cls(cfg.block_size, cfg.num_blocks, cfg.max_num_tokens, cfg.max_batch_size, cfg.host_blocks,
                   cfg.chunked_prefill, cfg.chunk_unit, cfg.options, releases.release(cfg))

    def blocks_for(self, ops, tokens):
        return ops.pages(tokens, self.block_size)


@dataclasses.dataclass
class Params:
    """The workload, one entry per slot. `present` marks the slots in use (a prefix of them);
    `output_len` 0 means no early stop; `cancel_at` -1 means never cancelled."""

    slots: list[dict]

    @classmethod
    def of(cls, workload: Workload) -> "Params":
        slots = []
        for s in workload.requests:
            slots.append(dict(present=True, prompt=s.prompt, max_new=s.max_new, arrival=s.arrival,
                              output_len=s.output_len or 0,
                              cancel_at=-1 if s.cancel_at is None else s.cancel_at,
                              prefix_group=s.prefix_group, prefix_len=s.prefix_len, priority=s.priority))
        return cls(slots)

    def padded(self, n: int) -> "Params":
        absent = dict(present=False, prompt=1, max_new=1, arrival=0, output_len=0, cancel_at=-1,
                      prefix_group=-1, prefix_len=0, priority=0)
        return Params(self.slots + [dict(absent) for _ in range(n - len(self.slots))])


@dataclasses.dataclass
class SlotState:
    req: list[dict]
    g: dict

    def copy(self) -> "SlotState":
        return SlotState([dict(r) for r in self.req], dict(self.g))

    def __len__(self) -> int:
        return len(self.req)


@dataclasses.dataclass
class SlotRecord:
    """What one step did; per-slot flags and tokens (drafts included), and the global charge."""

    tokens: list
    flags: dict            # name in RECORD_FLAGS -> list of per-slot bools
    charged: Any = 0
    error: Any = False
    error_kind: Any = ERROR_NONE

    @classmethod
    def empty(cls, n: int) -> "SlotRecord":
        return cls([0] * n, {f: [False] * n for f in RECORD_FLAGS})

    def copy(self) -> "SlotRecord":
        return SlotRecord(list(self.tokens), {k: list(v) for k, v in self.flags.items()},
                          self.charged, self.error, self.error_kind)


def select(ops, cond, a: SlotState, b: SlotState) -> SlotState:
    """ite over whole states."""
    return SlotState([{k: ops.ite(cond, ra[k], rb[k]) for k in ra} for ra, rb in zip(a.req, b.req)],
                     {k: ops.ite(cond, a.g[k], b.g[k]) for k in a.g})


def select_record(ops, cond, a: SlotRecord, b: SlotRecord) -> SlotRecord:
    return SlotRecord([ops.ite(cond, x, y) for x, y in zip(a.tokens, b.tokens)],
                      {k: [ops.ite(cond, x, y) for x, y in zip(a.flags[k], b.flags[k])] for k in a.flags},
                      ops.ite(cond, a.charged, b.charged), ops.ite(cond, a.error, b.error),
                      ops.ite(cond, a.error_kind, b.error_kind))


def unfinished(ops, phase):
    return ops.and_(phase >= WAITING, phase < FINISHED)


def terminal(ops, phase):
    return phase >= FINISHED


def started(ops, phase):
    return ops.or_(phase == PREFILLING, phase == DECODING)


def record_of(rec, n: int) -> SlotRecord:
    """A simulator StepRecord as a concrete slot record (for the differential tests and replay)."""
    out = SlotRecord.empty(n)
    for rid, tokens in rec.scheduled:
        out.tokens[rid] += tokens
        out.flags["scheduled"][rid] = True
    for name in ("preempted", "offloaded", "finished", "failed", "rejected"):
        for rid in getattr(rec, name):
            out.flags[name][rid] = True
    out.charged = rec.charged
    out.error = rec.error is not None
    out.error_kind = ERROR_KINDS[rec.error_kind]
    return out


def diff(a: SlotState, b: SlotState) -> Optional[str]:
    """The first field where two concrete slot states differ, named; None if equal."""
    for i, (ra, rb) in enumerate(zip(a.req, b.req)):
        for k in ra:
            if ra[k] != rb[k]:
                return f"slot {i}.{k}: {ra[k]} != {rb[k]}"
    for k in a.g:
        if a.g[k] != b.g[k]:
            return f"{k}: {a.g[k]} != {b.g[k]}"
    return None


def diff_record(a: SlotRecord, b: SlotRecord, charged: bool = True) -> Optional[str]:
    if a.tokens != b.tokens:
        return f"tokens: {a.tokens} != {b.tokens}"
    for k in RECORD_FLAGS:
        if a.flags[k] != b.flags[k]:
            return f"{k}: {a.flags[k]} != {b.flags[k]}"
    if charged and a.charged != b.charged:
        return f"charged: {a.charged} != {b.charged}"
    if a.error != b.error or a.error_kind != b.error_kind:
        return f"error: {a.error}/{a.error_kind} != {b.error}/{b.error_kind}"
    return None
