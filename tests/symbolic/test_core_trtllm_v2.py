"""The trtllm_v2 core (model/symbolic/cores/trtllm_v2.py) held to the engine-checked policy
(model/policies/trtllm_v2.py): scenario files, random differential runs (every field of every state
and step record), the Z3 relation on every step of random simulator runs, its invariants, and the
soundness of its decode acceleration."""

import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options
from model.simulator import RequestSpec, Workload, simulate
from checkers.accel import prove_acceleration
from model.symbolic.core import CORES
from checkers.differential import CompiledRelation, RelationChecker, diverges
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["trtllm_v2"]
SCENARIOS = sorted((ROOT / "scenarios").glob("trtllm-v2-*.toml"))
N_RUNS = 1000


def rand_options(rng: random.Random) -> Options:
    return Options(draft_len=rng.choice([0, 0, 1, 2]), enable_recompute_pause=rng.random() < 0.85,
                   fix_replay_fit=rng.random() < 0.4, fix_worst_case_admission=rng.random() < 0.4,
                   max_util_for_resume=rng.choice([0.95, 1.0, 0.8, 0.5]), stall_limit=rng.choice([1, 2, 3, 1000]))


def rand_cfg(rng: random.Random, options: Options, chunked: bool) -> EngineConfig:
    return EngineConfig("trtllm_v2", block_size=rng.choice([1, 2, 4]), num_blocks=rng.randint(1, 10),
                        max_num_tokens=rng.randint(1, 16), max_batch_size=rng.randint(1, 4), host_blocks=0,
                        chunked_prefill=chunked, chunk_unit=rng.choice([0, 0, 1, 2]) if chunked else 0,
                        options=options)


def rand_workload(rng: random.Random) -> Workload:
    reqs = []
    for _ in range(rng.randint(1, 5)):
        max_new = rng.randint(1, 12)
        reqs.append(RequestSpec(prompt=rng.randint(1, 14), max_new=max_new, arrival=rng.randint(0, 5),
                                output_len=rng.choice([None, None, rng.randint(1, max_new)]),
                                cancel_at=rng.choice([None] * 4 + [rng.randint(0, 12)])))
    return Workload(tuple(reqs))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenarios_agree(path):
    sc = load(path)
    if CORE.unsupported(sc.cfg):
        assert sc.cfg.host_blocks > 0   # the only thing the core refuses
        return
    assert diverges(sc.cfg, sc.workload, max_steps=20_000) is None


def test_host_tier_is_refused_with_its_field():
    cfg = EngineConfig("trtllm_v2", 4, 8, 16, 4, host_blocks=4, options=Options())
    field, reason = CORE.unsupported(cfg)
    assert field == "engine.host_blocks" and "host_blocks = 0" in reason


@pytest.mark.parametrize("seed", range(4))
def test_random_runs_agree_field_for_field(seed):
    rng = random.Random(seed)
    for case in range(N_RUNS // 4):
        cfg = rand_cfg(rng, rand_options(rng), rng.random() < 0.4)
        wl = rand_workload(rng)
        d = diverges(cfg, wl)
        assert d is None, f"seed {seed} case {case}: {d}\n{cfg}\n{wl}"


def test_relation_accepts_every_simulator_step():
    """1000 random simulator runs; the relation is built once per structure (4 options x chunking)."""
    rng = random.Random(7)
    structures = [(rand_options(rng), chunked, unit) for chunked, unit in
                  ((False, 0), (True, 0), (True, 2)) for _ in range(2)]
    checkers = {}
    steps = 0
    for case in range(N_RUNS):
        options, chunked, unit = structures[case % len(structures)]
        cfg = rand_cfg(rng, options, chunked)
        cfg = EngineConfig(**{**cfg.__dict__, "chunk_unit": unit})
        key = (options, chunked, unit)
        if key not in checkers:
            checkers[key] = CompiledRelation(CORE, cfg, 5)
        wl = rand_workload(rng)
        trace = simulate(cfg, wl, max_steps=200)
        steps += len(trace.records)
        refused = checkers[key].rejects(cfg, wl, trace)
        assert refused is None, f"case {case}: {refused}\n{cfg}\n{wl}"
    assert steps > 5 * N_RUNS


def test_compiled_relation_agrees_with_the_solver():
    """The solver's own check on a few runs, and a step both must refuse."""
    import dataclasses
    rng = random.Random(3)
    options = Options(draft_len=1)
    template = rand_cfg(rng, options, False)
    solver, compiled = RelationChecker(CORE, template, 3), CompiledRelation(CORE, template, 3)
    for _ in range(3):
        cfg = rand_cfg(rng, options, False)
        wl = Workload(rand_workload(rng).requests[:3])
        trace = simulate(cfg, wl, max_steps=30)
        assert solver.rejects(cfg, wl, trace) is None
        assert compiled.rejects(cfg, wl, trace) is None
    bad = dataclasses.replace(trace, states=list(trace.states))
    s1 = bad.states[1]
    bad.states[1] = dataclasses.replace(s1, free_blocks=s1.free_blocks + 1)
    assert solver.rejects(cfg, wl, bad) is not None
    assert compiled.rejects(cfg, wl, bad) is not None


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
