"""The search past B7 on vLLM's real V1 scheduler (docs/findings/README.md, vLLM 2).

`schedproof fuzz --target vllm` finds the known B7 head-of-line deadlock first (a prompt over the step budget
with chunked prefill off; tests/test_target_vllm.py) and, shrinking to it, hides what lies behind it. With
`--fitting-only` every prompt fits one step alone (`stateful.vllm_v1_step_prompt`), so B7 cannot occur, and with
`--drain` the requests left when the actions end are stepped until answered: the recompute wedge (a request that
fits alone is recompute-preempted and its replay, prompt + generated tokens, no longer fits the step budget) is
then a step that changes nothing. The model predicts it (scenarios/vllm-chunked-off-recompute-wedge.toml).

The first tests need no engine: what `--fitting-only` submits on a vLLM configuration, on the model."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from model.config import EngineConfig
from model.policies.vllm_v1 import Options
from targets.checking import replay
from targets.protocol import Add
from targets.reference import ReferenceTarget
from targets.stateful import PROFILES, machine_for, vllm_v1_configs, vllm_v1_step_prompt

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (see tests/test_target_vllm.py)")
WEDGE = "a replay over the step budget after a preemption (the recompute wedge)"   # VllmTarget.stall_cause


def vcfg(chunked: bool, mml: int = 16, tokens: int = 16, scheduled=None) -> EngineConfig:
    return EngineConfig(policy="vllm_v1", block_size=4, num_blocks=6, max_num_tokens=tokens, max_batch_size=2,
                        chunked_prefill=chunked, options=Options(max_model_len=mml, max_num_scheduled_tokens=scheduled))


def step_budget(cfg: EngineConfig) -> int:
    return min(cfg.max_num_tokens, cfg.options.max_num_scheduled_tokens or cfg.max_num_tokens)


def test_the_largest_fitting_prompt_is_one_steps_budget_with_chunked_prefill_off():
    assert vllm_v1_step_prompt(vcfg(False, scheduled=3)) == 3
    assert vllm_v1_step_prompt(vcfg(False, mml=16, tokens=20, scheduled=24)) == 16     # max_model_len bounds it
    assert vllm_v1_step_prompt(vcfg(False, mml=12, tokens=12)) == 12
    assert vllm_v1_step_prompt(vcfg(True, mml=16, tokens=4, scheduled=2)) == 16       # chunked: any prompt


class _VllmModel(ReferenceTarget):
    """The model as the machine sees the vllm target: its policy and its room (max_model_len)."""
    policy = "vllm_v1"
    prompt_room = staticmethod(lambda cfg: cfg.options.max_model_len)
    submitted: list = []

    def add(self, action: Add) -> None:
        type(self).submitted.append((self.cfg, action))
        super().add(action)


def test_fitting_only_submits_no_prompt_over_the_step_budget():
    """On every configuration `vllm_v1_configs` draws, `--fitting-only` keeps prompts within one step's budget
    when chunked prefill is off (so B7 cannot occur) and prompt + max_new - 1 within max_model_len: the outputs
    are bounded by max_model_len only, so a recompute preemption can still turn them into a replay over the
    budget (the search below finds that)."""
    _VllmModel.submitted = []
    machine = machine_for(_VllmModel, configs=vllm_v1_configs(), fitting_only=True, empty_prompts=False)
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=20, deadline=None,
                                                         database=None, suppress_health_check=list(HealthCheck)))
    assert _VllmModel.submitted
    for cfg, a in _VllmModel.submitted:
        assert 1 <= a.prompt and a.prompt + a.max_new - 1 <= cfg.options.max_model_len, (cfg, a)
        if not cfg.chunked_prefill:
            assert a.prompt <= step_budget(cfg), (cfg, a)


@pytest.fixture
def no_local_constants(monkeypatch):
    """Hypothesis now and then draws a literal found in the project's own modules loaded at the time (its local
    constants, hypothesis/internal/conjecture/providers.py `_get_local_constants`), so a seeded search depends on
    what else the session imported and on every literal in model/, targets/, schedproof/. With the pool pinned
    empty, the seed's search depends on the strategies and the engine alone (the command line does not pin it)."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    monkeypatch.setattr(providers, "_get_local_constants", lambda: empty)
    providers.CONSTANTS_CACHE.cache.clear()
    yield
    providers.CONSTANTS_CACHE.cache.clear()


@needs_vllm
def test_the_search_past_b7_finds_the_recompute_wedge_on_the_real_scheduler(tmp_path, no_local_constants):
    """`schedproof fuzz --target vllm --seed 37 --fitting-only --drain` (ci budget): a no-progress state with every
    prompt within the step budget, so not B7: a request was recompute-preempted and its replay outgrew the budget
    (the target's stall_cause), the model in lockstep agreeing at every step; the model alone fails the same way
    at the same step (it predicted it), and the generated regression test reproduces it."""
    from schedproof.fuzz import fuzz, write_report
    from targets.vllm_v1 import VllmTarget

    ci = PROFILES["ci"]
    result = fuzz("vllm", examples=ci["examples"], seed=37, steps=ci["steps"], fitting_only=True, drain=True)
    assert result.status == "found" and result.property == "LIVE-NO-PROGRESS", result.as_dict()
    assert result.as_dict()["reproduced_on_replay"]
    cfg, actions = result.failure.cfg, result.failure.actions
    assert cfg.options.async_scheduling, "found in vLLM's default loop"
    adds = [a for a in actions if isinstance(a, Add)]
    assert not cfg.chunked_prefill and all(a.prompt <= step_budget(cfg) for a in adds), (cfg, adds)
    final = result.replayed.observations[-1].state
    assert VllmTarget.stall_cause(cfg, final) == WEDGE
    assert any(o.record.preempted for o in result.replayed.observations)
    model = replay(ReferenceTarget(cfg), cfg, actions)
    assert model.violation is not None and model.violation.property == "LIVE-NO-PROGRESS"
    assert model.violation.step == result.replayed.violation.step
    _, test = write_report(result, tmp_path)
    spec = importlib.util.spec_from_file_location("generated_vllm_wedge_regression", test)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_reproduces_live_no_progress()


@needs_vllm
@pytest.mark.parametrize("async_scheduling,stuck_at", [(False, 5), (True, 6)], ids=["sync", "async"])
def test_the_shrunk_wedge_and_its_control_on_the_real_scheduler(async_scheduling, stuck_at):
    """The shrunk find on its own (tests/regressions/test_vllm_live_no_progress_seed37.py, found in the synchronous
    loop): two 1-token prompts, 5 tokens each, in 2 usable blocks of 4 with max_num_scheduled_tokens 2; with
    max_num_scheduled_tokens 5 (the replay fits a step) the same actions complete. In vLLM's default loop (async
    scheduling) the same preemption at the fifth call wedges it too, one call later (the preempted request's
    in-flight token lands stale in that call)."""
    from targets import Step
    from targets.vllm_v1 import VllmTarget

    cfg = EngineConfig(policy="vllm_v1", block_size=4, num_blocks=3, max_num_tokens=6, max_batch_size=2,
                       chunked_prefill=False, options=Options(max_model_len=6, max_num_scheduled_tokens=2,
                                                              async_scheduling=async_scheduling))
    actions = [Add(0, 1, 5), Add(1, 1, 5)] + [Step()] * 7
    wedged = replay(VllmTarget(cfg), cfg, actions)
    assert wedged.violation is not None and wedged.violation.property == "LIVE-NO-PROGRESS"
    assert wedged.violation.step == stuck_at
    assert [o.record.preempted for o in wedged.observations][4] == (1,)
    assert VllmTarget.stall_cause(cfg, wedged.observations[-1].state) == WEDGE
    roomy = dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, max_num_scheduled_tokens=5))
    target = VllmTarget(roomy)
    done = replay(target, roomy, actions + [Step()] * 6)
    assert done.violation is None
    assert not target.unanswered()
