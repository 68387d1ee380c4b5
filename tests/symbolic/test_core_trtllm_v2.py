"""The trtllm_v2 core (model/symbolic/cores/trtllm_v2.py): what it refuses, its invariants proved
inductive, and the soundness of its decode acceleration. The differential checks against the
engine-checked policy are test_core_differential.py's, with cases/trtllm_v2.py."""

from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from checkers.accel import ANY_KNOBS, prove_acceleration
from checkers.bmc import search
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from checkers.replay import replay
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options as V2Options
from model.state import Phase
from model.symbolic.core import CORES
from schedproof.checkspec import load_check


def Options(**options) -> V2Options:
    """_executor_loop (disable_overlap_scheduler), where these tests were written; the core's overlap loop:
    test_core_trtllm_overlap.py."""
    return V2Options(**{"disable_overlap_scheduler": True, **options})


ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["trtllm_v2"]


def test_both_executor_loops_are_in_the_core():
    """TensorRT-LLM's default loop, _executor_loop_overlap, and _executor_loop (disable_overlap_scheduler) are both
    expressed (the overlap loop's tests: test_core_trtllm_overlap.py)."""
    assert CORE.unsupported(EngineConfig("trtllm_v2", 4, 8, 16, 4, options=V2Options())) is None
    assert CORE.unsupported(EngineConfig("trtllm_v2", 4, 8, 16, 4, options=Options())) is None


def test_a_host_tier_is_in_the_core_and_fix_b_with_it_is_refused_as_the_policy_does():
    cfg = EngineConfig("trtllm_v2", 4, 8, 16, 4, host_blocks=4, options=Options())
    assert CORE.unsupported(cfg) is None
    with_b = EngineConfig("trtllm_v2", 4, 8, 16, 4, host_blocks=4, options=Options(fix_worst_case_admission=True))
    field, reason = CORE.unsupported(with_b)
    assert field == "engine.options.fix_worst_case_admission" and "host_blocks = 0" in reason


# host_blocks: the number 0 (the GPU-only form of the core) or any number >= 0 (the host-tier form,
# can_evict a term). The host-tier obligations take about a minute each on one core.
@pytest.mark.parametrize("host", ["none", "any"])
@pytest.mark.parametrize("chunked", [False, True])
def test_invariants_are_inductive_for_any_knobs(chunked, host):
    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, chunked, 0, Options(draft_len=1))
    bounds = {"num_blocks": (1, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)}
    if host == "any":
        bounds["host_blocks"] = (0, None)
    knobs, cons = symbolic_knobs(cfg, bounds)
    params = any_params(3)
    obligations = check_obligations(CORE, knobs, params, cons + workload_constraints(params), CORE.invariants,
                                    120 if host == "none" else 600)
    failed = [o.line() for o in obligations if o.status != "proved"]
    assert not failed, failed
    assert {o.action for o in obligations} == {"init", "step", "decode-run"}
    assert any(name.endswith("host-pages-are-suspended") for name in {o.invariant for o in obligations}) \
        == (host == "any")


def test_decode_acceleration_is_sound():
    """Every knob symbolic, host_blocks included (accel.ANY_KNOBS: 0 or more)."""
    assert ANY_KNOBS["host_blocks"] == (0, None)
    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options(draft_len=1, fix_replay_fit=True))
    obligations = prove_acceleration(CORE, cfg, 2, timeout=240)
    assert len(obligations) == 7 and all(o.status == "proved" for o in obligations), [o.line() for o in obligations]


def test_decode_acceleration_is_sound_with_a_host_tier():
    """3 slots, at least one host block (can_evict holds), every other knob symbolic."""
    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options(draft_len=1, fix_replay_fit=True))
    obligations = prove_acceleration(CORE, cfg, 3, timeout=240,
                                     knob_bounds={**ANY_KNOBS, "host_blocks": (1, None)})
    assert len(obligations) == 7 and all(o.status == "proved" for o in obligations), [o.line() for o in obligations]


def test_a_guard_that_lets_a_suspended_request_resume_is_refused():
    """With a host tier a suspended decoder resumes (its host pages come back, or the gate refuses
    it) and may suspend itself again: never a pure decode step. A guard that forgets that the
    decoders of a run are active is refused by the proof."""
    class Forgetful(type(CORE)):
        def decode_guard(self, ops, k, p, s, n):
            active = s.copy()
            for r in active.req:
                r["suspended"] = False
                r["host_blocks"] = 0
            return super().decode_guard(ops, k, p, active, n)

    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options(draft_len=1, fix_replay_fit=True))
    obligations = prove_acceleration(Forgetful(), cfg, 2, timeout=240,
                                     knob_bounds={**ANY_KNOBS, "host_blocks": (1, None)})
    assert "failed" in [o.status for o in obligations]


def test_an_unsound_acceleration_is_refused():
    """The proof can fail: a guard that forgets the page budget lets the closed form overdraw the pool."""
    class Careless(type(CORE)):
        def decode_guard(self, ops, k, p, s, n):
            inner = super().decode_guard(ops, k, p, s, n)
            return ops.or_(inner, ops.and_(n >= 1, s.g["free_blocks"] == 0, s.req[0]["phase"] == 3))

    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options())
    obligations = prove_acceleration(Careless(), cfg, 2, timeout=240)
    assert "failed" in [o.status for o in obligations]


# -- B12 (a host tier too small for the suspended pages) from ranges ------------------------------

def test_small_host_tier_failure_is_found_from_ranges():
    """The search `schedproof check scenarios/check/trtllm-v2-host-tier-small-ranges.toml` runs (the small
    variant of trtllm-v2-host-tier-ranges.toml, whose real sizes take far longer: docs/symbolic.md): the
    failure class of scenario trtllm-v2-small-host-tier. Replayed in the simulator: a host tier is there,
    a request is suspended with more pages than the host tier has free (they stay on the GPU), the ladder
    recompute-pauses it, and its replay (prompt + generated) no longer fits max_num_tokens, so it is never
    scheduled again. About 25 CPU seconds."""
    spec = load_check(str(ROOT / "scenarios" / "check" / "trtllm-v2-host-tier-small-ranges.toml"))
    result = search(CORE, spec.space, spec.max_depth, timeout=600, properties=list(spec.properties))
    assert result.status == "violated" and result.cex.property == "LIVE-NO-PROGRESS", (result.status, result.reason)
    rep = replay(result.cex)
    assert rep.ok, rep.message
    trace = rep.trace
    cfg = trace.cfg
    assert cfg.host_blocks >= 1 and not cfg.chunked_prefill
    stuck = trace.states[result.cex.steps - 1]    # before the no-progress step
    paused = [r for r in stuck.requests if r.phase == Phase.PREEMPTED and r.context_len > cfg.max_num_tokens]
    assert paused, stuck
    rid = paused[0].rid
    # paused at a step where its pages did not fit the host tier's free blocks, so suspending it
    # freed nothing (the record lists it as preempted only once the same pass pauses it)
    paused_at = [t for t, rec in enumerate(trace.records) if rid in rec.preempted]
    kept_on_gpu = [t for t in paused_at if trace.states[t].req(rid).blocks > trace.states[t].free_host_blocks]
    assert kept_on_gpu, paused_at
