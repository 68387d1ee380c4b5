"""`schedproof sweep --boundary solver`: the boundary along the last varied knob from the solver, over
every value of its range, not read off the grid.

For a design with ranges, `check` takes an engine knob as a range as readily as a fixed value: one
query ("is a violation reachable within the depth for some max_num_tokens in [a, b]?") covers every
value between a and b. A row's threshold is found by such queries, halving the undecided interval:

    unsafe = the largest value with a violation found so far (each found trace names its value)
    safe_from = the smallest value s with no violation for any value in [s, HI]
    query [m, safe_from - 1] for m halfway through [unsafe + 1, safe_from - 1]:
        a violation at v >= m  -> unsafe = v          (a witness, replayed in the simulator)
        none up to the depth   -> safe_from = m

until unsafe + 1 = safe_from: then "knob >= safe_from" suffices up to the depth, for every value in
[safe_from, HI], and it is tight (a trace at safe_from - 1). Nothing here assumes safety is monotone
in the knob: below the threshold a value may be safe again (the grid's points there are still
judged one by one), and "a larger pool never hurts" is false for the field design
(docs/sweep.md). The grid points at or above the threshold need no run of their own: the interval
query covered them. Where two knobs vary and both can be ranges, one more query over the box (every
value of the first knob, not only the grid's rows, with the last from the largest row threshold up)
states the boundary for the whole region.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Callable, Optional

from model.config import ConfigError
from model.symbolic.slots import Knobs

from .scenario import ScenarioError
from .sweep import Point, Vary, at_point, in_pool, is_check_file, search_table

RANGEABLE = tuple(f"engine.{name}" for name in Knobs.NUMERIC)


@dataclasses.dataclass
class Query:
    box: dict              # knob short name -> [lo, hi] queried
    verdict: str           # violated | bounded | unknown | refused
    detail: str
    witness: Optional[int] = None      # violated: the last knob's value in the trace
    depth: int = 0                     # bounded: the depth covered; violated: the trace's transitions
    seconds: float = 0.0


@dataclasses.dataclass
class RowBoundary:
    row: tuple             # the values of the other varied knobs
    knob: str
    lo: int
    hi: int
    safe_from: Optional[int]           # no violation for any value in [safe_from, hi]; None: none certified
    unsafe_at: Optional[int]           # the largest value with a violation found
    violation: str = ""                # that violation, in words
    depth: Optional[int] = None        # the depth the safe side is covered to
    queries: list[Query] = dataclasses.field(default_factory=list)
    stopped: str = ""                  # why the halving stopped early (a time-out, a refusal)

    def covers(self, value: int) -> bool:
        return self.safe_from is not None and self.safe_from <= value <= self.hi

    def sentence(self, varies: list[Vary]) -> str:
        where = ", ".join(f"{v.short} = {x}" for v, x in zip(varies[:-1], self.row))
        prefix = f"at {where}: " if where else ""
        k, n = self.knob, len(self.queries)
        asked = f"{n} solver quer{'y' if n == 1 else 'ies'}"
        if self.stopped and self.safe_from is None and self.unsafe_at is None:
            return f"{prefix}no solver boundary: {self.stopped}"
        if self.safe_from == self.lo:
            return (f"{prefix}safe for every {k} in [{self.lo}, {self.hi}]: no violation up to depth {self.depth} "
                    f"({asked})")
        if self.unsafe_at == self.hi:
            return f"{prefix}unsafe at {k} = {self.hi}, the top of the range ({self.violation}): no safe threshold"
        parts = []
        if self.safe_from is not None:
            parts.append(f"{k} >= {self.safe_from} suffices: no violation up to depth {self.depth} for any {k} in "
                         f"[{self.safe_from}, {self.hi}]")
        if self.unsafe_at is not None:
            tight = self.safe_from is not None and self.unsafe_at + 1 == self.safe_from
            parts.append(f"{'and is tight: ' if tight else ''}at {k} = {self.unsafe_at}, {self.violation}")
        if self.stopped:
            gap = (self.unsafe_at + 1 if self.unsafe_at is not None else self.lo,
                   self.safe_from - 1 if self.safe_from is not None else self.hi)
            parts.append(f"between {gap[0]} and {gap[1]} undecided ({self.stopped})")
        return f"{prefix}{'; '.join(parts)} ({asked})"

    def as_dict(self, varies: list[Vary]) -> dict:
        return {**{v.short: x for v, x in zip(varies[:-1], self.row)}, "knob": self.knob, "range": [self.lo, self.hi],
                "safe_from": self.safe_from, "unsafe_at": self.unsafe_at, "violation": self.violation,
                "depth": self.depth, "stopped": self.stopped, "sentence": self.sentence(varies),
                "queries": [dataclasses.asdict(q) | {"seconds": round(q.seconds, 3)} for q in self.queries]}


def solver_problem(raw: dict, varies: list[Vary]) -> Optional[tuple[str, str]]:
    """Why the solver cannot state this sweep's boundary, as (field, reason); None if it can."""
    if not is_check_file(raw):
        return "--boundary", "the solver's boundary needs a design with ranges (a scenario is judged by run)"
    if varies[-1].knob not in RANGEABLE:
        return "--boundary", (f"the solver's boundary is along the last --vary knob, which must be one a check "
                              f"takes as a range ({', '.join(k.removeprefix('engine.') for k in RANGEABLE)}); "
                              f"got {varies[-1].short}")
    return None


def query(path: str, raw: dict, varies: list[Vary], row: tuple, boxes: dict, timeout: float) -> Query:
    """Is a violation reachable, within the file's depth, for some values in `boxes` ({knob: (lo, hi)})?
    The file is set at the row's values (`at_point`, which also drops an engine's own pool knob when the
    pool varies as num_blocks), then each knob of `boxes` becomes its range."""
    start = time.perf_counter()
    table = at_point(raw, varies, row + (varies[-1].values[0],))
    for knob, (lo, hi) in boxes.items():
        table["engine"][knob.removeprefix("engine.")] = [lo, hi]
    box = {k.removeprefix("engine."): list(v) for k, v in boxes.items()}
    try:
        found = search_table(path, table, timeout, shortest=False)
    except (ScenarioError, ConfigError) as exc:
        return Query(box, "refused", f"{exc.field}: {exc.reason}", seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if found.status == "violated":       # replayed in the simulator by search_table
        value = getattr(found.cex.cfg, varies[-1].knob.removeprefix("engine."))
        return Query(box, "violated", f"{found.cex.property} in {found.cex.depth} transitions "
                                      f"({found.cex.steps} engine steps), replayed in the simulator",
                     witness=value, depth=found.cex.depth, seconds=seconds)
    if found.status == "bounded":
        return Query(box, "bounded", f"no violation up to depth {found.depth}", depth=found.depth, seconds=seconds)
    return Query(box, "unknown", f"{found.reason} after depth {found.depth}", seconds=seconds)


def row_boundary(path: str, raw: dict, varies: list[Vary], row: tuple, timeout: float) -> RowBoundary:
    """The threshold along the last knob at one row, by halving the undecided interval (module doc)."""
    last = varies[-1]
    lo, hi = last.values[0], last.values[-1]
    out = RowBoundary(row, last.short, lo, hi, None, None)
    unsafe, safe_from = lo - 1, hi + 1
    while unsafe + 1 < safe_from:
        a, b = unsafe + 1, safe_from - 1
        m = a if not out.queries else (a + b + 1) // 2     # first ask the whole range: often it decides alone
        q = query(path, raw, varies, row, {last.knob: (m, b)}, timeout)
        out.queries.append(q)
        if q.verdict == "violated":
            unsafe, out.unsafe_at, out.violation = q.witness, q.witness, q.detail
        elif q.verdict == "bounded":
            safe_from, out.safe_from = m, m
            out.depth = q.depth if out.depth is None else min(out.depth, q.depth)
        else:
            out.stopped = f"a query over [{m}, {b}]: {q.detail}"
            break
    return out


def box_boundary(path: str, raw: dict, varies: list[Vary], rows: list[RowBoundary], timeout: float) -> Optional[Query]:
    """With two varied knobs that can both be ranges and a threshold in every row: one query over every
    value of the first knob and the last from the largest threshold up."""
    if len(varies) != 2 or varies[0].knob not in RANGEABLE or len(rows) < 2:
        return None
    if any(r.safe_from is None for r in rows):
        return None
    first, last = varies
    t = max(r.safe_from for r in rows)
    return query(path, raw, varies, (first.values[0],), {first.knob: (first.values[0], first.values[-1]),
                                                          last.knob: (t, last.values[-1])}, timeout)


def box_sentence(varies: list[Vary], q: Query) -> str:
    first, last = varies
    (a, b), (t, hi) = q.box[first.short], q.box[last.short]
    if q.verdict == "bounded":
        return (f"for every {first.short} in [{a}, {b}] (every value, not only the grid's rows) and every "
                f"{last.short} in [{t}, {hi}]: no violation up to depth {q.depth} (one solver query)")
    if q.verdict == "violated":
        return (f"between the grid's rows a larger threshold is needed: {first.short} in [{a}, {b}] with "
                f"{last.short} >= {t} has a violation ({q.detail})")
    return f"the query over {first.short} in [{a}, {b}] and {last.short} in [{t}, {hi}]: {q.verdict} ({q.detail})"


def covered_points(varies: list[Vary], rows: list[RowBoundary]) -> dict[tuple, Point]:
    """The grid points an interval query covered, as points: none of them needs a run of its own."""
    out = {}
    for r in rows:
        for value in varies[-1].values:
            if r.covers(value):
                values = r.row + (value,)
                out[values] = Point(values, "bounded", f"no violation up to depth {r.depth} (the solver's query "
                                                       f"over {r.knob} in [{r.safe_from}, {r.hi}])", True)
    return out


def boundaries(path: str, raw: dict, varies: list[Vary], timeout: float, workers: int = 1,
               progress: Optional[Callable[[int, int], None]] = None) -> list[RowBoundary]:
    """Every row's boundary: each row's halving is sequential by nature, the rows run side by side on
    `workers` local processes. A row whose worker dies is reported as stopped, never dropped."""
    rows = list(itertools.product(*(v.values for v in varies[:-1])))
    done: dict[tuple, RowBoundary] = {}
    if workers <= 1 or len(rows) == 1:
        for row in rows:
            done[row] = row_boundary(path, raw, varies, row, timeout)
            if progress:
                progress(len(done), len(rows))
        return [done[r] for r in rows]
    jobs = {row: (path, raw, varies, row, timeout) for row in rows}
    lost = in_pool(row_boundary, jobs, min(workers, len(rows)), done,
                   lambda: progress(len(done), len(rows)) if progress else None)
    last = varies[-1]
    for row in lost:      # reported, never dropped: the row's halving is not run again
        done[row] = RowBoundary(row, last.short, last.values[0], last.values[-1], None, None,
                                stopped="its worker died")
    return [done[r] for r in rows]
