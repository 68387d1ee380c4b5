"""SIGINT and SIGTERM end every long command within two seconds: exit 130 (143), one line saying
so, no traceback, and what was found so far reported as such. Real processes: the commands run
as subprocesses and get real signals (schedproof/interrupts.py says why in-process calls would
not show the two ways a signal gets lost: inside a Z3 query and inside a finaliser)."""

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRACE = 2.0
HOST_TIER = "scenarios/check/trtllm-v2-host-tier-ranges.toml"      # minutes of solver work
WEDGE = "scenarios/check/vllm-chunked-off-wedge-default-caching.toml"  # a counterexample in ~20 s, then certification


def start(*argv, cwd=ROOT):
    env = dict(os.environ, CI="true", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "schedproof.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(proc, stream, text: str, timeout: float) -> str:
    """Read `stream` until a line contains `text` (the command reached that point)."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    seen, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        if sel.select(timeout=max(0.0, end - time.monotonic())):
            line = stream.readline()
            if not line:
                break
            seen.append(line)
            if text in line:
                return "".join(seen)
    proc.kill()
    pytest.fail(f"{text!r} did not appear within {timeout} s: {''.join(seen)[-2000:]}")


def interrupt(proc, signum=signal.SIGINT, after: float = 0.0):
    """Send the signal, then wait: (exit status, seconds it took to end, stdout, stderr)."""
    time.sleep(after)
    sent = time.monotonic()
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("still running 30 s after the signal")
    return proc.returncode, time.monotonic() - sent, out, err


def assert_clean(code, took, err, status=130):
    assert code == status, (code, err[-2000:])
    assert took < GRACE, took
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]


@pytest.mark.parametrize("after", [1.0, 4.0, 9.0])   # loading and lemmas, then in the unrolling
def test_check_interrupted_says_how_far_it_got(after):
    proc = start("check", HOST_TIER, "--budget", "300")
    code, took, out, err = interrupt(proc, after=after)
    assert_clean(code, took, err)
    # before the search starts (still importing, under load) the generic line on stderr says so
    said = out + err
    assert "interrupted by SIGINT" in said and ("nothing is claimed" in said or "not covered" in said), said


def test_check_interrupted_while_certifying_prints_the_counterexample_found():
    proc = start("check", WEDGE, "--budget", "300", "--progress", "on")
    wait_for(proc, proc.stderr, "counterexample:", timeout=240)
    code, took, out, err = interrupt(proc, after=0.5)
    assert_clean(code, took, err)
    assert "a counterexample was found; certifying it shortest did not finish" in out
    assert "violated LIVE-NO-PROGRESS" in out and "replay: replayed" in out and "trace:" in out


def test_check_sigterm_under_json_is_one_json_object():
    proc = start("check", HOST_TIER, "--budget", "300", "--json")
    code, took, out, err = interrupt(proc, signal.SIGTERM, after=6.0)
    assert_clean(code, took, err, status=143)
    data = json.loads(out)
    assert data["status"] == "interrupted" and data["signal"] == "SIGTERM" and data["found"] is None


def test_prove_interrupted_lists_the_claims_decided():
    # SGLang's claims: the first obligations are proved within seconds (the whole run takes about 12 s alone; every
    # claim's, about a minute before the first line, issue 41's suite time)
    proc = start("prove", "sglang")
    wait_for(proc, proc.stdout, "proved", timeout=120)     # inside the first claim's obligations
    code, took, out, err = interrupt(proc, after=1.0)
    assert_clean(code, took, err)
    last = out.strip().splitlines()[-1]
    assert last.startswith("interrupted by SIGINT:") and "claims decided" in last, out[-2000:]


def test_fuzz_interrupted_ends_cleanly(tmp_path):
    # past the dense failures, so the search is still running when the signal comes
    proc = start("fuzz", "--target", "reference", "--examples", "100000", "--no-empty-prompts", "--fitting-only",
                 "--out", str(tmp_path / "reports"))
    wait_for(proc, proc.stderr, "schedproof fuzz: target reference", timeout=60)
    code, took, out, err = interrupt(proc, after=3.0)
    assert_clean(code, took, err)
    # within 3 s the search may or may not reach the recompute wedge (how far it gets depends on the machine's
    # load): either way it ends cleanly and says which
    assert "interrupted by SIGINT" in err
    assert "nothing found so far" in err or "the failure found so far (shrinking cut short, not replayed)" in err


def test_fuzz_on_the_real_engine_interrupted_ends_cleanly(tmp_path):
    """transformers' finaliser runs gc.collect after every example, and Hypothesis times collections
    with a callback: a signal raised there is dropped ("Exception ignored") unless delivered again."""
    proc = start("fuzz", "--target", "transformers", "--examples", "1000", "--no-empty-prompts", "--fitting-only",
                 "--out", str(tmp_path / "reports"))
    wait_for(proc, proc.stderr, "schedproof fuzz: target transformers", timeout=120)
    code, took, out, err = interrupt(proc, after=12.0)     # the engine is built and examples are running
    assert_clean(code, took, err)
    assert "interrupted by SIGINT" in err, err


def test_run_interrupted_ends_cleanly(tmp_path):
    scenario = tmp_path / "long.toml"
    scenario.write_text('name = "long"\n[engine]\npolicy = "vllm_v1"\nblock_size = 16\nnum_blocks = 100\n'
                        'max_num_tokens = 64\nmax_batch_size = 4\n[engine.options]\nmax_model_len = 64\n'
                        '[[requests]]\ncount = 4000\nprompt = 10\nmax_new = 10\n')
    proc = start("run", str(scenario))
    code, took, out, err = interrupt(proc, signal.SIGTERM, after=3.0)
    assert_clean(code, took, err, status=143)
    assert err.strip() == "schedproof run: interrupted by SIGTERM; cut short, nothing is claimed"
