"""The stateful search on the real transformers engine, within its `ci` profile: it finds the field
failure (the fatal "No requests can be scheduled ..." error), shrinks it, and the generated regression
test reproduces it on the engine."""

import importlib.util
import json

from schedproof import reportdir
from schedproof.finding import from_fuzz
from schedproof.fuzz import fuzz, write_report
from targets.stateful import PROFILES


def test_ci_search_finds_the_field_failure_on_the_real_engine(tmp_path):
    # Empty prompts crash the engine sooner (a separate finding, tested below); search past them.
    ci = PROFILES["ci"]
    result = fuzz("transformers", examples=ci["examples"], seed=0, steps=ci["steps"], empty_prompts=False)
    assert result.status == "found", "the ci profile no longer finds the fatal error"
    assert result.property == "ENGINE-ERROR"
    assert "No requests can be scheduled and no requests can be offloaded." in result.failure.violation.message
    assert len(result.failure.actions) <= 8
    assert result.as_dict()["reproduced_on_replay"]
    _, test = write_report(result, tmp_path)
    spec = importlib.util.spec_from_file_location("generated_transformers_regression", test)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_reproduces_engine_error()


def test_ci_search_finds_the_empty_prompt_crash_on_the_real_engine(tmp_path):
    ci = PROFILES["ci"]
    result = fuzz("transformers", examples=ci["examples"], seed=0, steps=ci["steps"])
    assert result.status == "found" and result.property == "ENGINE-ERROR"
    assert "cannot reshape tensor of 0 elements" in result.failure.violation.message
    assert [a.prompt for a in result.failure.actions if hasattr(a, "prompt")] == [0]
    assert result.as_dict()["reproduced_on_replay"]
    # the report names the mechanism in the model's words, beside torch's
    folder = reportdir.write(from_fuzz(result), tmp_path / "report")
    cause = json.loads((folder / "report.json").read_text())["cause"]
    assert "a batch with no query tokens (only empty prompts)" in cause and "cannot reshape tensor" in cause, cause
