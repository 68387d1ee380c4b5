"""`schedproof sweep`: the field design's safe region over pool size and token budget (fixes off, and
A+B), its boundary, agreement with `run` at sampled points (each point written as its own scenario file
and run by the command line), the same table with one and two workers, and bad input."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from schedproof import sweep as sweep_module
from schedproof.cli import main

FIELD = Path("scenarios/trtllm-v2-replay-over-budget.toml")
FIXED = Path("scenarios/trtllm-v2-fixes-replay-over-budget.toml")
VARY = ["--vary", "options.kv_cache_max_tokens=6144..10240:2048", "--vary", "max_num_tokens=1792..2560:256"]


def _sweep(capsys, path: Path, *extra: str) -> dict:
    assert main(["sweep", str(path), *VARY, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _point_file(tmp_path: Path, path: Path, point: dict) -> Path:
    """The scenario with the point's values written into its text: `run` reads it as any file."""
    text = path.read_text()
    for knob in ("kv_cache_max_tokens", "max_num_tokens"):
        text, n = re.subn(rf"^{knob} = \d+", f"{knob} = {point[knob]}", text, flags=re.M)
        assert n == 1, knob
    out = tmp_path / f"{path.stem}-{point['kv_cache_max_tokens']}-{point['max_num_tokens']}.toml"
    out.write_text(text)
    return out


def test_field_design_sweep_states_its_boundary_and_agrees_with_run(tmp_path, capsys):
    data = _sweep(capsys, FIELD, "--workers", "1", "--report", str(tmp_path / "report"))
    assert data["safe"] and data["unsafe"] and not data["unclaimed"]
    assert data["boundary"][0].startswith("everywhere in the grid: safe iff max_num_tokens >= 2304")
    for point in data["points"][::3]:                  # a sample, each run as its own file
        assert main(["run", str(_point_file(tmp_path, FIELD, point)), "--json"]) in (0, 1)
        run = json.loads(capsys.readouterr().out)
        assert run["verdict"] == point["verdict"] and (run["verdict"] == "ok") == point["safe"], (point, run)
    page = (tmp_path / "report" / "sweep.html").read_text()
    assert "<svg" in page and "max_num_tokens" in page and "safe iff max_num_tokens" in page
    assert json.loads((tmp_path / "report" / "sweep.json").read_text())["points"] == data["points"]


def test_fixes_a_and_b_widen_the_safe_region_to_every_budget_the_prompt_fits(capsys):
    """With A+B the only unsafe points are those whose budget (1792) is below the 1900-token prompt:
    no request fits alone there, outside the fixes' claim; fixes off needs 2304."""
    data = _sweep(capsys, FIXED, "--workers", "1")
    assert {p["max_num_tokens"] for p in data["points"] if not p["safe"]} == {1792}
    assert data["boundary"][0].startswith("everywhere in the grid: safe iff max_num_tokens >= 2048")


def test_two_workers_give_the_same_table(capsys):
    one, two = _sweep(capsys, FIELD, "--workers", "1"), _sweep(capsys, FIELD, "--workers", "2")
    strip = [{k: v for k, v in p.items() if k != "seconds"} for p in one["points"]]
    assert strip == [{k: v for k, v in p.items() if k != "seconds"} for p in two["points"]]


@pytest.mark.parametrize("vary, reason", [
    ("pool_size=1..4", "unknown knob 'pool_size'"),
    ("max_num_tokens=2048..1024", "the range is reversed"),
    ("max_num_tokens=", "expected a range LO..HI"),
    ("max_num_tokens=a..b", "LO, HI and STEP must be integers"),
    ("max_num_tokens=1..9:0", "STEP must be positive"),
    ("max_num_tokens", "expected KNOB=LO..HI[:STEP]"),
])
def test_bad_vary_is_one_line_and_exit_2(vary, reason, capsys):
    assert main(["sweep", str(FIELD), "--vary", vary]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err and "--vary" in err, err


def test_a_point_the_engine_refuses_is_reported_not_dropped(capsys):
    assert main(["sweep", str(FIELD), "--vary", "max_batch_size=0..1", "--json", "--workers", "1"]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert [p["verdict"] for p in points] == ["refused", "ok"] and points[0]["safe"] is None


def test_a_design_with_ranges_is_judged_by_check(capsys):
    """A file with ranges: each point is `check`'s verdict (here the recompute wedge, found at depth 4)."""
    assert main(["sweep", "scenarios/check/vllm-chunked-off-wedge-ranges.toml", "--vary",
                 "options.max_num_scheduled_tokens=2..2", "--workers", "1", "--timeout", "60", "--json"]) == 0
    [point] = json.loads(capsys.readouterr().out)["points"]
    assert point["verdict"] == "violated" and point["safe"] is False
    assert point["detail"].startswith("LIVE-NO-PROGRESS at depth ")


def test_a_larger_pool_can_hurt_the_field_design_and_the_sweep_says_where(capsys):
    """Monotonicity in the pool is refuted for the field design with fixes off: at max_num_tokens 2176 a
    larger pool lets a request decode longer before it is paused, so its replay outgrows the budget.
    The sweep names the two points; with A+B the same row is safe throughout."""
    vary = ["--vary", "max_num_tokens=2176..2176", "--vary", "options.kv_cache_max_tokens=10240..12288:1024"]
    assert main(["sweep", str(FIELD), *vary, "--json", "--workers", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["safe"] for p in data["points"]] == [True, False, True]
    assert data["boundary"] == ["at max_num_tokens = 2176: not monotone in kv_cache_max_tokens: safe at 10240, "
                                "unsafe at 11264"]
    assert main(["sweep", str(FIXED), *vary, "--json", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["boundary"] == ["at max_num_tokens = 2176: safe at every "
                                                               "kv_cache_max_tokens in 10240..12288"]


# -- a worker that dies -------------------------------------------------------------------------------------------

_REAL_JUDGE = sweep_module.judge
_MARKS = {}


def _dying_judge(path, raw, varies, values, timeout):
    """Kills its worker process: once for the first point (a marker file remembers), always for the last."""
    first, last, mark = _MARKS["first"], _MARKS["last"], _MARKS["file"]
    if values == last or (values == first and not os.path.exists(mark)):
        Path(mark).touch()
        os._exit(1)
    return _REAL_JUDGE(path, raw, varies, values, timeout)


def test_a_dying_local_worker_is_retried_once_then_its_point_is_an_error(tmp_path, monkeypatch):
    raw, varies = sweep_module.plan(str(FIELD), ["max_num_tokens=1792..2560:256"])
    grid = [(v,) for v in varies[0].values]
    _MARKS.update(first=grid[0], last=grid[-1], file=str(tmp_path / "died-once"))
    monkeypatch.setattr(sweep_module, "judge", _dying_judge)
    points = sweep_module.sweep(str(FIELD), raw, varies, 2, 60)
    assert [p.values for p in points] == grid                      # nothing dropped
    assert points[0].verdict == "deadlock"                          # died once, retried, judged
    assert points[-1].verdict == "error" and "died again running alone" in points[-1].detail
    assert points[-1].safe is None
    assert all(p.verdict in ("deadlock", "ok") for p in points[1:-1])
