"""SIGINT and SIGTERM end any command promptly, with a status and without a traceback.

While `handled()` is active, a SIGINT or SIGTERM raises `Interrupted` in the main thread; each
command catches it, reports what it found so far as such, and returns `status` (130 for SIGINT,
143 for SIGTERM: the shell's 128 + signal). A signal after the exception was raised ends the
process at once.

Where the exception is raised matters. Raised inside Z3's Python bindings it becomes a
`ctypes.ArgumentError` or a Z3 error, which a search reads as "unknown": there the handler defers,
and a watcher thread, woken by the signal itself (signal.set_wakeup_fd, written by the interpreter
even while the main thread is in C), interrupts any running Z3 query (it then returns "unknown" at
once) and delivers the signal again every 50 ms until it is raised in plain Python code. Raised in
a finaliser or a garbage-collector callback (an engine's `__del__`, Hypothesis' gc timer) it would
be printed as "Exception ignored" and dropped: the unraisable hook delivers it again. A command
that reads a solver's "unknown" asks `pending()` first: a query cancelled by the signal is the
interrupt, not a verdict. Should the main thread not come back to Python within
HARD_STOP_SECONDS (stuck in C), the process ends at once with the same status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
import _thread
from typing import Callable, Optional, TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
STATUSES = {128 + s for s in SIGNALS}
RETRY_SECONDS = 0.05
# Past this, the main thread is stuck in C code that does not return (a library import, an engine
# call): the process ends at once, so that it still ends within two seconds of the signal.
HARD_STOP_SECONDS = 1.0


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.status = 128 + signum


class _State:
    received: Optional[int] = None     # the signal, once one arrived
    raised = False                     # Interrupted was raised in the main thread


_state: Optional[_State] = None


def received() -> bool:
    """Has a signal arrived? What a solver reports after it may be its cancellation, not a verdict."""
    return _state is not None and _state.received is not None


def pending() -> Optional[Interrupted]:
    """The signal received and not yet raised (a solver query it cancelled just returned), if any."""
    if _state is not None and _state.received is not None and not _state.raised:
        _state.raised = True
        return Interrupted(_state.received)
    return None


def until_signal(work: Callable[[], T]) -> tuple[Optional[T], Optional[Interrupted]]:
    """(work's result, None), or (None, the signal) when one cut it short: raised as Interrupted,
    or seen after a solver query it cancelled returned "unknown" or raised "canceled" (any error
    while a signal is pending is taken as its consequence)."""
    try:
        result = work()
    except Interrupted as caught:
        return None, caught
    except Exception:
        if (stop := pending()) is None:
            raise
        return None, stop
    stop = pending()
    return (None, stop) if stop is not None else (result, None)


def _unsafe(frame) -> bool:
    """Would an exception raised here be disguised: inside Z3's or ctypes' Python code, where it
    becomes a solver error or a ctypes.ArgumentError? (One raised in a finaliser or a garbage-
    collector callback is dropped instead: the unraisable hook delivers it again.)"""
    while frame is not None:
        name = frame.f_code.co_filename
        if f"{os.sep}z3{os.sep}" in name or f"{os.sep}ctypes{os.sep}" in name:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def handled(solver: bool = False):
    """Install the handlers (main thread only: elsewhere, as in a test's worker, nothing changes).
    `solver`: the command runs Z3, whose queries otherwise install a SIGINT handler of their own
    for their duration (its `ctrl_c` parameter), which cancels the query and keeps the signal
    from Python: the command would read it as an ordinary "unknown" and go on."""
    global _state
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if solver:
        import z3
        z3.set_param("ctrl_c", False)
    state = _state = _State()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    done = threading.Event()

    def on_signal(signum, frame):
        if state.raised:
            os.write(2, f"\n{signal.Signals(signum).name} again: stopping at once\n".encode())
            os._exit(128 + signum)
        state.received = state.received or signum
        if not _unsafe(frame):
            state.raised = True
            raise Interrupted(state.received)
        _raise_on_return(frame)

    def _raise_on_return(frame):
        """Trace the main thread's frames, and raise at the first event in a frame with no Z3 or
        ctypes code on its stack: the moment Z3's bindings (or a garbage collection) return to
        the code below, instead of waiting for a re-delivered signal to land there by chance."""
        def tracer(f, event, arg):
            if state.raised or state.received is None:
                sys.settrace(None)
                return None
            if _unsafe(f):
                return None if event == "call" else tracer
            sys.settrace(None)
            state.raised = True
            raise Interrupted(state.received)
        f = frame
        while f is not None:
            if not _unsafe(f):
                f.f_trace, f.f_trace_lines = tracer, True
            f = f.f_back
        sys.settrace(tracer)

    def watch():
        while not done.is_set():
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            # each byte is a signal's number; the main thread may be inside a long solver query,
            # where its Python handler cannot run yet
            if state.received is None and data[0] in SIGNALS:
                state.received = data[0]
            # until the main thread has raised it (or a command took it with pending()): cancel
            # the solver's query and deliver the signal again
            since = time.monotonic()
            while state.received is not None and not state.raised and not done.is_set():
                z3 = sys.modules.get("z3")
                if z3 is not None:
                    with contextlib.suppress(Exception):
                        z3.main_ctx().interrupt()
                time.sleep(RETRY_SECONDS)
                if state.raised or done.is_set():
                    break
                if time.monotonic() - since > HARD_STOP_SECONDS:
                    name = signal.Signals(state.received).name
                    os.write(2, f"\nschedproof: interrupted by {name}; the engine or solver did not return "
                                f"within {HARD_STOP_SECONDS:g} s, so nothing found so far could be reported\n".encode())
                    os._exit(128 + state.received)
                _thread.interrupt_main(state.received)

    previous_hook = sys.unraisablehook

    def on_unraisable(info):
        if isinstance(info.exc_value, Interrupted):
            # raised where it is dropped (a garbage-collector callback, a finaliser): raise it again
            # at the next line of the frames below, once the collection returns to them (a re-
            # delivered signal would most likely land in the next collection's callback again);
            # the watcher re-delivers too, should no Python line run
            state.raised = False
            try:
                writer.send(b"\0")
            except OSError:
                pass
            _raise_on_return(sys._getframe(1))     # last: from here on any new call may raise
            return
        previous_hook(info)

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    sys.unraisablehook = on_unraisable
    threading.Thread(target=watch, name="schedproof-interrupts", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous_fd)
        sys.unraisablehook = previous_hook
        for s, h in previous.items():
            signal.signal(s, h)
        writer.close()
        reader.close()
        _state = None
