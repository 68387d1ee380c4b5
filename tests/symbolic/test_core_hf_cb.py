"""The hf_cb core (model/symbolic/cores/hf_cb.py): the seed failures it expresses, what it refuses,
its exact safety-margin test, and its invariants proved inductive. The differential checks against
the engine-checked policy are test_core_differential.py's, with cases/hf_cb.py."""

import dataclasses
import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import hf_cb as cases
from checkers.encode import fresh_params_slots
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from model.config import EngineConfig, build_options
from model.policies.hf_cb import Options
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES
from model.symbolic.cores.hf_cb import MAX_NUM_BLOCKS, margin_threshold
from model.symbolic.run import run_workload
from model.symbolic.slots import Params
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["hf_cb"]


def test_fatal_error_and_cancel_after_soft_reset_are_expressed():
    sc = load(ROOT / "scenarios" / "hf-cb-fatal-request-too-large.toml")
    t = run_workload(sc.cfg, sc.workload)
    assert t.end == "error" and t.records[-1].error_kind == 1   # deadlock: the engine's RuntimeError
    sc = load(ROOT / "scenarios" / "hf-cb-cancel-after-soft-reset.toml")
    t = run_workload(sc.cfg, sc.workload)
    assert t.end == "fixpoint" and t.states[-1].g["block_new"] and t.states[-1].req[0]["wait"] == 0


def test_unsupported():
    opts = build_options(Options, {})
    ok = EngineConfig("hf_cb", 4, 4, 8, 8, chunked_prefill=True, options=opts)
    assert CORE.unsupported(ok) is None
    assert CORE.unsupported(dataclasses.replace(ok, host_blocks=2))[0] == "engine.host_blocks"
    assert CORE.unsupported(dataclasses.replace(ok, block_size=3))[0] == "engine.block_size"
    assert CORE.unsupported(dataclasses.replace(ok, chunked_prefill=False))[0] == "engine.chunked_prefill"
    assert CORE.unsupported(dataclasses.replace(ok, num_blocks=MAX_NUM_BLOCKS + 1))[0] == "engine.num_blocks"
    shared = Workload((RequestSpec(8, 2), RequestSpec(8, 2, prefix_group=0, prefix_len=4)))
    assert CORE.unsupported(ok, Params.of(shared))[0] == "requests.prefix_group"
    assert CORE.unsupported(ok, Params(fresh_params_slots(2))) is None   # symbolic: the checker pins it


def test_margin_threshold_is_the_float_comparison():
    rng = random.Random(0)
    for margin in [m for m in cases.MARGINS if m is not None] + [0.3, 0.7, 0.9, 0.05, 2 / 3, 0.123456789, 1e-9]:
        num, den = margin_threshold(margin)
        assert 0 <= num <= den <= MAX_NUM_BLOCKS
        caps = list(range(1, 130)) + [rng.randint(1, MAX_NUM_BLOCKS) for _ in range(200)] + [MAX_NUM_BLOCKS]
        for cap in caps:
            frees = range(cap + 1) if cap < 130 else [rng.randint(0, cap) for _ in range(50)] + \
                [f for f in (cap * num // den + d for d in (-1, 0, 1)) if 0 <= f <= cap]
            for free in frees:
                assert (free * den >= num * cap) == (free / cap >= margin), (margin, free, cap)


# -- the core's invariants are inductive -------------------------------------------------------

@pytest.mark.parametrize("options", [cases.STRUCTURES[0], cases.STRUCTURES[3]], ids=lambda o: "-".join(map(str, o.values())))
def test_invariants_inductive_two_slots(options):
    """Core.invariants, the core's own included, are inductive over any workload of the subset on
    two slots with every numeric knob a range (induction.check_obligations, as bmc.prove_lemmas)."""
    template = cases.rand_cfg(random.Random(0), options)
    knobs, cons = symbolic_knobs(template, {"block_size": (4, 8), "num_blocks": (1, 8), "max_num_tokens": (1, 16),
                                            "max_batch_size": (1, 8)})
    params = any_params(2)
    cons += workload_constraints(params)
    cons += [c for w in params.slots for c in (w["prefix_group"] == -1, w["prefix_len"] == 0)]
    obligations = check_obligations(CORE, knobs, params, cons, CORE.invariants, timeout=120)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations if o.status != "proved"]
