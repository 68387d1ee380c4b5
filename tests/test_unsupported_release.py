"""`--allow-unsupported-release` (targets/releases.py): without it a release the target does not list is refused in
one line that names the flag (exit 4); with it the release is driven, and the run says once which model it is held
to. The release gate is a function of the version string; the installed engines' releases are the suite's own, so a
run on an unsupported release is in docs/conformance.md ("transformers releases"), made with `schedproof env`."""

import pytest

from schedproof.cli import main
from targets import releases
from targets.protocol import TargetUnavailable, exit_status
from targets.transformers_cb import PINNED, release_refusal


@pytest.fixture
def no_allowance(monkeypatch):
    """The flag not given; whatever a test sets is undone after it (setenv first records the variable's state)."""
    monkeypatch.setenv(releases.ALLOW_ENV, "")
    monkeypatch.delenv(releases.ALLOW_ENV)


def test_an_unsupported_release_is_refused_naming_the_flag(no_allowance):
    with pytest.raises(TargetUnavailable) as refused:
        releases.gate("transformers", "5.18.0", release_refusal("5.18.0"), PINNED)
    line = str(refused.value)
    assert "\n" not in line and "found 5.18.0" in line and "--allow-unsupported-release" in line
    assert exit_status(refused.value) == 4


def test_allowed_it_is_driven_and_said_once(no_allowance, monkeypatch, capsys):
    releases.allow_unsupported(True)                     # what the flag does (undone by the fixture)
    monkeypatch.setattr(releases, "_said", set())
    for _ in range(2):
        releases.gate("transformers", "5.18.0", release_refusal("5.18.0"), PINNED)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"against the model of transformers {PINNED}" in err, err
    releases.gate("transformers", PINNED, release_refusal(PINNED), PINNED)       # a supported one: nothing said
    assert capsys.readouterr().err == ""


def test_the_flag_is_off_unless_given(no_allowance):
    releases.allow_unsupported(False)
    assert not releases.allowed()


@pytest.mark.parametrize("command", [["conform", "--target", "transformers"], ["fuzz", "--target", "reference"]])
def test_conform_and_fuzz_take_the_flag(command, capsys):
    assert main([*command, "--help"]) == 0
    assert "--allow-unsupported-release" in capsys.readouterr().out
