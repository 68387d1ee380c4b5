"""Program points of the micro-steps' pass (trtllm_v2_micro.py `V2ArrayModel.step`) and how far the pass has got
with one index at each: what the invariants of every class are stated against."""

from __future__ import annotations

import dataclasses
from typing import Any

from model.symbolic.slots import CANCELLED, DECODING, FAILED, FINISHED, PENDING, PREEMPTED, PREFILLING, REJECTED, WAITING

V2_PHASES = (PENDING, WAITING, PREFILLING, DECODING, PREEMPTED, FINISHED, FAILED, REJECTED, CANCELLED)
ORDER = ("P0", "ARR", "GEN", "EV", "RP", "CTX", "PFP", "DET", "FAIL", "EXEC")
PROGRESS_POINTS = ("ARR", "GEN", "EV", "RP", "CTX", "PFP", "DET")   # where Q's facts are carried


@dataclasses.dataclass(frozen=True)
class Point:
    kind: str
    c: Any = None
    j: Any = None

    def after(self, kind: str) -> bool:
        return ORDER.index(self.kind) > ORDER.index(kind)


def stages(p: Point, j, n):
    """(arrived, executed, generation cursor, context cursor) of index j at point p, as terms."""
    arrived = False if p.kind == "P0" else (j < p.c if p.kind == "ARR" else True)
    executed = j < p.c if p.kind == "EXEC" else False
    if p.kind == "GEN":
        gc = p.c
    elif p.kind in ("EV", "RP"):
        gc = p.c + 1
    elif p.after("RP"):
        gc = n
    else:
        gc = 0
    if p.kind == "CTX":
        cc = p.c
    elif p.kind == "PFP":
        cc = p.c + 1
    elif p.after("PFP"):
        cc = n
    else:
        cc = 0
    return arrived, executed, gc, cc
