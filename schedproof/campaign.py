"""`schedproof fuzz --workers N`: seeds S .. S+N-1 searched at once, one local process each, all sharing one
Hypothesis example database, and the campaign's summary; `fuzz --ray HOST:PORT --seeds K` (`run_on_ray`): seeds
S .. S+K-1 as tasks on a Ray cluster, each in a fresh worker, the same database, the same summary. No printing
here: the command line prints.

Each seed runs `fuzz()` (schedproof/fuzz.py) in a fresh interpreter ("spawn"): nothing of this process (an
engine's threads, a CUDA context) is forked into it, and it loads the same project modules as
`fuzz --seed S --database DIR` alone, which matters because Hypothesis draws some values from the literals of the modules loaded in the process.
Each seed has an executor of its own: a worker that dies takes only its own seed with it, which is reported as an
error, never dropped (one pool of N would break as a whole and lose every seed still running, which
schedproof/sweep.py must run again; here there is nothing to run again).

The database keys a search by its target and options (schedproof/fuzz.py), not by its seed: a failure one seed
saved is replayed first, in Hypothesis's reuse phase, by every later search of the same target and options, in a
later campaign or in any other process given the same folder. A search reads the database as it was when the
campaign started, and what the seeds saved is written to it once they are all over (`Deferred`): Hypothesis
saves each step of a shrink as it goes and trusts what it reuses to be shrunk already (it then skips its own
shrink), so a seed that started a moment later would report another seed's half-shrunk failure; and each seed's
outcome depends on its seed and the database it started from, not on which worker came up first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Optional

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from targets import releases    # `fuzz` alone loads it too (below: the same modules in a seed's process)

# cli: loaded for its literals, in a Ray worker too (`run_on_ray`), so that the project modules a seed's process
# holds are those of `fuzz` alone, whose process is the command line (above: Hypothesis draws some values from them)
from . import cli, interrupts, reportdir  # noqa: F401
from .finding import from_fuzz
from .fuzz import FuzzResult, fuzz, write_report

# A DirectoryBasedExampleDatabase holds one folder per key, named by the first 16 hex digits of its SHA-384
# (hypothesis/database.py `_hash`), and nothing else at its top.
_KEY_FOLDER = re.compile(r"[0-9a-f]{16}")
# After a signal, how long the workers (`run` passes it on) have to hand back what they found: each ends within
# interrupts.HARD_STOP_SECONDS of it, plus the time its result takes to come back.
GRACE_SECONDS = interrupts.HARD_STOP_SECONDS + 2.0


def database_problem(folder: Path) -> Optional[str]:
    """Why `folder` cannot be the shared example database, or None; creates it. Checked before any search:
    Hypothesis ignores a failed write (a search would save nothing and say nothing), and a folder holding
    anything else (the reports, say) would get the database's folders mixed into it."""
    try:
        if folder.exists() and not folder.is_dir():
            return "exists and is not a folder"
        if folder.is_dir():
            foreign = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
                             if not (p.is_dir() and _KEY_FOLDER.fullmatch(p.name)))
            if foreign:
                shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
                return (f"is not a Hypothesis example database: it holds {shown} (a database holds only folders "
                        f"named by 16 hex digits); give an empty or new folder")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder):     # what a save does: a folder per key, a file in it
            pass
    except OSError as exc:
        return f"cannot create or write an example database there: {exc.strerror or exc}"
    return None


class Deferred(ExampleDatabase):
    """A database read through to `shared` as it stands, whose writes are kept here until `apply` writes them
    to it: the net effect of each (key, value), saved or deleted, whatever the order of the writes."""

    def __init__(self, shared: DirectoryBasedExampleDatabase):
        super().__init__()
        self.shared = shared
        self.path = shared.path          # for the report's command (fuzz.py: `--database PATH`)
        self.writes: dict[tuple[bytes, bytes], bool] = {}     # (key, value) -> saved (True) or deleted

    def fetch(self, key: bytes):
        values = {v for v in self.shared.fetch(key) if self.writes.get((key, v), True)}
        values |= {v for (k, v), saved in self.writes.items() if k == key and saved}
        return list(values)

    def save(self, key: bytes, value: bytes) -> None:
        self.writes[(key, value)] = True

    def delete(self, key: bytes, value: bytes) -> None:
        self.writes[(key, value)] = False

    def apply(self, writes: Optional[dict] = None) -> None:
        for (key, value), saved in (self.writes if writes is None else writes).items():
            (self.shared.save if saved else self.shared.delete)(key, value)


@dataclasses.dataclass
class Seed:
    seed: int
    result: Optional[FuzzResult]      # None: the search ended without one (`error` says how)
    error: str = ""
    report: Optional[Path] = None     # the finding's JSON report (fuzz.py write_report), once written
    folder: Optional[Path] = None     # its report folder

    @property
    def status(self) -> str:
        return "error" if self.result is None else self.result.status

    @property
    def property(self) -> Optional[str]:
        return self.result.property if self.result else None

    def as_dict(self) -> dict:
        r = self.result
        d = {"seed": self.seed, "status": self.status, "property": self.property,
             "examples": r.examples if r else None, "seconds": round(r.seconds, 2) if r else None,
             "report": str(self.report) if self.report else None}
        if self.error:
            d["error"] = self.error
        if r is not None and r.interrupted:
            d["interrupted"] = r.interrupted
        return d


@dataclasses.dataclass
class Campaign:
    target: str
    examples: int                     # per seed
    database: Path
    seeds: list[Seed]
    seconds: float
    interrupted: str = ""             # the signal that cut the campaign short, if one did

    @property
    def found(self) -> list[Seed]:
        return [s for s in self.seeds if s.status == "found"]

    @property
    def errors(self) -> list[Seed]:
        """The seeds whose search ended without a result (a dead worker, a lost task): their part of the
        campaign was not searched, so "nothing found" does not cover it."""
        return [s for s in self.seeds if s.status == "error"]

    def distinct(self) -> dict[str, list[Seed]]:
        """The seeds that found each property, in seed order."""
        out: dict[str, list[Seed]] = {}
        for s in self.found:
            out.setdefault(s.property, []).append(s)
        return out

    def as_dict(self) -> dict:
        d = {"status": "found" if self.found else "none", "target": self.target, "workers": len(self.seeds),
             "database": str(self.database), "seeds": [s.as_dict() for s in self.seeds],
             "examples": sum(s.result.examples for s in self.seeds if s.result),
             "findings": [s.seed for s in self.found],
             "distinct_findings": [{"property": p, "seeds": [s.seed for s in found],
                                    "report": str(found[0].report) if found[0].report else None}
                                   for p, found in self.distinct().items()],
             "seconds": round(self.seconds, 2)}
        if self.interrupted:
            d["interrupted"] = self.interrupted
        return d

    def lines(self) -> list[str]:
        span = f"{self.seeds[0].seed}..{self.seeds[-1].seed}"
        out = [f"campaign on {self.target}: {len(self.seeds)} seeds ({span}), {self.examples} examples each, "
               f"database {self.database}"]
        out += [f"  {seed_line(s)}" for s in self.seeds]
        distinct = self.distinct()
        if distinct:
            out.append(f"found {len(distinct)} distinct {'property' if len(distinct) == 1 else 'properties'} "
                       f"in {len(self.found)} of {len(self.seeds)} seeds ({self.seconds:.1f} s):")
            out += [f"  {p}: seeds {', '.join(str(s.seed) for s in found)}; report {found[0].report}"
                    for p, found in distinct.items()]
        elif not self.interrupted:
            out.append(f"nothing found in {len(self.seeds)} seeds x {self.examples} examples ({self.seconds:.1f} s); "
                       f"the search is not exhaustive")
        if self.errors:
            out.append(f"{len(self.errors)} seed(s) ended without a result: "
                       f"{', '.join(str(s.seed) for s in self.errors)}")
        if self.interrupted:
            cut = [s for s in self.found if s.result.interrupted]
            out.append(f"interrupted by {self.interrupted} after {self.seconds:.1f} s" +
                       (f"; what seeds {', '.join(str(s.seed) for s in cut)} found before it is saved, its shrinking "
                        f"cut short, not replayed" if cut else ""))
        return out


def seed_line(s: Seed) -> str:
    r = s.result
    if r is None:
        return f"seed {s.seed}: error: {s.error}"
    if r.status == "found":
        cut = f", before {r.interrupted}: shrinking cut short, not replayed" if r.interrupted else ""
        return f"seed {s.seed}: found [{r.property}] ({r.seconds:.1f} s{cut})" + (f" report: {s.report}"
                                                                                if s.report else "")
    if r.interrupted:
        return f"seed {s.seed}: nothing found before {r.interrupted} ({r.seconds:.1f} s)"
    return f"seed {s.seed}: nothing found in {r.examples} examples ({r.seconds:.1f} s)"


def search(target: str, examples: int, seed: int, options: dict, database: str,
           parent: int) -> tuple[FuzzResult, dict]:
    """One seed, in its local worker (`run`): `seed_search`, then, should the campaign be gone, nothing more."""
    found = seed_search(target, examples, seed, options, database)
    if os.getppid() != parent:
        # the campaign is gone (the SIGTERM of _worker_start ended the search): no one to hand the result to, and
        # the worker would wait for its next task for ever
        os._exit(128 + signal.SIGTERM)
    return found


def seed_search(target: str, examples: int, seed: int, options: dict, database: str,
                shown: Optional[str] = None) -> tuple[FuzzResult, dict]:
    """One seed, in its worker (a local process, or a task on Ray): `fuzz()` reading the shared database; its
    writes come back with its result, for the campaign to apply. A signal (passed on by `run`) ends its search
    with what it found so far, as `fuzz` alone. `shown`: the database's path as the report's command gives it
    (default `database`)."""
    db = Deferred(DirectoryBasedExampleDatabase(database))
    db.path = shown or database
    with interrupts.handled():
        try:
            result = fuzz(target, examples, seed, database=db, **options)
        except interrupts.Interrupted as stop:
            # outside the search itself (its replay): nothing to hand back, and the exception cannot travel
            # back as it is (it pickles its signal's name, its constructor takes the number)
            result = FuzzResult("none", target, seed, examples, 0.0, interrupted=stop.name)
    return result, db.writes


def run(target: str, seeds: list[int], examples: int, options: dict, database: Path,
        each: Optional[Callable[[Seed], None]] = None) -> Campaign:
    """Every seed at once, each in its own process; `each` is called as each seed ends. A signal here (as
    Interrupted) is passed on to the workers still running, which hand back what they found within
    GRACE_SECONDS; a seed that did not is an error."""
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    pools = {s: concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_worker_start,
                                                       initargs=(os.getpid(),))
             for s in seeds}
    futures, processes, writes = {}, {}, {}
    done: dict[int, Seed] = {}
    stop: Optional[interrupts.Interrupted] = None
    try:
        for s, pool in pools.items():
            futures[pool.submit(search, target, examples, s, options, str(database), os.getpid())] = s
            # the executor starts its process in submit (spawn); kept to say how it ended should it die
            processes[s] = list(getattr(pool, "_processes", {}).values())
        try:
            for future in concurrent.futures.as_completed(futures):
                _collect(future, futures[future], processes, done, writes, each)
        except interrupts.Interrupted as caught:
            stop = caught
            for s in seeds:
                if s not in done:
                    _signal(processes[s], caught.signum)
            finished, _ = concurrent.futures.wait([f for f, s in futures.items() if s not in done],
                                                  timeout=GRACE_SECONDS)
            for future in finished:
                _collect(future, futures[future], processes, done, writes, each)
    finally:
        for s, pool in pools.items():
            if s not in done:      # a worker that outlived the grace (or this process's own error): ended now
                for p in processes.get(s, []):
                    if p.is_alive():
                        p.kill()
            pool.shutdown(wait=s in done, cancel_futures=True)
    return _ended(target, seeds, examples, database, done, writes, start, stop,
                  f"its worker did not hand back a result within {GRACE_SECONDS:g} s")


def run_on_ray(target: str, seeds: list[int], examples: int, options: dict, database: Path, ray,
               each: Optional[Callable[[Seed], None]] = None) -> Campaign:
    """As `run`, each seed a task on the Ray cluster `ray` is connected to, in a worker of its own that exits
    after it (`max_calls=1`, so a seed loads what it loads in `run`'s fresh process), reading and writing the
    database as `run`'s seeds do: the folder must be one every worker reaches (on a single machine it is; on a
    cluster of several, a shared filesystem). Ray runs a task again when its worker dies, up to twice; a seed
    lost after that is an error. A signal here cancels the seeds still running (error rows): what the others
    found is reported and saved."""
    start = time.perf_counter()
    # --allow-unsupported-release is an environment variable here, which Ray's workers do not inherit: handed on
    shared = {"runtime_env": {"env_vars": {releases.ALLOW_ENV: "1"}}} if releases.allowed() else {}
    remote = ray.remote(max_retries=2, max_calls=1, **shared)(seed_search)
    refs = {s: remote.remote(target, examples, s, options, str(database.resolve()), str(database)) for s in seeds}
    # awaited as futures, here in Python: Ray's own waits turn the signal's exception (interrupts.py) into a
    # KeyboardInterrupt of theirs, which no longer says which signal it was
    futures = {ref.future(): s for s, ref in refs.items()}
    done: dict[int, Seed] = {}
    writes: dict[int, dict] = {}
    stop: Optional[interrupts.Interrupted] = None
    try:
        for future in concurrent.futures.as_completed(futures):
            s = futures[future]
            try:
                result, writes[s] = future.result()
                done[s] = Seed(s, result)
            except ray.exceptions.RayTaskError as exc:     # the search raised: the seed is an error
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                done[s] = Seed(s, None, f"the search raised {type(cause).__name__}: {cause}")
            except ray.exceptions.RayError as exc:
                done[s] = Seed(s, None, f"lost on the cluster, after Ray's retries: {type(exc).__name__}")
            if each:
                each(done[s])
    except interrupts.Interrupted as caught:
        stop = caught
    finally:
        for s, ref in refs.items():
            if s not in done:
                ray.cancel(ref, force=True)
    return _ended(target, seeds, examples, database, done, writes, start, stop, "its task on the cluster was "
                                                                                "cancelled")


def _ended(target, seeds, examples, database, done, writes, start, stop, cut_why: str) -> Campaign:
    """The campaign: a seed without a result an error row; the seeds' writes applied to the database."""
    for s in seeds:
        if s not in done:
            done[s] = Seed(s, None, f"cut short by {stop.name}: {cut_why}" if stop else "not run")
    shared = Deferred(DirectoryBasedExampleDatabase(database))
    for s in seeds:          # in seed order (one may delete what another saved): the same whichever ended first
        shared.apply(writes.get(s, {}))
    return Campaign(target, examples, database, [done[s] for s in seeds], time.perf_counter() - start,
                    stop.name if stop else "")


def _worker_start(parent: int) -> None:
    """First thing in each worker. A process group of its own, so that Ctrl-C at a terminal reaches the campaign
    alone, which passes it on to each worker once (a second signal ends a worker at once, interrupts.py, losing
    what it found). On Linux, SIGTERM when the campaign's process ends (prctl PR_SET_PDEATHSIG), so that a
    campaign killed outright leaves no search running on in a group no one signals."""
    os.setpgrp()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)      # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:      # it ended before that
        os._exit(1)


def _collect(future, seed: int, processes: dict, done: dict, writes: dict, each) -> None:
    try:
        result, writes[seed] = future.result()
        done[seed] = Seed(seed, result)
    except BrokenProcessPool:
        done[seed] = Seed(seed, None, f"its worker process died ({_how_it_ended(processes[seed])}) before "
                                      f"handing back a result")
    except Exception as exc:     # the search raised: the seed is an error, the other seeds go on
        done[seed] = Seed(seed, None, f"the search raised {type(exc).__name__}: {exc}")
    if each:
        each(done[seed])


def _how_it_ended(procs: list) -> str:
    # The executor's own thread reaps the dead worker too: asked in between, the process reads as running (its
    # waitpid found nothing to reap, and the exit code is not yet set), so ask again for a moment.
    deadline = time.monotonic() + 2.0
    while True:
        codes = [p.exitcode for p in procs if p.exitcode is not None]
        if codes or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if not codes:
        return "how is not known"
    if codes[0] < 0:
        return f"killed by {signal.Signals(-codes[0]).name if -codes[0] in signal.valid_signals() else -codes[0]}"
    return f"exit status {codes[0]}"


def _signal(procs: list, signum: int) -> None:
    for p in procs:
        if p.is_alive() and p.pid is not None:
            try:
                os.kill(p.pid, signum)
            except ProcessLookupError:
                pass


def write_reports(campaign: Campaign, out: Path) -> None:
    """Each finding's report and regression test into `out` (fuzz.py write_report), and its report folder
    as `fuzz` alone writes them (not for a failure cut short by a signal: not replayed)."""
    for s in campaign.found:
        s.report, _ = write_report(s.result, out)
        if not s.result.interrupted:
            s.folder = reportdir.write(from_fuzz(s.result), out / s.report.stem)
