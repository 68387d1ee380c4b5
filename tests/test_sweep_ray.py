"""A sweep through Ray (the optional extra, installed by the test command): a local Ray head on this
machine, a small sweep run through it while one of its workers is killed mid-run, and the same table as
the local run. The head is this test's own (`ray start --head` on a free port, `ray stop` after)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from schedproof.cli import main

ray = pytest.importorskip("ray", reason="the Ray extra is not installed (pip install 'schedproof[ray]')")
RAY = str(Path(sys.executable).parent / "ray")
FIELD = "scenarios/trtllm-v2-replay-over-budget.toml"
VARY = ["--vary", "options.kv_cache_max_tokens=6144..10240:2048", "--vary", "max_num_tokens=1792..2304:256"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    # one head on this machine at a time: two started at once by two test workers (this file's and
    # tests/test_prove_parallel.py's) made a driver resolve the other's node and fail to connect
    with open(Path(tempfile.gettempdir()) / "schedproof-ray-head.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield from _ray_head()


def _ray_head():
    port = _free_port()
    # a short folder: Ray's sockets live in it, and a socket path is at most 107 characters
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    started = subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                              "--disable-usage-stats", f"--temp-dir={temp}"], capture_output=True, text=True,
                             timeout=300)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=300)
        shutil.rmtree(temp, ignore_errors=True)


def _kill_one_worker(killed: list, stop: threading.Event, title: str = "ray::judge") -> None:
    """Kill the first Ray worker seen running a task whose process title is `title` (a sweep's point: ray::judge)."""
    while not stop.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            if any(title in part for part in proc.info["cmdline"] or ()):
                proc.kill()
                killed.append(proc.pid)
                return
        time.sleep(0.05)


@contextlib.contextmanager
def one_worker_killed(title: str = "ray::judge"):
    """While the block runs, the first Ray worker seen running a `title` task is killed; yields the pids killed."""
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=_kill_one_worker, args=(killed, stop, title), daemon=True)
    killer.start()
    try:
        yield killed
    finally:
        stop.set()
        killer.join(timeout=5)


def _table(capsys, *args) -> list[dict]:
    assert main(["sweep", FIELD, *VARY, "--json", *args]) == 0
    return [{k: v for k, v in p.items() if k != "seconds"} for p in json.loads(capsys.readouterr().out)["points"]]


def test_a_sweep_through_ray_survives_a_killed_worker_and_matches_the_local_table(ray_head, capsys):
    local = _table(capsys, "--workers", "1")
    with one_worker_killed() as killed:
        through_ray = _table(capsys, "--ray", ray_head)
    assert killed, "no Ray worker was seen running a point: the kill was not exercised"
    assert through_ray == local


def test_an_unreachable_ray_address_is_one_line_and_exit_2(capsys):
    assert main(["sweep", FIELD, *VARY, "--ray", f"127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray: cannot reach a Ray cluster" in err, err


def interrupted_on_ray(argv: list[str], title: str) -> tuple[int, str, str]:
    """The installed command `argv` run in the background, sent SIGINT a second after a Ray worker is seen running
    a `title` task: (its status, stdout, stderr). Asserts that no traceback was printed."""
    exe = Path(sys.executable).with_name("schedproof")
    run = subprocess.Popen([str(exe), *argv], cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(title in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"])):
            assert time.monotonic() < deadline and run.poll() is None, f"no {title} task started on the cluster"
            time.sleep(0.2)
        time.sleep(1.0)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    return run.returncode, out, err


def test_a_signal_while_points_run_on_ray_is_one_line_and_130(ray_head):
    """SIGINT while the points run as Ray tasks: the command's own line and exit 130, not a traceback (Ray's own
    waits would turn the signal into a KeyboardInterrupt of theirs)."""
    code, _, err = interrupted_on_ray(["sweep", FIELD, "--vary", "options.kv_cache_max_tokens=2048..65536:64",
                                       "--ray", ray_head], "ray::judge")
    assert code == 130 and "interrupted by SIGINT" in err, (code, err[-2000:])
