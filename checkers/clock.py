"""The checkers' clock: seconds of the reference machine's solving, read from Z3's work counter, so that
a verdict, the depth it reached and its trace depend on the file, the seed and the budget alone.

Every deadline of `check`, `prove`, the design review and the proofs inside them is a time on this clock:
how much the budget was when a search started, how much a claim may still have, which unit of the search has
had the least of it. The clock reads Z3's `rlimit count` (the work the solver did, counted by Z3 in the same
units on any machine load, for the same Z3 release) and converts it at the rate measured on this project's
reference machine (2 cores), one rate per kind of query:

- OBLIGATION_RATE, for validity queries over one step (lemmas, acceleration, induction, the parametric
  arguments): 3.0M-3.9M units a second (bench/rlimit_rate.py, checkers/budget.py);
- UNROLLING_RATE, for the bounded search's queries over an unrolling (`with rate(UNROLLING_RATE)`):
  18-44M units a second (the vLLM chunked-off wedge and the field design's defaults, 2026-12-05); the rate
  taken is near the field design's, whose searches are the long ones.

So one clock second is about one second of this machine's solving, idle; Python's own time (building
encodings) is not counted, and on another machine the clock runs at that machine's speed. A wall-clock
cap (`cap`, the CLI's --timeout) stays on top: once it passes, `now()` is infinite (every deadline has
passed), the query in flight is interrupted, and `cut()` says so, because a verdict cut by the wall clock
is not reproducible and must not read like one cut by the budget.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Iterator, Optional

import z3

from .budget import MAX_RLIMIT, RLIMIT_PER_SECOND, spent

OBLIGATION_RATE = RLIMIT_PER_SECOND
UNROLLING_RATE = 40_000_000
# Z3's "no time limit" (its default `timeout`, an unsigned 32-bit number of milliseconds)
NO_TIMEOUT_MS = 2 ** 32 - 1


def _count() -> int:
    """Z3's work counter: the main context's, which every solver here shares (a fresh solver reports it)."""
    return spent(z3.Solver())


class _Clock:
    def __init__(self) -> None:
        self.seconds = 0.0                   # clock seconds up to `count`
        self.count = _count()
        self.rates = [OBLIGATION_RATE]       # the innermost `rate` block's last
        self.wall_deadline: Optional[float] = None
        self.was_cut = False

    def read(self) -> float:
        c = _count()
        self.seconds += (c - self.count) / self.rates[-1]
        self.count = c
        return self.seconds


_CLOCK = _Clock()


def now() -> float:
    """Clock seconds so far in this process; infinite once the wall-clock cap has passed."""
    return math.inf if cut() else _CLOCK.read()


def until(deadline: float) -> float:
    """Clock seconds left until `deadline` (a time on this clock): 0 once the wall-clock cap has passed. Every
    caller asks this, never `deadline - now()`: past the cap `now()` is infinite, and so is a deadline taken
    from it, and infinity minus infinity is NaN, which no `left <= 0` test catches (a capped `check` ended in a
    traceback that way: bench/solver_versions.py, 2026-12-06)."""
    return 0.0 if cut() else deadline - _CLOCK.read()


@contextlib.contextmanager
def rate(units_per_second: int) -> Iterator[None]:
    """Count the work done inside at `units_per_second` (UNROLLING_RATE for the search's queries)."""
    _CLOCK.read()
    _CLOCK.rates.append(units_per_second)
    try:
        yield
    finally:
        _CLOCK.read()
        _CLOCK.rates.pop()


@contextlib.contextmanager
def fresh_context() -> Iterator[None]:
    """Everything inside builds its terms and solvers in a new Z3 context, the one `z3.main_ctx()` returns
    meanwhile, and the clock counts that context's work. A context that has made and freed millions of terms
    serves new ones from scattered memory: the v1-budget-reuse-trim-floor search took 110 s after two million
    terms were made and freed in the main context, 77 s after none, 76 s after as many in a context of their
    own or with the search in a fresh one (bench/context_churn.py). And what the process solved before cannot
    change the work, so a verdict cannot depend on it. Terms made inside cannot be mixed with terms made outside."""
    _CLOCK.read()
    outer = z3.main_ctx()
    z3.z3._main_ctx = z3.Context()      # z3py's `main_ctx()` returns this module global (z3-solver 4.15)
    _CLOCK.count = _count()
    try:
        yield
    finally:
        _CLOCK.read()
        z3.z3._main_ctx = outer
        _CLOCK.count = _count()


def units_for(seconds: float) -> int:
    """Z3 resource units of `seconds` of this clock at the current rate (1 to MAX_RLIMIT)."""
    if seconds == math.inf:
        return MAX_RLIMIT
    return max(1, min(MAX_RLIMIT, int(seconds * _CLOCK.rates[-1])))


def limit(solver, seconds: float, units: Optional[int] = None) -> None:
    """Let each following `check` of `solver` run for at most `seconds` of this clock (its `rlimit`),
    `units` of work where that is less, and never past the wall-clock cap (its `timeout`)."""
    budget = units_for(seconds if seconds > 0 else 0.0)      # NaN too: no time
    solver.set("rlimit", budget if units is None else max(1, min(budget, units)))
    solver.set("timeout", wall_left_ms())


def wall_left_ms() -> int:
    """Milliseconds to the wall-clock cap (at least 1), or Z3's no-limit value without one."""
    if _CLOCK.wall_deadline is None:
        return NO_TIMEOUT_MS
    return max(1, min(NO_TIMEOUT_MS, int((_CLOCK.wall_deadline - time.monotonic()) * 1000)))


class Cap:
    """A wall-clock cap in force (`cap`): `cut` says, once it is over, whether it stopped anything."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.cut = False


@contextlib.contextmanager
def cap(seconds: Optional[float]) -> Iterator[Cap]:
    """A wall-clock cap of `seconds` (None: none) on everything inside."""
    saved = (_CLOCK.wall_deadline, _CLOCK.was_cut)
    _CLOCK.wall_deadline = None if seconds is None else time.monotonic() + seconds
    _CLOCK.was_cut = False
    held = Cap(seconds)
    try:
        yield held
    finally:
        held.cut = cut()
        _CLOCK.wall_deadline, _CLOCK.was_cut = saved


def cut() -> bool:
    """Whether the wall-clock cap in force has passed."""
    if _CLOCK.wall_deadline is not None and time.monotonic() >= _CLOCK.wall_deadline:
        _CLOCK.was_cut = True
    return _CLOCK.was_cut


def why_unknown(solver) -> str:
    """Why a query of `solver` came back unknown, in this clock's terms. Z3 says "canceled" (or "timeout", or
    "max. resource limit exceeded") both where its `rlimit` ran out and where the wall-clock cap passed."""
    reason = solver.reason_unknown()
    if reason in ("timeout", "canceled") or "resource" in reason:
        return "the wall-clock cap passed" if cut() else "time-out"
    return reason
