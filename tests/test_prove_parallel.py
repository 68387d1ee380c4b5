"""`prove --workers N` and `prove --ray ADDRESS` (proofs/parallel.py): the claims decided at once, each in a fresh
process with its fixed share of the budget, so the verdicts are the same whichever way they run; a worker killed
mid-run on the Ray cluster costs its claim a rerun, not its verdict."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from schedproof.cli import main
from test_sweep_ray import _free_port, one_worker_killed, ray_head  # noqa: F401  (ray_head: a local Ray head)

ARGS = ["prove", "sglang", "--json", "--budget", "20"]
ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("schedproof")


def _verdicts(capsys, *args) -> list[dict]:
    code = main([*ARGS, *args])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    return [{k: v for k, v in d.items() if k != "seconds"} | {"obligations": [
        {k: v for k, v in o.items() if k != "seconds"} for o in d["obligations"]]} for d in out]


def test_the_same_verdicts_on_two_workers_and_on_a_ray_cluster_with_a_worker_killed(ray_head, capsys):  # noqa: F811
    local = _verdicts(capsys, "--workers", "2")
    assert len(local) == 4 and all(v["as_expected"] for v in local)
    with one_worker_killed("ray::_decide_one") as killed:
        on_ray = _verdicts(capsys, "--ray", ray_head)
    assert killed, "no Ray worker was seen deciding a claim: the kill was not exercised"
    assert on_ray == local


@pytest.mark.parametrize("argv, says", [
    (["--workers", "0"], "--workers"),
    (["--ray", "nowhere"], "--ray"),
])
def test_bad_parallel_flags_are_one_line_and_exit_2(argv, says, capsys):
    assert main([*ARGS, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_an_unreachable_ray_address_is_one_line_and_exit_2(capsys):
    assert main([*ARGS, "--ray", f"127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray: cannot reach a Ray cluster" in err, err


def test_a_signal_while_claims_run_on_ray_ends_in_proves_own_summary(ray_head):  # noqa: F811
    """SIGINT while the claims run as Ray tasks: the claims decided so far and exit 130, not a traceback (Ray's own
    waits would turn the signal into a KeyboardInterrupt of theirs)."""
    run = subprocess.Popen([str(EXE), "prove", "--ray", ray_head, "--budget", "600"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any("ray::_decide_one" in " ".join(p.info["cmdline"] or ())
                      for p in psutil.process_iter(["cmdline"])):
            assert time.monotonic() < deadline and run.poll() is None, "no claim started on the cluster"
            time.sleep(0.2)
        time.sleep(1.0)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, (run.returncode, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert "interrupted by SIGINT" in out, out[-2000:]
