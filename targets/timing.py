"""Every engine step under a wall-clock limit, for the targets that drive a real engine.

A hung engine is a finding, not a hung test run. In the main thread a real-time interval timer
interrupts the step (the schedulers are Python; torch's kernels return), which costs nothing per
step; elsewhere (a worker thread of pytest-xdist or Hypothesis) one long-lived thread per engine runs
its steps and the caller stops waiting after the limit.
"""

from __future__ import annotations

import queue
import signal
import threading
from typing import Optional


class _StepTimeout(BaseException):
    """Raised by the interval timer inside a step; a BaseException so the engine cannot swallow it."""


_IN_STEP = threading.local()
_CHAINED: dict = {}    # the SIGALRM handler that was installed before ours, called for alarms outside a step


def _on_alarm(signum, frame):
    if getattr(_IN_STEP, "active", False):
        raise _StepTimeout()
    previous = _CHAINED.get("handler")
    if callable(previous):
        previous(signum, frame)


def _run_with_alarm(job, timeout_s: float) -> dict:
    # The handler stays installed between steps (installing and restoring it around every step cost 10-20 us,
    # a tenth of a bare vLLM scheduler step); an alarm outside a step goes to the handler it replaced.
    if signal.getsignal(signal.SIGALRM) is not _on_alarm:
        _CHAINED["handler"] = signal.signal(signal.SIGALRM, _on_alarm)
    _IN_STEP.active = True
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return {"batch": job()}
    except _StepTimeout:
        raise TimeoutError from None
    except Exception as exc:   # noqa: BLE001 - the engine's exception is an observation
        return {"exc": exc}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _IN_STEP.active = False


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
            return _run_with_alarm(job, self.step_timeout_s)
        if self._worker is None:
            self._worker = _StepWorker(f"{self.worker_name}-{id(self):x}")
        return self._worker.run(job, self.step_timeout_s)

    def stop_worker(self) -> None:
        if self._worker is not None and not self.unusable:
            self._worker.stop()   # a hung worker is left to die with the process (daemon)
            self._worker = None
