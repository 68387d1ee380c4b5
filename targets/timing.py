"""Every engine step under a wall-clock limit, for the targets that drive a real engine.

A hung engine is a finding, not a hung test run. In the main thread a watcher thread sends SIGALRM
to a step past its deadline (the schedulers are Python; torch's kernels return), which costs a step two
attribute writes; elsewhere (a worker thread of pytest-xdist or Hypothesis) one long-lived thread per engine runs
its steps and the caller stops waiting after the limit.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from typing import Optional


class _StepTimeout(BaseException):
    """Raised by the alarm handler inside a step; a BaseException so the engine cannot swallow it."""


class _AlarmClock:
    """The main thread's step deadline, watched by one daemon thread that sends the main thread SIGALRM
    once a step runs past it.

    A step only writes one attribute on entry and one on exit. The first version armed a real-time interval
    timer around every step (two `setitimer` calls, a `threading.local` and a `getsignal`): measured about
    19 us a step inside the vllm target's loop, a sixth of a bare vLLM scheduler step (bench/vllm_overhead.py).
    The watcher wakes every `POLL_S`, so a hung step is interrupted between its limit and POLL_S later. The
    signal, not `_thread.interrupt_main`, so that a step blocked in a system call is woken too, as the timer
    did. An alarm outside a step, or for a step that ended meanwhile, goes to the handler ours replaced. Ours is
    installed at the first step and not checked again (`getsignal` alone cost 2.5 us): code that installs its own
    SIGALRM handler later, in the same process, takes the time limit away (nothing in the suite does).
    """

    POLL_S = 0.05

    def __init__(self):
        # (deadline,) while a step runs: a fresh tuple per step, so the watcher condemns that step by identity
        # and an alarm that arrives after it ended is not taken for a later step's
        self.current: Optional[tuple[float]] = None
        self.condemned: Optional[tuple[float]] = None
        self.chained = None                                    # the SIGALRM handler installed before ours
        self.watcher: Optional[threading.Thread] = None

    def on_alarm(self, signum, frame):
        step = self.current
        if step is not None and step is self.condemned:
            raise _StepTimeout()
        if callable(self.chained):
            self.chained(signum, frame)

    def _watch(self, main_ident: int) -> None:
        while True:
            time.sleep(self.POLL_S)
            step = self.current
            if step is not None and time.monotonic() >= step[0] and step is not self.condemned:
                self.condemned = step
                signal.pthread_kill(main_ident, signal.SIGALRM)

    def run(self, job, timeout_s: float) -> dict:
        if self.watcher is None:
            self.chained = signal.signal(signal.SIGALRM, self.on_alarm)
            self.watcher = threading.Thread(target=self._watch, args=(threading.main_thread().ident,),
                                            name="step-alarm", daemon=True)
            self.watcher.start()
        self.current = (time.monotonic() + timeout_s,)
        try:
            return {"batch": job()}
        except _StepTimeout:
            raise TimeoutError from None
        except Exception as exc:   # noqa: BLE001 - the engine's exception is an observation
            return {"exc": exc}
        finally:
            self.current = None


_CLOCK = _AlarmClock()


def _after_fork_in_child() -> None:
    # the watcher thread does not survive a fork: a child that steps an engine starts its own at its first step
    _CLOCK.watcher, _CLOCK.current, _CLOCK.condemned = None, None, None


os.register_at_fork(after_in_child=_after_fork_in_child)


class _StepWorker:
    """One long-lived thread per engine that runs its steps, so the caller can stop waiting after the
    time limit; reusing the thread keeps torch's per-thread set-up off the per-step cost."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self.results.put({"batch": job()})
            except BaseException as exc:   # noqa: BLE001 - the engine's exception is an observation
                self.results.put({"exc": exc})

    def run(self, job, timeout_s: float) -> dict:
        self.jobs.put(job)
        try:
            return self.results.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError from None

    def stop(self) -> None:
        self.jobs.put(None)


class TimedSteps:
    """Mixin for a target: `_run_timed(job)` runs one engine step under `step_timeout_s` and returns
    {"batch": result} or {"exc": the engine's exception}, raising TimeoutError past the limit;
    `stop_worker()` ends the worker thread (left to die with the process if the engine hung, which
    sets `unusable`). `watchdog` picks the mechanism: "alarm" (main thread), "thread", or "auto"."""

    watchdog = "auto"
    worker_name = "engine"
    step_timeout_s: float
    unusable: Optional[str] = None
    _worker: Optional[_StepWorker] = None

    def _run_timed(self, job) -> dict:
        mode = self.watchdog
        if mode == "auto":
            mode = "alarm" if threading.current_thread() is threading.main_thread() else "thread"
        if mode == "alarm":
            return _CLOCK.run(job, self.step_timeout_s)
        if self._worker is None:
            self._worker = _StepWorker(f"{self.worker_name}-{id(self):x}")
        return self._worker.run(job, self.step_timeout_s)

    def stop_worker(self) -> None:
        if self._worker is not None and not self.unusable:
            self._worker.stop()   # a hung worker is left to die with the process (daemon)
            self._worker = None
