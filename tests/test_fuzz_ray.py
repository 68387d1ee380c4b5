"""`schedproof fuzz --ray HOST:PORT` (schedproof/campaign.py `run_on_ray`): a campaign's seeds as tasks on a Ray
cluster, each in a fresh worker, sharing one example database. A local head (tests/test_sweep_ray.py's fixture), a
worker killed mid-run: Ray runs its seed again, and the campaign finds what `fuzz --workers 2` finds, seed for
seed. The campaigns run the installed command, as tests/test_fuzz_campaign.py's do."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from schedproof.cli import main
from test_fuzz_campaign import fuzz
from test_sweep_ray import _free_port, one_worker_killed, ray_head  # noqa: F401  (ray_head: a local Ray head)

CAMPAIGN = ["--examples", 50, "--seed", 0, "--json"]      # tests/test_fuzz_campaign.py's: both seeds find


def _rows(summary: dict) -> list[dict]:
    return [{k: (Path(v).name if k == "report" and v else v) for k, v in r.items() if k != "seconds"}
            for r in summary["seeds"]]


def _actions(summary: dict) -> dict:
    return {r["seed"]: json.loads(Path(r["report"]).read_text())["actions"] for r in summary["seeds"] if r["report"]}


def test_a_campaign_on_ray_finds_what_two_workers_find_though_a_worker_is_killed(ray_head, tmp_path):  # noqa: F811
    local = fuzz("--workers", 2, *CAMPAIGN, "--out", tmp_path / "local")
    assert local.returncode == 1, local.stderr
    expected = json.loads(local.stdout)

    out = tmp_path / "ray"
    with one_worker_killed("ray::seed_search") as killed:
        # no --seeds: a seed per CPU of the cluster, and the fixture's head has 2
        run = fuzz("--ray", ray_head, *CAMPAIGN, "--out", out)
    assert killed, "no Ray worker was seen searching a seed: the kill was not exercised"
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    summary = json.loads(run.stdout)
    assert set(summary) == set(expected) and summary["workers"] == 2
    assert all(r["status"] != "error" for r in summary["seeds"]), summary["seeds"]     # the killed seed ran again
    assert _rows(summary) == _rows(expected)
    assert summary["findings"] == expected["findings"] == [0, 1]
    assert ([(d["property"], d["seeds"]) for d in summary["distinct_findings"]] ==
            [(d["property"], d["seeds"]) for d in expected["distinct_findings"]])
    assert _actions(summary) == _actions(expected)       # each seed drew as in its local process
    for r in summary["seeds"]:      # written as `fuzz --workers` writes them: report, regression test, folder
        report = Path(r["report"])
        assert report.parent == out and (out / f"test_{report.name[:-5]}.py").is_file()
        assert (out / report.stem / "report.html").is_file()
    database = Path(summary["database"])
    assert database == out / ".hypothesis-db" and any(database.iterdir())     # the seeds' writes, applied here


@pytest.mark.parametrize("argv, says", [
    (["--ray", "nowhere"], "fuzz: --ray: 'nowhere' is not HOST:PORT"),
    (["--ray", "127.0.0.1:1", "--workers", "2"], "--workers and --ray: give one"),
    (["--seeds", "2"], "--seeds 2: goes with --ray"),
    (["--ray", "127.0.0.1:1", "--seeds", "2", "--seed", str(2**32 - 1)], "the last seed, 4294967296, is past"),
])
def test_bad_ray_flags_are_one_line_and_exit_2(argv, says, tmp_path, capsys):
    assert main(["fuzz", "--target", "reference", "--examples", "1", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_an_unreachable_ray_address_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["fuzz", "--target", "reference", "--examples", "1", "--out", str(tmp_path),
                 "--ray", f"127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fuzz: --ray: cannot reach a Ray cluster" in err, err


def test_a_missing_ray_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)       # `import ray` raises ImportError
    assert main(["fuzz", "--target", "reference", "--examples", "1", "--out", str(tmp_path),
                 "--ray", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fuzz: --ray: Ray is not installed" in err, err
