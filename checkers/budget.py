"""Solver limits counted in Z3's resource units, so that what a proof inside a search decides does not
depend on how loaded the machine is.

A wall-clock limit makes the same query prove on an idle machine and time out beside another job; then
the lemmas `check` assumes, or whether acceleration is sound for a slot count, and so the trace it
prints, change with the load. Z3's `rlimit` counts the solver's own work instead: the same query with
the same limit ends the same way on any machine load (and with the same Z3). The budgets below are
stated in seconds of this project's reference machine and converted at the rate measured there
(`bench/rlimit_rate.py`). The caller's own deadline is a time of checkers/clock.py's clock, counted in the
same work, and the only wall-clock limit is that clock's cap (the CLI's --timeout). The rate was measured on lemma
obligations; the search's unrollings use the units several times faster (field design, 3-6 slots: a
slice of 120 "seconds" ran out in 7-9 s, 2026-12-05), so a search slice is a unit of work, not a time.
"""

from __future__ import annotations

# Z3 resource units per second of solving on the reference machine (2-core CPU): lemma obligations
# of four bundled check files measured 3.0M-3.9M idle, 2.6M-3.8M beside another job
# (bench/rlimit_rate.py, docs/benchmarks.md, 2026-12-02).
RLIMIT_PER_SECOND = 3_000_000
# Z3 takes `rlimit` as an unsigned 32-bit number and keeps only its low 32 bits: a larger budget wrapped
# around to a small one (a search slice of 1920 s became 488 s, and the doublings after it no larger),
# so no query is given more than this.
MAX_RLIMIT = 2 ** 32 - 1


def units(seconds: float) -> int:
    """The resource units of `seconds` of the reference machine's solving, at most MAX_RLIMIT."""
    return max(1, min(MAX_RLIMIT, int(seconds * RLIMIT_PER_SECOND)))


def over_limit(seconds: float) -> bool:
    """Whether `seconds` of solving is more than one query can be given (MAX_RLIMIT)."""
    return seconds * RLIMIT_PER_SECOND >= MAX_RLIMIT


def spent(solver) -> int:
    """Z3's work counter as this solver reports it (0 when it reports none). The counter is the
    context's, shared by every solver, so only a difference across one check is that check's work;
    a check's `rlimit` is counted from where the counter stands when it starts."""
    stats = solver.statistics()
    return int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else 0
