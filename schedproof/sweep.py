"""`schedproof sweep FILE --vary KNOB=LO..HI[:STEP]`: where a design is safe, point by point.

Each point is the file with the varied knobs set, in the file's own terms (so a pool given as
TensorRT-LLM's `kv_cache_max_tokens` is converted as the engine does, and each point is validated
as a file would be). A scenario file (a concrete workload) is judged by `run` at each point; a file
with ranges or a [check] table by `check` (violated with its trace length, bounded to a depth, or
unknown at the time-out). Points run in parallel on local worker processes; points lost with a dying
worker run again in a fresh pool, then alone, and a point whose own worker dies is reported as an error,
never dropped.

The boundary is stated where the grid shows one: along the last varied knob, the smallest safe value
for each value of the others ("safe iff max_num_tokens >= 2412"); where safety is not monotone in a
knob, the grid holds a counterexample to "more of it never hurts", and the boundary says so. For a
design with ranges, schedproof/sweepsolver.py states the boundary from the solver instead, over every
value of the range, and the grid points its queries cover are passed here as `covered`, not run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import itertools
import os
import socket
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Optional

import model.symbolic.cores  # noqa: F401  (registers every core, in a Ray worker too)
from checkers import clock
from checkers.bmc import BmcResult, search
from checkers.replay import replay
from model.config import ConfigError
from model.policy import POLICIES
from model.symbolic.core import CORES

from .checkspec import check_from_table, has_ranges
from .runner import run_scenario
from .scenario import ENGINE_KEYS, ScenarioError, from_table, read_toml

MAX_POINTS = 10_000


@dataclasses.dataclass(frozen=True)
class Vary:
    knob: str              # the file's field, "engine.max_num_tokens" or "engine.options.kv_cache_max_tokens"
    values: tuple[int, ...]

    @property
    def short(self) -> str:
        return self.knob.removeprefix("engine.").removeprefix("options.")


@dataclasses.dataclass
class Point:
    values: tuple[int, ...]
    verdict: str           # ok | deadlock | livelock | crash | violation | unknown | violated | bounded | refused | error
    detail: str            # "12/12 complete", "depth 4 (516 engine steps)", the refusal, the error
    safe: Optional[bool]   # None: nothing claimed (unknown, refused, error)
    seconds: float = 0.0

    def as_dict(self, varies: list[Vary]) -> dict:
        return {**{v.short: x for v, x in zip(varies, self.values)}, "verdict": self.verdict, "detail": self.detail,
                "safe": self.safe, "seconds": round(self.seconds, 3)}


def parse_vary(path: str, text: str, policy: str) -> Vary:
    """`KNOB=LO..HI[:STEP]`; every problem a ScenarioError naming --vary (exit 2)."""
    where = f"--vary {text}"
    knob, eq, span = text.partition("=")
    if not eq:
        raise ScenarioError(path, where, "expected KNOB=LO..HI[:STEP]")
    knob = knob.strip()
    lo_hi, _, step_text = span.partition(":")
    lo_text, dots, hi_text = lo_hi.partition("..")
    if not dots:
        raise ScenarioError(path, where, "expected a range LO..HI")
    try:
        lo, hi = int(lo_text), int(hi_text)
        step = int(step_text) if step_text else 1
    except ValueError:
        raise ScenarioError(path, where, "LO, HI and STEP must be integers") from None
    if step <= 0:
        raise ScenarioError(path, where, f"STEP must be positive (got {step})")
    if hi < lo:
        raise ScenarioError(path, where, f"the range is reversed ({lo} > {hi})")
    values = tuple(range(lo, hi + 1, step))
    return Vary(_field(path, where, knob, policy), values)


def _field(path: str, where: str, knob: str, policy: str) -> str:
    options = {f.name for f in dataclasses.fields(POLICIES[policy].Options)}
    numeric = sorted((ENGINE_KEYS - {"policy", "options", "chunked_prefill"}))
    name = knob.removeprefix("engine.")
    if name in numeric:
        return f"engine.{name}"
    name = name.removeprefix("options.")
    if name in options:
        return f"engine.options.{name}"
    raise ScenarioError(path, where, f"unknown knob {knob!r} for {policy} (knobs: {', '.join(numeric)}; "
                                     f"options: {', '.join(sorted(options))})")


def plan(path: str, texts: list[str]) -> tuple[dict, list[Vary]]:
    """The file as a table and the varied knobs, checked before any point runs."""
    raw = read_toml(path)
    engine = raw.get("engine") if isinstance(raw.get("engine"), dict) else {}
    policy = engine.get("policy")
    if policy not in POLICIES:
        raise ScenarioError(path, "engine.policy", f"unknown policy {policy!r} (known: {', '.join(sorted(POLICIES))})")
    if not texts:
        raise ScenarioError(path, "--vary", "give at least one knob to vary")
    varies = [parse_vary(path, t, policy) for t in texts]
    seen = [v.knob for v in varies]
    if len(set(seen)) != len(seen):
        raise ScenarioError(path, "--vary", "a knob is varied twice")
    points = 1
    for v in varies:
        points *= len(v.values)
    if points > MAX_POINTS:
        raise ScenarioError(path, "--vary", f"{points} points; at most {MAX_POINTS}")
    return raw, varies


def is_check_file(raw: dict) -> bool:
    return "check" in raw or has_ranges(raw)


def at_point(raw: dict, varies: list[Vary], values: tuple[int, ...]) -> dict:
    table = copy.deepcopy(raw)
    for vary, value in zip(varies, values):
        parts = vary.knob.split(".")
        node = table
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        if vary.knob == "engine.num_blocks":      # the pool given once: drop the engine's own pool knob
            policy = POLICIES[table["engine"]["policy"]]
            if policy.pool_option:
                table["engine"].get("options", {}).pop(policy.pool_option, None)
    return table


# -- one point ----------------------------------------------------------------------------------------------------

def judge(path: str, raw: dict, varies: list[Vary], values: tuple[int, ...], timeout: float) -> Point:
    """The verdict at one point: `run` for a concrete scenario, `check` for a design with ranges."""
    start = time.perf_counter()
    table = at_point(raw, varies, values)
    try:
        if is_check_file(table):
            point = _check_point(path, table, values, timeout)
        else:
            point = _run_point(path, table, values)
    except (ScenarioError, ConfigError) as exc:
        reason = exc.reason if hasattr(exc, "reason") else str(exc)
        point = Point(values, "refused", f"{getattr(exc, 'field', '-')}: {reason}", None)
    point.seconds = time.perf_counter() - start
    return point


def _run_point(path: str, table: dict, values) -> Point:
    result = run_scenario(from_table(path, table))
    if result.verdict == "unknown":
        return Point(values, "unknown", f"step limit after {result.steps} steps", None)
    return Point(values, result.verdict, f"{result.completed}/{result.total} complete, {result.steps} steps",
                 result.verdict == "ok")


def search_table(path: str, table: dict, timeout: float, shortest: bool = True) -> BmcResult:
    """`check`'s search on a design's table (ScenarioError for a table it refuses). A counterexample the
    simulator does not replay becomes unknown: a trace is never reported unreplayed. In a Z3 context of its own
    (`clock.fresh_context`), so a point's verdict does not depend on the points its worker solved before."""
    spec = check_from_table(path, table)
    with clock.fresh_context():
        found = search(CORES[spec.space.template.policy], spec.space, spec.max_depth, timeout,
                       list(spec.properties) if spec.properties else None, minimise=False, shortest=shortest)
    if found.status == "violated":
        rep = replay(found.cex)
        if not rep.ok:
            found.status, found.reason = "unknown", f"the solver's trace did not replay: {rep.message}"
    return found


def _check_point(path: str, table: dict, values, timeout: float) -> Point:
    # A point asks only whether the design is safe: the first replayed counterexample answers it, and certifying
    # it shortest over larger request counts (what `check` does next) could take the rest of the time-out on a
    # big design, per point. Its depth is then shortest among the runs its scope names.
    found = search_table(path, table, timeout, shortest=False)
    if found.status == "violated":
        scope = f"; shortest among {found.scope}" if found.scope else ""
        return Point(values, "violated", f"{found.cex.property} at depth {found.cex.depth} "
                                         f"({found.cex.steps} engine steps{scope})", False)
    if found.status == "bounded":
        return Point(values, "bounded", f"no violation up to depth {found.depth}", True)
    return Point(values, "unknown", f"{found.reason} after depth {found.depth}", None)


# -- all the points ------------------------------------------------------------------------------------------------

def sweep(path: str, raw: dict, varies: list[Vary], workers: int, timeout: float,
          progress: Optional[Callable[[int, int], None]] = None, covered: Optional[dict] = None) -> list[Point]:
    """Every point of the grid, in grid order; `covered` points (the solver's interval queries judged
    them) are not run again. With `workers` > 1 the points run in that many local processes; a pool
    broken by a dying worker is replaced and its unfinished points run again, then alone (see below)."""
    grid = list(itertools.product(*(v.values for v in varies)))
    done: dict[tuple, Point] = dict(covered or {})
    if workers <= 1:
        for values in grid:
            if values in done:
                continue
            done[values] = judge(path, raw, varies, values, timeout)
            if progress:
                progress(len(done), len(grid))
        return [done[v] for v in grid]
    todo = _in_pool(path, raw, varies, [v for v in grid if v not in done], workers, timeout, done, progress,
                    len(grid))
    if todo:       # a worker died and took the pool with it: once more in a fresh pool
        todo = _in_pool(path, raw, varies, todo, workers, timeout, done, progress, len(grid))
    for values in todo:
        # lost twice, perhaps only beside the point that kills its worker: each alone in its own process now,
        # so that only a point whose own worker dies is reported as an error (never dropped)
        if not _in_pool(path, raw, varies, [values], 1, timeout, done, progress, len(grid)):
            continue
        done[values] = Point(values, "error", "its worker died: lost twice with its pool, then it died again running alone",
                             None)
    return [done[v] for v in grid]


def _in_pool(path, raw, varies, todo, workers, timeout, done, progress, total) -> list:
    return in_pool(judge, {values: (path, raw, varies, values, timeout) for values in todo}, workers, done,
                   lambda: progress(len(done), total) if progress else None)


def in_pool(fn: Callable, jobs: dict, workers: int, done: dict, each: Callable[[], None]) -> list:
    """`done[key] = fn(*args)` for every `key: args` of `jobs` on `workers` local processes, calling `each`
    after each; the keys lost with a pool a dying worker broke are returned, for the caller to decide."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, *args): key for key, args in jobs.items()}
        for future in concurrent.futures.as_completed(futures):
            key = futures[future]
            try:
                done[key] = future.result()
            except BrokenProcessPool:
                continue
            each()
    return [key for key in jobs if key not in done]


def sweep_on_ray(path: str, raw: dict, varies: list[Vary], address: str, timeout: float,
                 progress: Optional[Callable[[int, int], None]] = None, covered: Optional[dict] = None) -> list[Point]:
    """Every point as a task on the Ray cluster at `address` (`ray start --head` prints it). Ray runs
    a task again when its worker dies (up to twice); a point lost after that is reported as an error."""
    grid = list(itertools.product(*(v.values for v in varies)))
    # Ray's driver prints the cluster's news ("(raylet) A worker died ...") on stdout, where the table or
    # the JSON goes: it goes to stderr instead while the cluster is in use
    with contextlib.redirect_stdout(sys.stderr):
        return _on_ray(_ray(path, address), path, raw, varies, grid, timeout, progress, dict(covered or {}))


def _on_ray(ray, path, raw, varies, grid, timeout, progress, done: dict) -> list[Point]:
    pending: dict = {}
    try:
        remote = ray.remote(max_retries=2)(judge)
        pending = {remote.remote(path, raw, varies, values, timeout): values for values in grid if values not in done}
        # awaited as futures, here in Python: Ray's own waits turn a signal's exception (interrupts.py) into a
        # KeyboardInterrupt of theirs, which no longer says which signal it was
        futures = {ref.future(): ref for ref in pending}
        for future in concurrent.futures.as_completed(futures):
            values = pending.pop(futures[future])
            try:
                done[values] = future.result()
            except ray.exceptions.RayError as exc:
                done[values] = Point(values, "error", f"lost on the cluster: {type(exc).__name__}", None)
            if progress:
                progress(len(done), len(grid))
        return [done[v] for v in grid]
    finally:
        for ref in pending:      # what a signal left running
            ray.cancel(ref, force=True)
        ray.shutdown()


def _ray(path: str, address: str):
    """Ray connected to `address`; a missing Ray or an unreachable address is bad input (exit 2)."""
    try:
        import ray
    except ImportError:
        raise ScenarioError(path, "--ray", "Ray is not installed (pip install 'schedproof[ray]')") from None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ScenarioError(path, "--ray", f"{address!r} is not HOST:PORT")
    try:     # Ray itself waits a long time for an address that does not answer: ask first, briefly
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ScenarioError(path, "--ray", f"cannot reach a Ray cluster at {address}: "
                                           f"{exc.strerror or exc}") from None
    # the cluster's workers import schedproof from their own environment (installed there as here)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return ray


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


# -- the boundary --------------------------------------------------------------------------------------------------

def boundary(varies: list[Vary], points: list[Point]) -> list[str]:
    """Along the last varied knob: for each value of the others, the safe values as a threshold where
    they are one; a grid row where safety is not monotone is named (a counterexample to "more never hurts")."""
    last = varies[-1]
    rows: dict[tuple, list[Point]] = {}
    for p in points:
        rows.setdefault(p.values[:-1], []).append(p)
    lines, thresholds = [], {}
    for key, row in rows.items():
        where = ", ".join(f"{v.short} = {x}" for v, x in zip(varies[:-1], key))
        known = [p for p in row if p.safe is not None]
        safe = [p.values[-1] for p in known if p.safe]
        unsafe = [p.values[-1] for p in known if not p.safe]
        prefix = f"at {where}: " if where else ""
        unclaimed = len(row) - len(known)
        if unclaimed:
            prefix += f"({unclaimed} of {len(row)} points refused or unknown; of the rest) "
        if not known:
            lines.append(f"{prefix}no verdict")
            thresholds[key] = None
        elif not safe:
            lines.append(f"{prefix}unsafe at every {last.short} in {last.values[0]}..{last.values[-1]}")
            thresholds[key] = None
        elif not unsafe:
            lines.append(f"{prefix}safe at every {last.short} in {last.values[0]}..{last.values[-1]}")
            thresholds[key] = last.values[0]
        elif max(unsafe) < min(safe):
            lines.append(f"{prefix}safe iff {last.short} >= {min(safe)} (on this grid: unsafe at {max(unsafe)})")
            thresholds[key] = min(safe)
        elif max(safe) < min(unsafe):
            lines.append(f"{prefix}safe iff {last.short} <= {max(safe)} (unsafe at {min(unsafe)}): "
                         f"a larger {last.short} hurts here")
            thresholds[key] = None
        else:
            bad = next(u for u in sorted(unsafe) if any(s < u for s in safe))
            good = max(s for s in safe if s < bad)
            lines.append(f"{prefix}not monotone in {last.short}: safe at {good}, unsafe at {bad}")
            thresholds[key] = None
    if len(rows) > 1 and len(set(thresholds.values())) == 1 and None not in thresholds.values():
        t = next(iter(thresholds.values()))
        lines.insert(0, "safe at every point of the grid" if t == last.values[0] else
                     f"everywhere in the grid: safe iff {last.short} >= {t} (between grid points: not checked)")
    return lines
