"""`schedproof sweep --boundary solver`: the threshold along the last knob from solver queries over
intervals (schedproof/sweepsolver.py), checked against `check` at single values the grid does not
hold, the box query over two knobs (one that holds and one that must fail), the grid points the
queries cover, a query that times out, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkers.bmc import search
from checkers.replay import replay
from model.symbolic.core import CORES
from schedproof import sweepsolver
from schedproof.checkspec import check_from_table
from schedproof.cli import main
from schedproof.scenario import read_toml
from schedproof.sweep import plan
from helpers import sized

DESIGN = Path("scenarios/check/trtllm-v2-replay-budget-sweep.toml")
# The file's max_depth (10) in the nightly; the ci size searches to depth 7, where the threshold is the same (14,
# tight at 13: its violation lies at depth 5) and the sweep takes 28 s against 63 s (2026-12-07, one after the other)
DEPTH = sized(ci=7, nightly=None)


def _design(tmp_path: Path) -> Path:
    """The design at the profile's depth: the file itself in the nightly, a copy searched to DEPTH in ci."""
    if DEPTH is None:
        return DESIGN
    copy = tmp_path / DESIGN.name
    text = DESIGN.read_text()
    assert "\nmax_depth = 10\n" in text
    copy.write_text(text.replace("\nmax_depth = 10\n", f"\nmax_depth = {DEPTH}\n"))
    return copy


def _check_at(design: Path, **engine) -> str:
    """`check`'s verdict on the design with the engine knobs fixed at the values given."""
    raw = read_toml(str(design))
    raw["engine"].update(engine)
    spec = check_from_table(str(design), raw)
    found = search(CORES["trtllm_v2"], spec.space, spec.max_depth, 300, list(spec.properties), shortest=False)
    if found.status == "violated":
        assert replay(found.cex).ok
    return found.status


def test_the_solver_threshold_is_tight_and_agrees_with_check_between_grid_points(tmp_path, capsys):
    design = _design(tmp_path)
    assert main(["sweep", str(design), "--vary", "max_num_tokens=8..20:2", "--boundary", "solver",
                 "--workers", "1", "--json", "--report", str(tmp_path / "out")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["solver"] == data["solver"]
    for page in ("sweep.md", "sweep.html"):
        assert "from the solver" in (tmp_path / "out" / page).read_text()
    (row,) = data["solver"]["rows"]
    t = row["safe_from"]
    assert row["unsafe_at"] == t - 1 and not row["stopped"] and 8 < t < 20, row
    assert "and is tight" in row["sentence"] and f">= {t} suffices" in row["sentence"]
    # the threshold is claimed for every value, not only the grid's even ones: check single values
    assert _check_at(design, max_num_tokens=t - 1) == "violated"
    assert _check_at(design, max_num_tokens=t) == "bounded"
    off_grid = max(v for v in range(t, 21) if v % 2)             # odd (19): not a grid point
    assert _check_at(design, max_num_tokens=off_grid) == "bounded"
    # the grid points at or above t were covered by the queries, not run; those below were run and
    # agree with the threshold from below only as far as they go (no monotonicity is assumed)
    for point in data["points"]:
        if point["max_num_tokens"] >= t:
            assert point["safe"] and point["seconds"] == 0 and "the solver's query" in point["detail"], point
        else:
            assert point["seconds"] > 0 and point["verdict"] in ("violated", "bounded", "unknown"), point
    assert data["solver"]["covered"] == sum(p["max_num_tokens"] >= t for p in data["points"])
    grid_safe = [p["max_num_tokens"] for p in data["points"] if p["safe"]]
    assert min(grid_safe) >= t


def _rows(raw, varies, thresholds: dict) -> list:
    last = varies[-1]
    return [sweepsolver.RowBoundary((nb,), last.short, last.values[0], last.values[-1], t, t - 1)
            for nb, t in thresholds.items()]


def test_the_box_query_covers_every_pool_between_the_rows_or_finds_the_violation(tmp_path):
    design = str(_design(tmp_path))
    raw, varies = plan(design, ["num_blocks=8..10:2", "max_num_tokens=8..20:2"])
    holds = sweepsolver.box_boundary(design, raw, varies, _rows(raw, varies, {8: 14, 10: 14}), 300)
    assert holds.verdict == "bounded" and holds.box == {"num_blocks": [8, 10], "max_num_tokens": [14, 20]}
    assert "every num_blocks in [8, 10]" in sweepsolver.box_sentence(varies, holds)
    # a threshold too low for some pool in the box: the query must find it, with a witness inside the box
    fails = sweepsolver.box_boundary(design, raw, varies, _rows(raw, varies, {8: 10, 10: 10}), 300)
    assert fails.verdict == "violated" and 10 <= fails.witness <= 20, fails
    assert "a larger threshold is needed" in sweepsolver.box_sentence(varies, fails)


def test_a_query_that_times_out_leaves_the_row_undecided_and_covers_nothing(capsys):
    assert main(["sweep", str(DESIGN), "--vary", "max_num_tokens=14..16:2", "--boundary", "solver",
                 "--workers", "1", "--timeout", "0.01", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["solver"]["rows"]
    assert row["safe_from"] is None and "time-out" in row["stopped"], row
    assert data["solver"]["covered"] == 0 and all(p["seconds"] > 0 for p in data["points"])
    assert row["sentence"].startswith("no solver boundary")


@pytest.mark.parametrize("path, vary, says", [
    ("scenarios/trtllm-v2-replay-over-budget.toml", "max_num_tokens=1792..2560:256", "a design with ranges"),
    (str(DESIGN), "max_new_tokens=1..2", "unknown knob"),
    (str(DESIGN), "chunk_unit=1..2", "must be one a check takes as a range"),
])
def test_bad_input_for_the_solver_boundary_is_one_line_and_exit_2(path, vary, says, capsys):
    assert main(["sweep", path, "--vary", vary, "--boundary", "solver"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
