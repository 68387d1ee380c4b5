"""Early stops as an environment action (`Stop`): the model's `Env.stops` on every target that picks the
sampled tokens, vLLM's real scheduler finishing the request through its own `check_stop`, in lockstep with the
`vllm_v1` model; a simulator workload's `output_len` turned into the `Stop` actions that reproduce its run."""

from __future__ import annotations

import importlib.util

import pytest

from model.config import EngineConfig
from model.policies.hf_cb import Options as HfOptions
from model.policies.vllm_v1 import Options
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase
from targets import get_target
from targets.checking import action_code, action_from_code, replay, workload_actions
from targets.protocol import Add, Step, Stop
from targets.reference import ReferenceTarget

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def vcfg(async_scheduling=False, **kw):
    base = dict(policy="vllm_v1", block_size=4, num_blocks=9, max_num_tokens=16, max_batch_size=4,
                chunked_prefill=True, options=Options(max_model_len=32, async_scheduling=async_scheduling))
    base.update(kw)
    return EngineConfig(**base)


def test_a_stop_ends_the_request_at_its_next_sampled_token_in_the_model():
    t = ReferenceTarget(vcfg())
    t.add(Add(0, 10, 8))
    t.stop(0)     # pending through the prefill: the first sampled token ends it
    obs = t.step()
    r = obs.state.req(0)
    assert r.phase == Phase.FINISHED and r.generated == 1 and obs.record.finished == (0,)


def test_with_async_scheduling_a_stop_lands_a_step_late():
    """vLLM's default loop: the prefill's token is processed after the next batch is scheduled, so the request
    is scheduled once more (a decode that is thrown away) and finishes in that call (AS, S `update_from_output`)."""
    t = ReferenceTarget(vcfg(async_scheduling=True))
    t.add(Add(0, 10, 8))
    t.stop(0)
    first, second = t.step(), t.step()
    assert first.record.scheduled == ((0, 10),) and first.record.finished == () and first.state.req(0).generated == 0
    assert second.record.scheduled == ((0, 1),) and second.record.finished == (0,)
    assert second.state.req(0).phase == Phase.FINISHED and second.state.req(0).generated == 1


def test_a_stop_waits_for_a_request_mid_prefill():
    t = ReferenceTarget(vcfg(max_num_tokens=4))
    t.add(Add(0, 10, 8))
    t.step()
    t.stop(0)
    phases = [t.step().state.req(0) for _ in range(2)]
    assert [r.phase for r in phases] == [Phase.PREFILLING, Phase.FINISHED] and phases[-1].generated == 1


def test_stop_prints_and_parses_as_code():
    assert action_from_code(action_code(Stop(3))) == Stop(3)


def test_workload_actions_place_the_stops_where_the_simulator_ends_the_requests():
    cfg = vcfg(max_num_tokens=8)
    workload = Workload((RequestSpec(12, 10, output_len=3), RequestSpec(5, 6, arrival=1, output_len=1),
                         RequestSpec(4, 4, arrival=2)))
    trace = simulate(cfg, workload, max_steps=100)
    steps = len(trace.records)
    with pytest.raises(ValueError, match="r0 stops early"):
        workload_actions(workload, steps)
    actions = workload_actions(workload, steps, cfg)
    assert sum(isinstance(a, Stop) for a in actions) == 2
    res = replay(ReferenceTarget(cfg), cfg, actions)
    assert res.violation is None
    # the simulator's states hold every request from step 0 (PENDING until it arrives), a target's only those
    # submitted: compare what ran and how each request ended
    assert [(o.record.scheduled, o.record.finished) for o in res.observations] == \
        [(rec.scheduled, rec.finished) for rec in trace.records]
    assert res.observations[-1].state.requests == trace.final.requests
    assert [r.generated for r in trace.final.requests] == [3, 1, 4]


def test_a_target_that_picks_no_tokens_refuses_a_stop():
    pytest.importorskip("transformers")
    cls = get_target("transformers")
    assert not cls.early_stops
    cfg = EngineConfig(policy="hf_cb", block_size=4, num_blocks=8, max_num_tokens=16, max_batch_size=4,
                       chunked_prefill=True, options=HfOptions())
    t = cls(cfg)
    try:
        with pytest.raises(NotImplementedError, match="cannot stop a request early"):
            t.stop(0)
    finally:
        t.close()


@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed")
def test_vllm_finishes_a_stopped_request_through_its_own_check_stop_in_lockstep():
    from targets.vllm_v1 import STOP_TOKEN, VllmTarget

    t = VllmTarget(vcfg(max_num_tokens=8))
    try:
        actions = [Add(0, 12, 10), Add(1, 6, 10), Step(), Stop(0), Stop(1), Step(), Step(), Step(), Step()]
        res = replay(t, t.cfg, actions)
        assert res.violation is None, res.violation       # the model agreed at every step
        last = res.observations[-1].state
        assert [(r.phase, r.generated) for r in last.requests] == [(Phase.FINISHED, 1), (Phase.FINISHED, 1)]   # neither had sampled before its stop
        outputs = {rid: toks for o in res.observations for rid, toks in o.outputs.items()}
        assert outputs[0][-1] == STOP_TOKEN and outputs[1][-1] == STOP_TOKEN
        assert str(t.reqs[0].status).endswith("FINISHED_STOPPED")
    finally:
        t.close()
