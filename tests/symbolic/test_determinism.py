"""The same file gives the same verdict on a busy or an idle machine (checkers/clock.py).

Each command runs twice in a fresh process, the second time with two processes spinning beside it (on the
reference machine's two cores, under the test run's own load besides): the `--json` must be byte-identical
once the seconds are taken out, the verdict, the depth reached, the trace and the lemmas included. The budgets
are chosen so that they run out before the search ends, which is where a wall-clock limit used to decide what
was found.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import in_a_fresh_process, sized

ROOT = Path(__file__).resolve().parents[2]
SECONDS = re.compile(r"\d+(\.\d+)? s\b")


def without_times(value):
    """`value` with every field that measures time dropped and every "12.3 s" in its text blanked."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if "seconds" not in k and not k.endswith("_cpu")}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    if isinstance(value, str):
        return SECONDS.sub("<t> s", value)
    return value


def schedproof(*argv: str, timeout: float):
    exe = Path(sys.executable).with_name("schedproof")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "schedproof.cli"]
    done = subprocess.run(cmd + list(argv), capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert done.returncode in (0, 1, 3), done.stderr[-2000:]
    return json.loads(done.stdout)


class Spinning:
    """Two processes that keep a core each busy while the block runs."""

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


CASES = {
    # the field design's defaults: the budget runs out while the units of 1 to 12 requests deepen (the turns, the
    # openings and the lemmas each unit assumes all decided by the clock); 6 s in the ci profile, where the two
    # spinning processes hold up the test run's other worker too (run side by side, 6 s reach depth 2 in 14 s of
    # wall time, 10 s depth 5 in 22 s, 2026-12-07)
    "check": ["check", "scenarios/check/trtllm-v2-field-ranges-defaults.toml", "--json", "--budget",
              sized(ci="6", nightly="20")],
    # a trace found and certified shortest, with the smallest configuration that fails
    "check-violated": ["check", "scenarios/check/vllm-chunked-off-wedge-ranges.toml", "--json", "--budget", "6"],
    # proofs first: a claim proved or not within its share
    "prove": ["prove", "scenarios/check/claims/vllm-chunked-fits-alone.toml", "--json", "--budget", "30"],
    # a policy's claims on two workers, each in a process of its own with its fixed share (proofs/parallel.py), in
    # their designs' loop (the four claims; their default-loop twins would split the budget eight ways)
    "prove-claims": ["prove", "sglang", "--json", "--budget", "20", "--workers", "2", "--loop", "design"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_verdict_beside_a_busy_machine(case):
    argv = CASES[case]
    idle = schedproof(*argv, timeout=900)
    with Spinning():
        busy = schedproof(*argv, timeout=900)
    for verdict in [idle, busy]:        # `prove POLICY` prints a list, one verdict per claim
        assert all(v.get("stopped_by") != "timeout" for v in (verdict if isinstance(verdict, list) else [verdict]))
    if case == "check":
        assert idle["status"] == "unknown" and idle["stopped_by"] == "budget"     # where the clock decided it all
    a = json.dumps(without_times(idle), indent=1, sort_keys=True)
    b = json.dumps(without_times(busy), indent=1, sort_keys=True)
    assert a == b


def _decided_before_and_after(name: str, other: str, budget: float) -> list:
    """In this process: claim `name` decided, then `other`, then `name` again, each by `decide_claims`: for each
    decision of `name`, its status, line and scope and the clock seconds it took (Z3's work, not the wall)."""
    from checkers import clock
    from proofs.claims import CLAIMS
    from proofs.run import decide_claims

    claims = {c.name: c for c in CLAIMS}
    out = []
    for each in (name, other, name):
        start = clock.now()
        [v] = decide_claims([claims[each]], budget)
        out.append((v.status, v.line, v.scope, clock.now() - start))
    return [out[0], out[2]]


def test_a_claim_decided_after_another_in_the_same_process_is_decided_as_alone():
    """Each claim is decided in a Z3 context of its own (checkers/clock.py `fresh_context`): what the process
    solved before, here another engine's claim, changes neither the verdict nor the solver's work, to the unit."""
    alone, after = in_a_fresh_process(_decided_before_and_after, "vllm-chunked-fits-alone", "v2-original", 120)
    assert alone[0] == "proved" and alone[:3] == after[:3], (alone, after)
    # the clock sums floats from another start: equal to far below one unit of work (a 3 millionth of a second);
    # in the process's one context the second decision took 0.035 s more (bench/context_churn.py --claims)
    assert abs(alone[3] - after[3]) < 1e-9, (alone[3], after[3])
