"""Engine releases as a dimension of the model (model/releases.py): `[engine] version`, its default (the newest
release a policy mirrors), its refusal, the vLLM rules that differ between 0.32, 0.33 and 0.34 on the model and on
the symbolic core (the 0.34 one in tests/test_policy_vllm_v1.py too), and every bundled scenario at every release of
its policy (none of their verdicts differs today). The real engines at each release: tests/test_target_vllm.py (the
installed release) and docs/conformance.md, "vLLM releases"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import model.policies  # noqa: F401  (registers every policy)
import model.symbolic.cores  # noqa: F401  (registers every core)
from model import releases
from model.config import ConfigError, EngineConfig
from model.policies.vllm_v1 import Options
from model.symbolic.run import run_workload
from schedproof.runner import run_scenario
from schedproof.scenario import ScenarioError, load
from targets.protocol import Add, Step
from targets.reference import ReferenceTarget

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))

# The workload the lockstep run on vLLM 0.33.0 shrank its first divergence from the 0.32 model to (docs/conformance.md,
# "vLLM releases"): r0 (priority 1) runs; r1 (priority 0, higher) joins; r0 then needs a block, is the
# lowest-priority running request and preempts itself.
SELF_PREEMPTION = [Add(rid=0, prompt=26, max_new=4, priority=1), Step(), Step(),
                   Add(rid=1, prompt=21, max_new=2, priority=0), Step(), Step(), Step(), Step()]


def self_preemption_design(version: str = "", async_scheduling: bool = False) -> EngineConfig:
    return EngineConfig(policy="vllm_v1", block_size=4, num_blocks=14, max_num_tokens=37, max_batch_size=2,
                        options=Options(max_model_len=37, policy="priority", enable_prefix_caching=False,
                                        scheduler_reserve_full_isl=False, async_scheduling=async_scheduling),
                        version=version)


def scheduled_per_step(cfg: EngineConfig, actions) -> list:
    model = ReferenceTarget(cfg)
    return [(o.record.scheduled, o.record.preempted) for a in actions if (o := model.apply(a)) is not None]


def test_every_policy_names_its_releases_and_every_change_a_release_it_mirrors():
    assert set(releases.RELEASES) == set(model.policy.POLICIES)
    for policy, known in releases.RELEASES.items():
        assert list(known) == sorted(known, key=releases.key), policy   # oldest first: the last is the default
    for change in releases.CHANGES:
        assert change.since in releases.RELEASES[change.policy] and change.since != releases.RELEASES[change.policy][0]
        assert change.where and change.what


def test_the_default_is_the_newest_release_and_a_named_one_is_kept():
    assert releases.release(self_preemption_design()) == "0.34"
    assert releases.release(self_preemption_design("0.32")) == "0.32"
    assert releases.nearest("vllm_v1", "0.35.1") == "0.34" and releases.nearest("vllm_v1", "0.33.0") == "0.33"
    assert releases.nearest("vllm_v1", "0.31.0") == "0.32"   # older than every modelled release: the oldest
    assert releases.nearest("hf_cb", "5.20.2") == "5.20"
    assert releases.nearest("vllm_v1", "?") == "0.34" and releases.nearest("sglang", "0.5.23rc1") == "0.5.23"


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_vllm_0_32_ends_the_running_loop_where_0_33_goes_on(async_scheduling):
    """After r0 preempts itself, 0.32 ends the running loop (a step that schedules nothing: S:846-848); 0.33 goes
    on to r1, which runs in that step (scheduler.py:981-990 in 0.33.0); FCFS is the same in both."""
    old = scheduled_per_step(self_preemption_design("0.32", async_scheduling), SELF_PREEMPTION)
    new = scheduled_per_step(self_preemption_design("0.33", async_scheduling), SELF_PREEMPTION)
    assert old[3] == ((), (0,)) and new[3] == (((1, 1),), (0,))
    assert old[:3] == new[:3]
    assert scheduled_per_step(self_preemption_design("0.34", async_scheduling), SELF_PREEMPTION) == new
    fcfs = {v: scheduled_per_step(dataclasses.replace(
        self_preemption_design(v, async_scheduling),
        options=dataclasses.replace(self_preemption_design().options, policy="fcfs",
                                    async_scheduling=async_scheduling)), SELF_PREEMPTION) for v in ("0.32", "0.33")}
    assert fcfs["0.32"] == fcfs["0.33"]


def test_the_symbolic_core_follows_the_release():
    """The vllm_v1 core equals the simulator field for field on this workload at each release, and r1's tokens in
    the self-preemption step are 0.33's 1 and 0.32's 0 (the differential harness covers random runs of both releases:
    tests/symbolic/cases/vllm_v1.py)."""
    from checkers.differential import diverges
    from model.simulator import RequestSpec, Workload

    work = Workload((RequestSpec(26, 4, 0, priority=1), RequestSpec(21, 2, 2, priority=0)))
    r1_tokens = {}
    for version in ("0.32", "0.33"):
        cfg = self_preemption_design(version)
        assert diverges(cfg, work) is None, version
        r1_tokens[version] = run_workload(cfg, work, max_steps=50).records[3].tokens[1]
    assert r1_tokens == {"0.32": 0, "0.33": 1}


def test_the_symbolic_core_follows_the_0_34_threshold_rule():
    """Chunked prefill off, a long-prefill threshold of 1, prompts of 1 and 2 tokens (the workload the lockstep run
    on vLLM 0.34.0 shrank its first divergence from the 0.33 model to): 0.33 caps the second prompt at 1 token,
    0.34 admits it whole; core and simulator agree at each release."""
    from checkers.differential import diverges
    from model.simulator import RequestSpec, Workload, simulate

    cfg = EngineConfig(policy="vllm_v1", block_size=4, num_blocks=4, max_num_tokens=12, max_batch_size=2,
                       options=Options(max_model_len=12, long_prefill_token_threshold=1, async_scheduling=False))
    work = Workload((RequestSpec(1, 2, 0), RequestSpec(2, 2, 0)))
    first = {}
    for version in ("0.33", "0.34"):
        at = dataclasses.replace(cfg, version=version)
        assert diverges(at, work) is None, version
        first[version] = simulate(at, work, max_steps=20).records[0].scheduled
    assert first == {"0.33": ((0, 1), (1, 1)), "0.34": ((0, 1), (1, 2))}


def write(tmp_path, version_line: str) -> Path:
    path = tmp_path / "design.toml"
    path.write_text(f"""name = "v"
[engine]
policy = "vllm_v1"
block_size = 4
num_blocks = 14
max_num_tokens = 37
max_batch_size = 2
{version_line}
[engine.options]
max_model_len = 37
policy = "priority"
enable_prefix_caching = false
async_scheduling = false
[[requests]]
prompt = 26
max_new = 4
priority = 1
[[requests]]
prompt = 21
max_new = 2
arrival = 2
""")
    return path


def test_a_scenario_names_its_release(tmp_path):
    assert load(write(tmp_path, 'version = "0.32"')).cfg.version == "0.32"
    assert load(write(tmp_path, "")).cfg.version == ""
    for bad, says in (('version = "0.31"', "vllm_v1 mirrors the releases 0.32, 0.33, 0.34 (got '0.31')"),
                      ("version = 0.33", "must be a str")):
        with pytest.raises(ScenarioError) as err:
            load(write(tmp_path, bad))
        assert "engine.version" in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


def test_run_names_the_release_and_exits_2_on_an_unknown_one(tmp_path, capsys):
    from schedproof.cli import main

    assert main(["run", str(write(tmp_path, 'version = "0.32"')), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["release"] == "vllm_v1 0.32"
    assert main(["run", str(write(tmp_path, "")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["release"] == "vllm_v1 0.34"
    assert main(["run", str(write(tmp_path, 'version = "9.9"'))]) == 2
    err = capsys.readouterr().err.strip()
    assert "engine.version" in err and "\n" not in err


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_bundled_scenario_keeps_its_expectation_at_every_release(path):
    """The verdict and counts a scenario expects hold at every release of its policy: no bundled scenario's
    verdict differs between releases today (a change that made one differ must say so in the scenario, with
    `[engine] version`, rather than move it silently)."""
    scenario = load(path)
    for version in releases.releases(scenario.cfg.policy):
        at = dataclasses.replace(scenario, cfg=dataclasses.replace(scenario.cfg, version=version))
        assert run_scenario(at).matches_expectation() == [], version


def test_an_unknown_release_is_refused_where_it_is_used():
    with pytest.raises(ConfigError) as err:
        releases.release(self_preemption_design("0.31"))
    assert err.value.field == "engine.version"


def test_check_names_the_release_of_its_file(tmp_path, capsys):
    """A check file takes `[engine] version` as a run file does: `--json` names it, an unknown one is exit 2."""
    from schedproof.cli import main

    path = write(tmp_path, 'version = "0.33"')
    text = path.read_text().replace("max_new = 4", "max_new = [1, 4]") + '[check]\nmax_depth = 3\n'
    path.write_text(text)
    assert main(["check", str(path), "--json", "--budget", "2"]) in (0, 3)
    assert json.loads(capsys.readouterr().out)["release"] == "vllm_v1 0.33"
    path.write_text(text.replace('version = "0.33"', 'version = "0.35"'))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "engine.version" in err and "0.32, 0.33, 0.34" in err and "\n" not in err
