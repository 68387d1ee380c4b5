"""`prove --workers N` and `prove --ray ADDRESS` (proofs/parallel.py): the claims decided at once, each in a fresh
process with its fixed share of the budget, so the verdicts are the same whichever way they run; a worker killed
mid-run on the Ray cluster costs its claim a rerun, not its verdict."""

from __future__ import annotations

import json

import pytest

from schedproof.cli import main
from test_sweep_ray import _free_port, interrupted_on_ray, one_worker_killed, ray_head  # noqa: F401  (a local head)

# the four claims in their designs' loop (their twins in SGLang's default loop, decided by `--loop both`, would split the
# same budget eight ways: tests/symbolic/test_modes.py decides those)
ARGS = ["prove", "sglang", "--json", "--budget", "20", "--loop", "design"]


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
    code, out, err = interrupted_on_ray(["prove", "--ray", ray_head, "--budget", "600"], "ray::_decide_one")
    assert code == 130 and "interrupted by SIGINT" in out, (code, out[-2000:], err[-2000:])
