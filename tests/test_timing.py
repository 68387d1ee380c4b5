"""targets/timing.py: every engine step under a wall-clock limit, in the main thread (the alarm clock) and in a
child process forked after the clock's watcher started (threads do not survive a fork)."""

import os
import time

import pytest

from targets.timing import TimedSteps


class _Steps(TimedSteps):
    step_timeout_s = 0.3
    watchdog = "alarm"


def test_a_step_past_its_limit_is_interrupted_and_one_within_it_returns():
    steps = _Steps()
    assert steps._run_timed(lambda: 7) == {"batch": 7}
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        steps._run_timed(lambda: time.sleep(5))
    assert time.monotonic() - start < 2.0          # the limit plus the watcher's poll, not the 5 s sleep
    assert steps._run_timed(lambda: 8) == {"batch": 8}   # a later step is not hit by the earlier alarm


def test_an_exception_inside_a_step_is_the_steps_observation():
    def boom():
        raise RuntimeError("engine error")
    box = _Steps()._run_timed(boom)
    assert isinstance(box["exc"], RuntimeError)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_watcher():
    steps = _Steps()
    steps._run_timed(lambda: None)        # the parent's watcher is running
    pid = os.fork()
    if pid == 0:                          # the child: its step must still be interrupted
        try:
            steps._run_timed(lambda: time.sleep(5))
            os._exit(3)
        except TimeoutError:
            os._exit(0)
        except BaseException:             # noqa: BLE001 - anything else is a failure of the child
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
