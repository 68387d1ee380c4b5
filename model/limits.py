"""The limits on every number a user gives, each with its reason, in one place.

Scenario files, check files, command-line flags and environment values are all held to these, so
a fixed value and a range's end, a `run` file and a `check` file mean the same thing, and a value
out of its limit is refused up front in one line that names the limit and why it is there
(README.md, "Limits", lists them).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Limit:
    low: float
    high: float
    why: str

    def refusal(self, value) -> Optional[str]:
        """Why `value` is refused, or None: a finite number in [low, high]."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number (got {value!r})"
        if not self.low <= value <= self.high:
            return f"must be in [{text(self.low)}, {text(self.high)}] (got {value!r}): {self.why}"
        return None


def text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# Every integer of a design or a workload (tokens, pages, steps, counts, priorities), fixed or a range's end.
VALUE = Limit(-(1 << 20), 1 << 20, "the symbolic unrolling computes in 32 bits, and values a core derives from "
                                   "these stay below 2^31; run and check hold a file to the same limits")
MAX_VALUE = int(VALUE.high)

# Requests in one `run` workload (a check unrolls at most checkers.space.MAX_SLOTS).
REQUESTS = Limit(1, 4096, "a run keeps every state with every request, so time and memory grow with the square "
                          "of the count (bench/run_scaling.py: 1000 requests 21 s and 88 MiB, 2000 74 s and "
                          "218 MiB on the 2-core machine; 4096 about 5 minutes)")

# Bytes of KV cache per token (TensorRT-LLM's conversion of a memory budget into pages).
BYTES_PER_TOKEN = Limit(1, 1 << 30, "a GiB per token is beyond any model's KV entry; the pages it converts to "
                                    "are held to the value limit")

# Command-line flags and the [check] table.
TIMEOUT = Limit(0.001, 7 * 86400, "seconds; a week at most: split a longer campaign")
BUDGET = Limit(0.001, 7 * 86400, "seconds of solving, counted in Z3's resource units (checkers/clock.py); a week at "
                                 "most: split a longer campaign")
DEPTH = Limit(1, 1000, "transitions; each adds a copy of the state's terms to the solver")
STEPS = Limit(1, 10_000_000, "engine steps; the run keeps every state in memory")
STEP_TIMEOUT = Limit(0.1, 3600, "seconds; below 0.1 s an ordinary engine step on this CPU reads as a hang")
COUNT = Limit(1, 1_000_000, "a positive count")
SEED = Limit(0, 2**32 - 1, "a 32-bit seed, printed in every report so the run can be replayed")
# `fuzz --workers`: seeds searched at once.
WORKERS = Limit(1, 64, "one process per seed, all at once, each a fresh interpreter holding its target (the "
                       "reference: about 110 MiB; a real engine: its model besides); run a larger campaign as "
                       "several, with --seed, sharing the --database")
