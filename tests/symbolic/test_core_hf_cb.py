"""The hf_cb core (model/symbolic/cores/hf_cb.py) held to the engine-checked policy
(model/policies/hf_cb.py): the scenario files, random differential runs (every field of every state
and step record), and the core's Z3 transition relation on every step of random simulator runs."""

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from model.config import EngineConfig, build_options
from model.policies.hf_cb import Options
from model.simulator import RequestSpec, Workload, simulate
from model.symbolic.core import CORES
from model.symbolic.cores.hf_cb import MAX_NUM_BLOCKS, margin_threshold
from checkers.differential import CompiledRelation, RelationChecker, diverges
from checkers.encode import fresh_params_slots
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from model.symbolic.ops import Concrete
from model.symbolic.slots import Knobs, Params
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["hf_cb"]
CONCRETE = Concrete()
SCENARIOS = sorted((ROOT / "scenarios").glob("hf-cb-*.toml"))
MUST_AGREE = ("hf-cb-fatal-request-too-large", "hf-cb-overflow-soft-reset", "hf-cb-cancel-after-soft-reset")
MARGINS = [None, None, 0.0, 0.1, 0.15, 0.2, 0.25, 1 / 3, 0.5, 0.75, 1.0]


# -- random configurations and workloads inside the subset ------------------------------------

def rand_options(rng: random.Random) -> dict:
    o = {"scheduler_type": rng.choice(["fifo", "prefill_first"]),
         "allow_block_sharing": rng.random() < 0.7}
    margin = rng.choice(MARGINS)
    if margin is not None:
        o["safety_margin"] = margin
    return o


def rand_cfg(rng: random.Random, options: dict) -> EngineConfig:
    return EngineConfig("hf_cb", rng.choice([4, 4, 5, 8]), rng.randint(1, 10), rng.randint(1, 12),
                        rng.randint(1, 5), chunked_prefill=True, chunk_unit=rng.choice([0, 1]),
                        options=build_options(Options, options))


def rand_workload(rng: random.Random, most: int = 5, prompt: int = 20, new: int = 12) -> Workload:
    reqs = []
    for _ in range(rng.randint(1, most)):
        p = 0 if rng.random() < 0.05 else rng.randint(1, prompt)   # empty prompts: the crash rule
        max_new = rng.randint(1, new)
        output_len = rng.randint(1, max_new) if rng.random() < 0.25 else None
        cancel_at = rng.randint(0, 15) if rng.random() < 0.2 else None
        reqs.append(RequestSpec(p, max_new, rng.randint(0, 5), output_len, cancel_at))
    return Workload(tuple(reqs))


def coverage(trace, seen: Counter) -> None:
    for rec in trace.records:
        seen["soft reset"] += bool(rec.preempted)
        seen["soft reset, then a batch"] += bool(rec.preempted and rec.scheduled)
        seen[f"error {rec.error_kind}"] += rec.error_kind is not None
        seen["evicted"] += any("evicted" in n for n in rec.notes)
        seen["idle"] += any("idle" in n for n in rec.notes)
        seen["cancel"] += any("cancelled" in n for n in rec.notes)
    seen["block_new at the end"] += bool(trace.final.sched.block_new) and trace.end != "error"


# -- scenarios and the subset -----------------------------------------------------------------

@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenarios_agree(path):
    sc = load(path)
    refused = CORE.unsupported(sc.cfg, Params.of(sc.workload))
    if refused:
        assert path.stem not in MUST_AGREE
        assert refused[0] == "requests.prefix_group"
        return
    assert diverges(sc.cfg, sc.workload) is None


def test_scenarios_in_subset():
    assert {p.stem for p in SCENARIOS} >= set(MUST_AGREE)
    for name in MUST_AGREE:
        sc = load(ROOT / "scenarios" / f"{name}.toml")
        assert CORE.unsupported(sc.cfg, Params.of(sc.workload)) is None


def test_fatal_error_and_cancel_after_soft_reset_are_expressed():
    sc = load(ROOT / "scenarios" / "hf-cb-fatal-request-too-large.toml")
    from model.symbolic.run import run_workload
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
    for margin in [m for m in MARGINS if m is not None] + [0.3, 0.7, 0.9, 0.05, 2 / 3, 0.123456789, 1e-9]:
        num, den = margin_threshold(margin)
        assert 0 <= num <= den <= MAX_NUM_BLOCKS
        caps = list(range(1, 130)) + [rng.randint(1, MAX_NUM_BLOCKS) for _ in range(200)] + [MAX_NUM_BLOCKS]
        for cap in caps:
            frees = range(cap + 1) if cap < 130 else [rng.randint(0, cap) for _ in range(50)] + \
                [f for f in (cap * num // den + d for d in (-1, 0, 1)) if 0 <= f <= cap]
            for free in frees:
                assert (free * den >= num * cap) == (free / cap >= margin), (margin, free, cap)


def invariants_broken(cfg, workload, trace) -> list:
    """The invariants (Core.invariants, the core's own included) that a simulated state breaks; the
    shared ones assume prompts of at least one token, as induction.workload_constraints does."""
    k, p, n = Knobs.of(cfg), Params.of(workload), len(workload.requests)
    empty_prompt = any(s.prompt == 0 for s in workload.requests)
    out = []
    for t, state in enumerate(trace.states):
        inv = CORE.invariants(CONCRETE, k, p, CORE.abstract(cfg, state, n))
        out += [(t, name) for name, ok in inv.items()
                if not ok and not (empty_prompt and name.endswith("context-cursor"))]
    return out


# -- random differential runs -----------------------------------------------------------------

DIFF_RUNS = 1000


def test_random_differential():
    seen = Counter()
    for seed in range(DIFF_RUNS):
        rng = random.Random(seed)
        cfg = rand_cfg(rng, rand_options(rng))
        workload = rand_workload(rng)
        d = diverges(cfg, workload)
        assert d is None, f"seed {seed}: {cfg}\n{workload}\n{d}"
        trace = simulate(cfg, workload)
        coverage(trace, seen)
        broken = invariants_broken(cfg, workload, trace)
        assert not broken, f"seed {seed}: {cfg}\n{workload}\n{broken}"
    for what in ("soft reset", "soft reset, then a batch", "error deadlock", "error crash", "evicted", "idle",
                 "cancel", "block_new at the end"):
        assert seen[what] > 0, (what, seen)


# -- the Z3 relation ------------------------------------------------------------------------

STRUCTURES = [
    {"scheduler_type": "fifo"},
    {"scheduler_type": "fifo", "safety_margin": 1 / 3, "allow_block_sharing": False},
    {"scheduler_type": "prefill_first"},
    {"scheduler_type": "prefill_first", "safety_margin": 0.5, "allow_block_sharing": True},
]
RELATION_RUNS = 260   # per structure
SLOTS = 5


@pytest.mark.parametrize("options", STRUCTURES, ids=lambda o: "-".join(map(str, o.values())))
def test_relation_accepts_random_runs(options):
    template = rand_cfg(random.Random(0), options)
    checker = CompiledRelation(CORE, template, SLOTS)
    for seed in range(RELATION_RUNS):
        rng = random.Random(seed)
        cfg = rand_cfg(rng, options)
        workload = rand_workload(rng, most=SLOTS)
        trace = simulate(cfg, workload)
        r = checker.rejects(cfg, workload, trace)
        assert r is None, f"seed {seed}: {cfg}\n{workload}\n{r}"


def test_compiled_relation_matches_the_solver():
    """RelationChecker's own solver check on short runs (two slots) and on the cancel scenario, and
    the compiled relation agrees with it, also on a step it must refuse."""
    options = {"scheduler_type": "fifo"}
    template = rand_cfg(random.Random(0), options)
    solver, compiled = RelationChecker(CORE, template, 2), CompiledRelation(CORE, template, 2)
    for seed in range(4):
        rng = random.Random(seed)
        cfg = rand_cfg(rng, options)
        workload = rand_workload(rng, most=2, prompt=8, new=3)
        trace = simulate(cfg, workload)
        assert solver.rejects(cfg, workload, trace) is None
        assert compiled.rejects(cfg, workload, trace) is None
    sc = load(ROOT / "scenarios" / "hf-cb-cancel-after-soft-reset.toml")
    trace = simulate(sc.cfg, sc.workload)
    assert solver.rejects(sc.cfg, sc.workload, trace) is None
    assert compiled.rejects(sc.cfg, sc.workload, trace) is None
    # a wrong post-state (r0 one token further) is refused by both
    bad = dataclasses.replace(trace, states=list(trace.states))
    s1 = bad.states[1]
    bad.states[1] = s1.with_request(dataclasses.replace(s1.req(0), computed=s1.req(0).computed + 1))
    assert solver.rejects(sc.cfg, sc.workload, bad) is not None
    assert compiled.rejects(sc.cfg, sc.workload, bad) is not None


# -- the core's invariants are inductive -------------------------------------------------------

@pytest.mark.parametrize("options", [STRUCTURES[0], STRUCTURES[3]], ids=lambda o: "-".join(map(str, o.values())))
def test_invariants_inductive_two_slots(options):
    """Core.invariants, the core's own included, are inductive over any workload of the subset on
    two slots with every numeric knob a range (induction.check_obligations, as bmc.prove_lemmas)."""
    template = rand_cfg(random.Random(0), options)
    knobs, cons = symbolic_knobs(template, {"block_size": (4, 8), "num_blocks": (1, 8), "max_num_tokens": (1, 16),
                                            "max_batch_size": (1, 8)})
    params = any_params(2)
    cons += workload_constraints(params)
    cons += [c for w in params.slots for c in (w["prefix_group"] == -1, w["prefix_len"] == 0)]
    obligations = check_obligations(CORE, knobs, params, cons, CORE.invariants, timeout=120)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations if o.status != "proved"]
