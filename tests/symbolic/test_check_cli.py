"""`schedproof check`: statuses, exit codes, JSON fields, and bad input as one line with exit 2."""

import json

import pytest

from helpers import sized
from schedproof.cli import main

V2_SMALL = """
name = "v2-small"
[engine]
policy = "trtllm_v2"
block_size = 4
num_blocks = 12
host_blocks = {host}
max_num_tokens = 16
max_batch_size = 8
chunked_prefill = {chunked}
[engine.options]
disable_overlap_scheduler = true   # _executor_loop: the loop the symbolic cores encode
[[requests]]
count = [1, {count}]
prompt = {prompt}
max_new = [1, 16]
arrival = [0, 6]
[check]
early_stops = false
cancellations = false
max_depth = {depth}
"""


def write(tmp_path, **kw):
    values = dict(host=0, chunked="false", count=3, prompt="[1, 16]", depth=8)
    values.update(kw)
    path = tmp_path / "design.toml"
    path.write_text(V2_SMALL.format(**values))
    return str(path)


def test_violated_prints_a_replayed_shortest_trace(tmp_path, capsys):
    path = write(tmp_path, count=1, prompt="[1, 20]")
    assert main(["check", path, "--json", "--budget", "300"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "violated"
    assert out["property"] == "LIVE-NO-PROGRESS"   # a prompt over the budget never runs (chunking off)
    assert out["depth"] == 2 and len(out["trace"]) == 3
    assert out["replay"].startswith("replayed")
    assert out["config"]["max_num_tokens"] == 16 and out["seconds"] > 0
    assert 0 < out["found_seconds"] <= out["seconds"]
    assert out["workload"][0]["prompt"] > 16


def test_text_report_names_each_transition(tmp_path, capsys):
    path = write(tmp_path, count=1, prompt="[1, 20]")
    assert main(["check", path, "--budget", "300"]) == 1
    text = capsys.readouterr().out
    assert "violated LIVE-NO-PROGRESS at depth 2" in text
    assert "#1 step 0: r0 arrive" in text and "#2 step 1: nothing is scheduled" in text


def test_bounded_when_nothing_fails_up_to_the_depth(tmp_path, capsys):
    path = write(tmp_path, count=1, prompt="[1, 8]", depth=3)
    assert main(["check", path, "--json", "--budget", "300"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "bounded" and out["depth"] == 3 and out["trace"] is None


def test_unknown_when_the_budget_is_spent(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["check", path, "--json", "--budget", "0.001"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "unknown" and out["reason"] == "budget spent (0.001 s of solving)"
    assert out["stopped_by"] == "budget" and out["budget"] == 0.001 and out["timeout"] == 60.003


def test_a_search_the_wall_clock_cap_stops_has_its_own_status(tmp_path, capsys):
    """--timeout caps the wall-clock time on top of the budget: a search it stops is not reproducible, so it is not
    reported as unknown (what a spent budget gives, the same on any machine load) but as timeout, exit 3."""
    path = write(tmp_path)
    assert main(["check", path, "--json", "--budget", "600", "--timeout", "0.001"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "timeout" and out["stopped_by"] == "timeout", out
    assert "not reproducible" in out["reason"] and out["timeout"] == 0.001


def test_a_cap_that_passes_while_the_review_proves_claims_is_a_timeout_not_a_traceback(capsys):
    """The cap passing inside the design review's claim proofs: a deadline taken from the clock after the cap is
    infinite, and the time left to it was infinity minus infinity (NaN), which reached Z3's rlimit as a
    ValueError (checkers/clock.py `until`). Now the claims left are not started and the verdict is the cap's."""
    # the ci cap of 8 s passes during the search, as 25 s does here (before the claims' share): the claims loop then
    # runs after the cap, and the code before the fix (d85cf9f^) ends in that ValueError with 4, 8 and 25 s alike;
    # 6.9 s of CPU alone against 19.4 s with 25 s (2026-12-07)
    cap = sized(ci="8", nightly="25")
    assert main(["check", "scenarios/check/trtllm-v2-ab-field-ranges.toml", "--json", "--budget", "30",
                 "--timeout", cap]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "timeout" and out["stopped_by"] == "timeout", out


@pytest.mark.parametrize("kw, field", [
    (dict(prompt="[16, 1]"), "requests[0].prompt"),
    (dict(prompt="[1]"), "requests[0].prompt"),
    (dict(prompt="[1, true]"), "requests[0].prompt"),
    (dict(host=-1), "engine.host_blocks"),          # not a core refusal: those come and go with the cores
    (dict(host="[-1, 4]"), "engine.host_blocks"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, kw, field):
    path = write(tmp_path, **kw)
    assert main(["check", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and field in err[0]


def test_unknown_property_is_bad_input(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["check", path, "--property", "LIVE-NOPE"]) == 2
    assert "LIVE-NOPE" in capsys.readouterr().err


def test_run_still_refuses_ranges(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["run", path]) == 2
    assert "needs `schedproof check`" in capsys.readouterr().err


def _with_cancel(tmp_path, arrival, cancel_at):
    path = tmp_path / "cancel.toml"
    text = V2_SMALL.format(host=0, chunked="false", count=2, prompt="[1, 16]", depth=4)
    text = text.replace("arrival = [0, 6]", f"arrival = {arrival}\ncancel_at = {cancel_at}")
    path.write_text(text.replace("cancellations = false\n", ""))
    return str(path)


def test_ordered_ranges_are_validated_at_consistent_ends(tmp_path):
    """arrival [0, 64] with cancel_at [0, 10]: every request arriving by step 10 may be cancelled;
    the high ends alone (64 > 10) are not a request of the file and do not refuse it."""
    from schedproof.checkspec import load_check
    spec = load_check(_with_cancel(tmp_path, "[0, 64]", "[0, 10]"))
    fields = spec.space.groups[0].fields
    assert fields["arrival"] == (0, 64) and fields["cancel_at"] == (0, 10)


def test_ordered_ranges_with_no_request_between_them_are_bad_input(tmp_path, capsys):
    path = _with_cancel(tmp_path, "[5, 10]", "[0, 3]")
    assert main(["check", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "requests[0].arrival" in err[0]


def test_a_time_out_inside_a_capped_tier_names_the_runs_it_covered():
    """A search that times out while the request counts are still capped (checkers/bmc.py units_of) has covered
    only those runs: the report must not read as a statement about the whole space."""
    from checkers.bmc import BmcResult
    from schedproof.checkreport import as_dict, as_text

    capped = BmcResult("unknown", 9, 600.0, reason="time-out",
                       scope="runs with at most 3 requests per ranged group")
    assert as_text("f.toml", capped, None, []).splitlines()[0].endswith(
        "no counterexample of at most 9 transitions among runs with at most 3 requests per ranged group")
    assert as_dict("f.toml", capped, None)["clear_in"] == "runs with at most 3 requests per ranged group"
    whole = BmcResult("unknown", 5, 60.0, reason="time-out")
    assert as_text("f.toml", whole, None, []).splitlines()[0].endswith("among all runs of the space")
    assert as_dict("f.toml", whole, None)["clear_in"] == "the whole space"
