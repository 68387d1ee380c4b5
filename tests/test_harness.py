"""The target harness on the model itself (the `reference` target): actions, per-step checks, the
stateful search, its shrunk counterexample, the report and the generated regression test."""

import importlib.util
import json

import pytest

from helpers import config
from model.simulator import RequestSpec, Workload
from model.state import Phase
from schedproof.cli import main
from schedproof.fuzz import fuzz, write_report
from model.config import EngineConfig
from model.policies.sglang import Options as SglangOptions
from targets import Add, Cancel, Step, Stop, get_target
from targets.checking import (StepChecker, config_from_dict, config_to_dict, reduce_actions, replay, without,
                              workload_actions)


def hf(**kw):
    base = dict(block_size=4, num_blocks=4, max_num_tokens=8, max_batch_size=4, chunked_prefill=True)
    base.update(kw)
    return config("hf_cb", **base)


def test_reference_target_runs_actions_and_answers_every_request():
    cfg = hf()
    result = replay(get_target("reference")(cfg), cfg, [Add(0, 5, 3), Add(1, 3, 2)] + [Step()] * 8)
    assert result.violation is None
    final = result.observations[-1].state
    assert [r.phase for r in final.requests] == [Phase.FINISHED, Phase.FINISHED]


def test_a_request_too_large_for_the_cache_is_the_engine_error_and_fails_the_others():
    cfg = hf()
    result = replay(get_target("reference")(cfg), cfg, [Add(0, 3, 2), Add(1, 20, 2)] + [Step()] * 5)
    assert result.violation.property == "ENGINE-ERROR"
    assert "No requests can be scheduled" in result.violation.message


def test_the_checker_flags_a_stalled_step():
    cfg = hf()
    # Soft reset, then the only active request cancelled: block_new_requests stays set (finding).
    actions = [Add(0, 5, 8), Add(1, 5, 8)] + [Step()] * 5 + [Cancel(1)] + [Step()] * 2
    result = replay(get_target("reference")(cfg), cfg, actions)
    assert result.violation.property == "LIVE-NO-PROGRESS"


def test_configurations_round_trip_as_plain_data():
    cfg = hf(options={"scheduler_type": "prefill_first", "allow_block_sharing": False})
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


def test_greedy_oracle_compares_finished_outputs():
    cfg = hf()
    checker = StepChecker(cfg, reference_outputs=lambda add: (7,) * add.max_new)
    checker.submitted(Add(0, 3, 1))
    target = get_target("reference")(cfg)
    target.add(Add(0, 3, 1))
    obs = target.step()
    obs.outputs = {0: (9,)}
    assert checker.check(obs).property == "ORACLE-GREEDY-OUTPUT"


def test_deleting_a_submission_renumbers_the_later_requests_and_drops_its_cancels():
    actions = [Add(0, 4, 2), Add(1, 5, 2), Cancel(1), Step(), Add(2, 6, 2), Stop(2), Cancel(0)]
    assert without(actions, 1) == [Add(0, 4, 2), Step(), Add(1, 6, 2), Stop(1), Cancel(0)]
    assert without(actions, 3) == actions[:3] + actions[4:]


def test_the_reduction_keeps_what_the_failure_needs_and_nothing_else():
    # SGLang's clip stall (docs/findings/README.md, SGLang 1): r1 is clipped to the memory bound and refused on an
    # empty engine forever; r0 finishes first and r2 is cancelled, neither needed. A replay decides each deletion.
    cfg = EngineConfig("sglang", 1, 12, 4, 1, options=SglangOptions(ignore_eos=True, disable_radix_cache=True))
    actions = [Add(0, 2, 2), Step(), Step(), Step(), Add(1, 1, 9), Add(2, 3, 3), Cancel(2), Step(), Step(), Step()]
    first = replay(get_target("reference")(cfg), cfg, actions)
    assert first.violation is not None and first.violation.property == "LIVE-NO-PROGRESS"
    reduced, result = reduce_actions(lambda: get_target("reference")(cfg), cfg, actions, first.violation)
    assert reduced == [Add(0, 1, 9), Step(), Step()] and result.violation.property == "LIVE-NO-PROGRESS"
    assert result.actions_run == len(reduced)
    # an error kind the failure does not have is never reached: nothing is deleted
    kept, none = reduce_actions(lambda: get_target("reference")(cfg), cfg, actions, first.violation, error_kind="crash")
    assert kept == actions and none is None


def test_fuzz_finds_shrinks_reports_and_the_regression_test_replays_it(tmp_path):
    result = fuzz("reference", examples=40, seed=0)
    assert result.status == "found" and result.property == "ENGINE-ERROR"
    assert len(result.failure.actions) <= 6            # shrunk to a handful of actions
    assert result.as_dict()["reproduced_on_replay"]
    report, test = write_report(result, tmp_path)
    data = json.loads(report.read_text())
    assert {"status", "property", "actions", "seed", "examples", "seconds", "steps"} <= data.keys()
    spec = importlib.util.spec_from_file_location("generated_regression", test)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_reproduces_engine_error()   # the generated test passes: it reproduces the failure


def test_fuzz_is_deterministic_for_a_seed():
    a, b = fuzz("reference", examples=20, seed=3), fuzz("reference", examples=20, seed=3)
    assert a.failure.actions == b.failure.actions


def test_fuzz_command_line(tmp_path, capsys):
    assert main(["fuzz", "--target", "reference", "--examples", "30", "--seed", "0", "--json",
                 "--out", str(tmp_path)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "found" and out["property"] == "ENGINE-ERROR" and out["seed"] == 0
    assert out["release"] == "hf_cb 5.25"   # the reference target runs the model's newest release
    assert main(["fuzz", "--target", "lightllm"]) == 2
    assert "unknown target" in capsys.readouterr().err
    assert main(["fuzz", "--target", "reference", "--examples", "0"]) == 2


def test_workload_actions_submit_cancel_and_step_in_order():
    wl = Workload((RequestSpec(3, 2, 0), RequestSpec(4, 5, 1, cancel_at=2, prefix_group=1, prefix_len=2)))
    assert workload_actions(wl, 3) == [Add(0, 3, 2), Step(), Add(1, 4, 5, 1, 2), Step(), Cancel(1), Step()]
    with pytest.raises(ValueError, match="stops early"):
        workload_actions(Workload((RequestSpec(3, 2, 0, output_len=1),)), 1)


def test_replay_reruns_a_fuzz_report_on_its_target(tmp_path, capsys):
    assert main(["fuzz", "--target", "reference", "--examples", "30", "--seed", "0", "--json",
                 "--out", str(tmp_path)]) == 1
    report = json.loads(capsys.readouterr().out)["report"]
    assert main(["replay", report, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["same"] and out["property"] == out["report_property"] == "ENGINE-ERROR" and out["target"] == "reference"
    assert main(["replay", report]) == 1
    assert "(the report's property)" in capsys.readouterr().out


@pytest.mark.parametrize("content,field", [
    ("not json", "file"),
    ("[]", "file"),
    ('{"target": "reference", "config": {}, "actions": []}', "actions"),
    ('{"target": "reference", "actions": ["Step()"]}', "config"),
    ('{"target": "reference", "config": {}, "actions": ["__import__(1)"]}', "actions[0]"),
    ('{"target": "reference", "config": {"policy": "nope"}, "actions": ["Step()"]}', "config"),
])
def test_replay_of_a_bad_report_is_one_line_naming_the_field(tmp_path, capsys, content, field):
    path = tmp_path / "r.json"
    path.write_text(content)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and field in err[0], err


def test_replay_on_a_target_that_does_not_exist(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"target": "reference", "config": config_to_dict(config("hf_cb", chunked_prefill=True)),
                                "actions": ["Step()"]}))
    assert main(["replay", str(path), "--target", "lightllm"]) == 2
    assert "unknown target" in capsys.readouterr().err
