"""`schedproof fuzz --workers N`: seeds S .. S+N-1 at once, one process each, sharing one Hypothesis example
database (schedproof/campaign.py), on the reference target (the model: fast).

The searches run the installed command in a fresh interpreter, as a shell runs it: Hypothesis draws some values
from the literals of the project modules loaded in the process, so in the test process a seed would draw other
examples once earlier tests had imported more of the project."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedproof.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("schedproof")
CMD = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "schedproof.cli"]
ROW_KEYS = {"seed", "status", "property", "examples", "seconds", "report"}


def fuzz(*args, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    argv = CMD + ["fuzz", "--target", "reference", *map(str, args)]
    if kw.pop("background", False):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_campaign_finds_what_one_seed_finds_with_a_row_per_seed_and_a_shared_database(tmp_path):
    alone = fuzz("--examples", 100, "--seed", 0, "--json", "--out", tmp_path / "alone")
    assert alone.returncode == 1, alone.stderr
    expected = json.loads(alone.stdout)["property"]       # ENGINE-ERROR: the empty-prompt crash the model mirrors

    out = tmp_path / "campaign"
    run = fuzz("--workers", 2, "--examples", 50, "--seed", 0, "--json", "--out", out)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    summary = json.loads(run.stdout)
    assert summary["status"] == "found" and summary["target"] == "reference" and summary["workers"] == 2
    rows = summary["seeds"]
    assert [r["seed"] for r in rows] == [0, 1] and all(ROW_KEYS <= set(r) for r in rows), rows
    assert all(r["examples"] == 50 for r in rows) and summary["examples"] == 100
    assert summary["findings"] == [r["seed"] for r in rows if r["status"] == "found"]
    for r in rows:
        if r["status"] == "found":     # written as `fuzz` alone writes them: report, regression test, report folder
            report = Path(r["report"])
            assert report.parent == out and report.is_file() and (out / f"test_{report.name[:-5]}.py").is_file()
            assert (out / report.stem / "report.html").is_file()
    distinct = {d["property"]: d for d in summary["distinct_findings"]}
    assert expected in distinct, summary
    assert set(distinct[expected]["seeds"]) <= set(summary["findings"]) and Path(distinct[expected]["report"]).is_file()
    database = Path(summary["database"])
    assert database == out / ".hypothesis-db" and database.is_dir() and any(database.iterdir())

    text = fuzz("--workers", 2, "--examples", 50, "--seed", 0, "--out", out)   # the same, as text
    assert text.returncode == 1 and "Traceback" not in text.stderr, text.stderr
    assert "seed 0: found" in text.stdout and "seed 1:" in text.stdout and f"  {expected}: seeds" in text.stdout


def test_a_failure_one_search_saved_is_replayed_by_another_seed_from_the_database(tmp_path):
    """Seed 7 finds nothing in one example; against the database seed 0 filled it replays seed 0's failure at once
    (Hypothesis's reuse phase: the database keys a search by target and options, the same in every process)."""
    database, fresh = tmp_path / "db", tmp_path / "fresh"
    first = fuzz("--seed", 0, "--examples", 50, "--database", database, "--json", "--out", tmp_path / "a")
    assert first.returncode == 1, first.stderr
    found = json.loads(first.stdout)
    assert any(database.iterdir())

    again = fuzz("--seed", 7, "--examples", 1, "--database", database, "--json", "--out", tmp_path / "b")
    assert again.returncode == 1, again.stderr
    replayed = json.loads(again.stdout)
    assert replayed["property"] == found["property"] and replayed["actions"] == found["actions"], replayed
    assert replayed["command"].endswith(f"--database {database}")

    alone = fuzz("--seed", 7, "--examples", 1, "--database", fresh, "--json", "--out", tmp_path / "c")
    assert alone.returncode == 0 and json.loads(alone.stdout)["status"] == "none", alone.stdout


def entries(database: Path) -> set[str]:
    return {str(p.relative_to(database)) for p in database.rglob("*") if p.is_file()}


def test_a_search_with_other_options_neither_replays_nor_deletes_the_databases_failures(tmp_path):
    """The database key names the options too (schedproof/fuzz.py): seed 0's empty-prompt crash is not replayed by
    a search that never submits an empty prompt, and is still there afterwards for the searches that do."""
    database = tmp_path / "db"
    assert fuzz("--seed", 0, "--examples", 50, "--database", database, "--out", tmp_path / "a").returncode == 1
    saved = entries(database)
    other = fuzz("--seed", 7, "--examples", 1, "--no-empty-prompts", "--database", database, "--json",
                 "--out", tmp_path / "b")
    assert other.returncode == 0 and json.loads(other.stdout)["status"] == "none", other.stdout
    assert saved and saved <= entries(database)


@pytest.mark.parametrize("argv,says", [
    (["--workers", "0"], "argument --workers: 0 is outside [1, 64]"),
    (["--workers", "65"], "argument --workers: 65 is outside [1, 64]"),
    (["--workers", "2", "--seed", str(2**32 - 1)], "the last seed, 4294967296, is past 4294967295"),
])
def test_a_bad_worker_count_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    assert main(["fuzz", "--target", "reference", "--examples", "1", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where nothing can be created")
def test_an_unwritable_database_is_one_line_and_exit_2(tmp_path, capsys):
    for workers in ("1", "2"):
        assert main(["fuzz", "--target", "reference", "--examples", "1", "--out", str(tmp_path), "--workers", workers,
                     "--database", "/proc/x"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--database /proc/x: cannot create or write" in err, err
        assert "schedproof fuzz: target" not in err      # refused before any search


def test_a_folder_that_is_not_a_hypothesis_database_is_one_line_naming_what_it_holds(tmp_path, capsys):
    foreign = tmp_path / "notes"
    (foreign / "drafts").mkdir(parents=True)
    (foreign / "todo.txt").write_text("x")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for database, says in ((foreign, "is not a Hypothesis example database: it holds drafts/, todo.txt"),
                           (a_file, "exists and is not a folder")):
        assert main(["fuzz", "--target", "reference", "--examples", "1", "--workers", "2", "--out", str(tmp_path / "o"),
                     "--database", str(database)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--database {database}: {says}" in err, err
    assert sorted(p.name for p in foreign.iterdir()) == ["drafts", "todo.txt"]     # left as it was


def _workers(pid: int) -> list[int]:
    """The campaign's worker processes (its children, less multiprocessing's resource tracker)."""
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        kids += [int(k) for k in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return sorted(k for k in kids if "resource_tracker" not in Path(f"/proc/{k}/cmdline").read_text())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the workers through /proc")
def test_a_dying_worker_is_an_error_row_and_a_signal_ends_the_rest_with_a_summary(tmp_path):
    """One worker killed outright: its seed is reported as an error, not dropped; then SIGINT to the campaign is
    passed on to the other worker, whose search ends with what it had, and the campaign exits 130 with its
    summary."""
    run = fuzz("--workers", 2, "--examples", 1_000_000, "--steps", 1, "--seed", 0, "--json",
               "--out", tmp_path, background=True)
    try:
        deadline = time.monotonic() + 45
        while True:      # both searching: past the interpreter's start and the imports (under a second of CPU)
            workers = _workers(run.pid)
            if len(workers) == 2 and all(_cpu_seconds(w) > 2.5 for w in workers):
                break
            assert time.monotonic() < deadline and run.poll() is None, "the workers did not start searching"
            time.sleep(0.2)
        os.kill(workers[0], signal.SIGKILL)
        time.sleep(1.0)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()      # its workers end with it (campaign.py: PR_SET_PDEATHSIG)
    assert run.returncode == 130 and "Traceback" not in err, err
    summary = json.loads(out)
    assert summary["interrupted"] == "SIGINT" and summary["status"] == "none"
    rows = {r["status"]: r for r in summary["seeds"]}
    assert set(rows) == {"error", "none"}, summary["seeds"]
    assert "killed by SIGKILL" in rows["error"]["error"] and rows["none"]["interrupted"] == "SIGINT"


def test_a_campaign_with_a_seed_that_ended_without_a_result_and_no_finding_exits_3(tmp_path):
    """A dead worker's seed was never searched, so "nothing found" does not cover the campaign: exit 3 (unknown),
    as a search cut short; a finding elsewhere still exits 1, and a campaign whose every seed ended exits 0."""
    from schedproof.campaign import Campaign, Seed
    from schedproof.cli import campaign_exit
    from schedproof.fuzz import FuzzResult

    def seed(n: int, status: str | None) -> Seed:
        if status is None:
            return Seed(n, None, error="its worker died: exit status -9")
        return Seed(n, FuzzResult(status, "reference", n, 10, 1.0))

    def campaign(*seeds: Seed) -> Campaign:
        return Campaign("reference", 10, tmp_path, list(seeds), 1.0)

    assert campaign_exit(campaign(seed(0, None), seed(1, "none"))) == 3
    assert "1 seed(s) ended without a result: 0" in campaign(seed(0, None), seed(1, "none")).lines()
    assert campaign_exit(campaign(seed(0, None), seed(1, "found"))) == 1
    assert campaign_exit(campaign(seed(0, "none"), seed(1, "none"))) == 0
