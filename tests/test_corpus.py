"""Every bundled scenario comes out of `schedproof run` with the verdict and counts it expects,
and the corpus as a whole witnesses every `sometimes` property (nothing passes vacuously)."""

from pathlib import Path

import pytest

from properties import REGISTRY
from schedproof.runner import run_scenario
from schedproof.scenario import load

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_verdict_as_expected(path):
    scenario = load(path)
    assert scenario.expect.verdict is not None, f"{path.name} has no [expect] verdict"
    result = run_scenario(scenario)
    assert result.evaluation.complete
    assert result.matches_expectation() == [], [str(v) for v in result.evaluation.violations]


def test_corpus_witnesses_every_sometimes_property():
    witnessed = set()
    for path in SCENARIOS:
        witnessed |= set(run_scenario(load(path)).evaluation.witnessed)
    wanted = {p.id for p in REGISTRY.values() if p.kind == "sometimes"}
    assert wanted <= witnessed, wanted - witnessed


def test_field_report_rows_come_out_as_reported():
    """seeds.md 3: 3/12 with the V2 deadlock error for the other nine; 12/12; 24/24 chunked; all
    rows complete with fixes A and B."""
    root = SCENARIOS[0].parent
    row1 = run_scenario(load(root / "trtllm-v2-replay-over-budget.toml"))
    assert (row1.completed, row1.failed) == (3, 9)
    assert all(r.reason.startswith("V2 scheduler deadlock: 0 generation and 9 context request(s)")
               for r in row1.trace.final.requests if r.reason)
    for name, n in (("trtllm-v2-replay-within-budget", 12), ("trtllm-v2-chunked-prefill", 24),
                    ("trtllm-v2-fixes-replay-over-budget", 12), ("trtllm-v2-fixes-replay-within-budget", 12),
                    ("trtllm-v2-fixes-chunked-prefill", 24)):
        r = run_scenario(load(root / f"{name}.toml"))
        assert (r.verdict, r.completed, r.total) == ("ok", n, n), name


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_expectation_says_where_it_comes_from(path):
    """[expect] source: an engine observation, a field report, an upstream test, or the model's own
    prediction (schedproof/scenario.py SOURCES); an engine or field-report source names its run in
    the description."""
    scenario = load(path)
    assert scenario.expect.source is not None, f"{path.name}: [expect] has no source"
    if scenario.expect.source == "engine":
        assert "real engine" in scenario.description.lower() or "real scheduler" in scenario.description.lower()
    if scenario.expect.source == "field-report":
        assert "#21826" in scenario.description
