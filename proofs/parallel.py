"""`prove --workers N` and `prove --ray ADDRESS`: the claims decided in parallel, each in a process of its own.

Each claim gets a fixed share of the budget, in proportion to its `weight` (as `run.decide_claims` shares it
when the claims run one after the other, but without handing on what a claim left unspent: in parallel the
claims decided earlier are not known when one starts). A fresh process per claim (spawned, one task each)
starts its solver from nothing, so a claim's verdict is a function of the claim and its share alone, whatever
N is and in whatever order the claims finish (checkers/clock.py counts its work in that process). The
wall-clock cap is the caller's, handed to each process as the time left of it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import time
from typing import Callable, Optional

from checkers import clock

from . import modes
from .claims import Claim
from .run import ProofEvent, Verdict, decide_claims


def shares(claims: list[Claim], budget: float) -> list[float]:
    """Each claim's fixed part of `budget`, in proportion to its weight."""
    total = sum(c.weight for c in claims)
    return [budget * c.weight / total for c in claims]


def heaviest_first(claims: list[Claim]) -> list[int]:
    """The claims' indices, the heaviest first (ties in the claims' order): the pool starts them in this order, so
    the long claims do not start last and leave one worker alone at the end. The order changes no verdict (each
    claim's share is fixed and its process fresh), only when the last one ends."""
    return sorted(range(len(claims)), key=lambda i: -claims[i].weight)


def decide_in_processes(claims: list[Claim], budget: float, workers: int,
                        progress: Callable[[ProofEvent], None] = lambda event: None,
                        wall_deadline: Optional[float] = None) -> tuple[list[Verdict], bool]:
    """(the verdicts in the claims' order, whether the wall-clock cap cut any). `progress` receives each claim's
    events together, when its process is done, in the order the claims finish. `wall_deadline`: a
    time.monotonic() time (the same clock in every process of this machine), or None."""
    verdicts: dict[int, Verdict] = {}
    cut = False
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context, max_tasks_per_child=1)
    try:
        parts = shares(claims, budget)
        futures = {pool.submit(_decide_one, claims[i].name, parts[i],
                               None if wall_deadline is None else wall_deadline - time.monotonic()): i
                   for i in heaviest_first(claims)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            claim = claims[i]
            try:
                events, one_cut = future.result()
            except Exception as exc:        # its process died (or could not be started): the claim is not decided
                events, one_cut = _lost(claim, f"its worker died: {type(exc).__name__}"), False
            cut = cut or one_cut
            verdicts[i] = _replay(claim, events, progress)
    except BaseException:
        # interrupted (schedproof/interrupts.py raises here): the claims still running are stopped, not awaited
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [verdicts[i] for i in range(len(claims))], cut


def decide_on_ray(claims: list[Claim], budget: float, ray,
                  progress: Callable[[ProofEvent], None] = lambda event: None,
                  wall_deadline: Optional[float] = None) -> tuple[list[Verdict], bool]:
    """As `decide_in_processes`, each claim a task on the Ray cluster `ray` is connected to. A task's worker exits
    after it (`max_calls=1`), so each claim starts its solver from nothing there too; Ray runs a task again when
    its worker dies (up to twice), and a claim lost after that is unknown. The wall-clock cap's time left is
    measured here, when each task is submitted (the cluster's clocks are not this machine's)."""
    remote = ray.remote(max_retries=2, max_calls=1)(_decide_one)
    parts = shares(claims, budget)
    pending = {remote.remote(claims[i].name, parts[i],
                             None if wall_deadline is None else wall_deadline - time.monotonic()): i
               for i in heaviest_first(claims)}
    # awaited as futures, here in Python: Ray's own waits turn a signal's exception (schedproof/interrupts.py) into
    # a KeyboardInterrupt of theirs, which no longer says which signal it was (campaign.run_on_ray does the same)
    futures = {ref.future(): ref for ref in pending}
    verdicts: dict[int, Verdict] = {}
    cut = False
    try:
        for future in concurrent.futures.as_completed(futures):
            i = pending.pop(futures[future])
            try:
                events, one_cut = future.result()
            except ray.exceptions.RayError as exc:
                events, one_cut = _lost(claims[i], f"lost on the cluster: {type(exc).__name__}"), False
            cut = cut or one_cut
            verdicts[i] = _replay(claims[i], events, progress)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return [verdicts[i] for i in range(len(claims))], cut


def _lost(claim: Claim, why: str) -> list[tuple]:
    return [("claim", "", None, None), ("verdict", "", None, Verdict(claim, "unknown", False, f"unknown: {why}", 0.0))]


def _replay(claim: Claim, events: list[tuple], progress: Callable[[ProofEvent], None]) -> Verdict:
    """The claim's events from its process, with the claim put back, given to `progress`; its verdict."""
    verdict = None
    for kind, label, obligation, decided in events:
        if decided is not None:
            verdict = decided = dataclasses.replace(decided, claim=claim)
        progress(ProofEvent(kind, claim, label, obligation, decided))
    return verdict


def _decide_one(name: str, share: float, wall_left: Optional[float]) -> tuple[list[tuple], bool]:
    """In a fresh process: the claim named `name` decided within `share`, its events as plain tuples (a claim
    holds functions, which do not cross processes: the parent puts its own back)."""
    claim = modes.original(name)
    events: list[ProofEvent] = []
    with clock.cap(wall_left) as capped:
        decide_claims([claim], share, events.append)
    return [(e.kind, e.label, e.obligation, None if e.verdict is None else dataclasses.replace(e.verdict, claim=None))
            for e in events], capped.cut
