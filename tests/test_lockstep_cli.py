"""`python -m targets.lockstep` refuses what it cannot run with one line and exit status 2, not a traceback."""

from targets import lockstep


def test_unknown_target_is_one_line_exit_2(capsys):
    assert lockstep.main(["--target", "nope", "--workloads", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown target 'nope'" in err


def test_a_target_without_a_model_in_lockstep_is_refused(capsys):
    assert lockstep.main(["--target", "reference", "--workloads", "1"]) == 2
    assert "runs no model in lockstep" in capsys.readouterr().err


def test_the_refused_mode_of_an_engine_without_one_is_refused(capsys):
    assert lockstep.main(["--target", "transformers", "--workloads", "1", "--refused"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no mode for configurations its engine refuses" in err
