"""The trtllm_v2 core (model/symbolic/cores/trtllm_v2.py): what it refuses, its invariants proved
inductive, and the soundness of its decode acceleration. The differential checks against the
engine-checked policy are test_core_differential.py's, with cases/trtllm_v2.py."""

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from checkers.accel import prove_acceleration
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options
from model.symbolic.core import CORES

CORE = CORES["trtllm_v2"]


def test_host_tier_is_refused_with_its_field():
    cfg = EngineConfig("trtllm_v2", 4, 8, 16, 4, host_blocks=4, options=Options())
    field, reason = CORE.unsupported(cfg)
    assert field == "engine.host_blocks" and "host_blocks = 0" in reason


@pytest.mark.parametrize("chunked", [False, True])
def test_invariants_are_inductive_for_any_knobs(chunked):
    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, chunked, 0, Options(draft_len=1))
    knobs, cons = symbolic_knobs(cfg, {"num_blocks": (1, None), "max_num_tokens": (1, None),
                                       "max_batch_size": (1, None)})
    params = any_params(3)
    obligations = check_obligations(CORE, knobs, params, cons + workload_constraints(params), CORE.invariants, 120)
    failed = [o.line() for o in obligations if o.status != "proved"]
    assert not failed, failed
    assert {o.action for o in obligations} == {"init", "step", "decode-run"}


def test_decode_acceleration_is_sound():
    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options(draft_len=1, fix_replay_fit=True))
    obligations = prove_acceleration(CORE, cfg, 2, timeout=240)
    assert len(obligations) == 7 and all(o.status == "proved" for o in obligations), [o.line() for o in obligations]


def test_an_unsound_acceleration_is_refused():
    """The proof can fail: a guard that forgets the page budget lets the closed form overdraw the pool."""
    class Careless(type(CORE)):
        def decode_guard(self, ops, k, p, s, n):
            inner = super().decode_guard(ops, k, p, s, n)
            return ops.or_(inner, ops.and_(n >= 1, s.g["free_blocks"] == 0, s.req[0]["phase"] == 3))

    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options())
    obligations = prove_acceleration(Careless(), cfg, 2, timeout=240)
    assert "failed" in [o.status for o in obligations]
