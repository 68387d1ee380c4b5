"""`schedproof check --progress`: the depth reached and the time left while the search runs, and the
counterexample printed (replayed) as soon as it is found, before certification against the larger
space goes on; nothing of that under --json (auto) or when switched off."""

from schedproof.cli import main

DESIGN = """
name = "v2-progress"
[engine]
policy = "trtllm_v2"
block_size = 4
num_blocks = 12
host_blocks = 0
max_num_tokens = 16
max_batch_size = 8
chunked_prefill = false
[engine.options]
disable_overlap_scheduler = true   # _executor_loop: the loop the symbolic cores encode
[[requests]]
count = [1, 2]
prompt = [1, 20]
max_new = [1, 16]
arrival = [0, 6]
[check]
early_stops = false
cancellations = false
max_depth = 4
"""


def test_the_counterexample_is_shown_before_certification_ends(tmp_path, capsys):
    path = tmp_path / "design.toml"
    path.write_text(DESIGN)
    assert main(["check", str(path), "--progress", "on", "--budget", "300"]) == 1
    captured = capsys.readouterr()
    err = captured.err
    # found with one request (the capped space), then certified against two: in that order
    found = err.index("counterexample: LIVE-NO-PROGRESS at depth 2")
    certifying = err.index("certifying: no violation up to depth 1 with 2 request slots")
    assert found < certifying
    assert "replay: replayed" in err[found:certifying] and "#1 step 0: r0 arrive" in err[found:certifying]
    assert " s left" in err
    # the final report is on stdout, and says the certification covered the whole space
    assert "violated LIVE-NO-PROGRESS at depth 2" in captured.out
    assert "shortest: no run with fewer transitions violates" in captured.out


def test_quiet_under_json_and_when_off(tmp_path, capsys):
    path = tmp_path / "design.toml"
    path.write_text(DESIGN)
    for flags in (["--json"], ["--progress", "off"]):
        assert main(["check", str(path), "--budget", "300", *flags]) == 1
        err = capsys.readouterr().err
        assert "counterexample:" not in err and "searching:" not in err and "certifying:" not in err
