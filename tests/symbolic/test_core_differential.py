"""The one differential harness: every policy core (model/symbolic/cores/) held to the
engine-checked policy it re-expresses (model/policies/), by the same checks for all four.

- every bundled scenario: the core accepts its design and equals the simulator on it;
- random runs (`cases/<policy>.py`): simulator and core side by side, every field of every state
  and every step record equal (`checkers.differential.diverges`), and the runs exercise every
  mechanism the policy has (`MUST_SEE`);
- the Z3 relation: every step of random simulator runs satisfies the core's transition relation
  (built once per structure with knobs, workload and pre-state symbolic; evaluated by
  `CompiledRelation`, cross-checked by Z3's own simplifier on the first runs of each structure
  and by the solver on short runs, where a step with one field changed must be refused);
- long cases (8 and 16 requests, batch caps of 8-17): the same field-for-field agreement;
- the core's invariants hold on every state of random core runs;
- decode acceleration: where `decode_guard(s, m)` holds on a reachable state, m single steps are
  pure decode steps that reach `decode_advance(s, m)` (checkers/accel.py proves it for all states).

Policy-specific tests (refusals, a scenario's mechanism, proofs of invariants and acceleration,
searches) stay in tests/symbolic/test_core_<policy>.py.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

import model.policies  # noqa: F401  (registers every policy)
import model.policy
import model.symbolic.cores  # noqa: F401  (registers every core)
from cases import CASES, POLICIES, SCENARIOS_OUTSIDE_THE_CORE, long_case, relation_runs, widest_long_run
from checkers.differential import RelationChecker, diverges
from model.simulator import Workload, simulate
from model.symbolic.core import CORES
from model.symbolic.ops import Concrete
from model.symbolic.run import run_core
from model.symbolic.slots import Knobs, Params, diff
from schedproof.scenario import load
from helpers import sized

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
CONCRETE = Concrete()
BLOCKS = 4              # the random runs of a policy, split over this many tests (xdist spreads them)
CROSS_CHECKED = 3       # runs per structure also evaluated by Z3's simplifier
# The random runs compared: every seed of a policy's DIFF_RUNS in the nightly, every other one in ci, spread over
# each generator's ranges (plain designs, pool pressure, reuse shortfalls, host tiers), and the mechanisms
# (MUST_SEE) must be reached among exactly those; the relation's runs per structure are halved alike. The whole
# sizes took 179 s of the suite's workers in the clean clone of 40d4c59 (2026-12-07).
SEED_STRIDE = sized(ci=2, nightly=1)


def compared_seeds(cases) -> range:
    return range(0, cases.DIFF_RUNS, SEED_STRIDE)


def relation_runs_of(cases) -> int:
    return cases.RELATION_RUNS // SEED_STRIDE


def test_every_policy_has_a_core_and_cases():
    assert set(CORES) == set(POLICIES) == set(model.policy.POLICIES)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_is_in_the_core_and_agrees(path):
    """Every bundled scenario's design is expressed by its core (none is refused, but the few listed in
    cases.SCENARIOS_OUTSIDE_THE_CORE, refused for the field listed), and the core's run equals the simulator's
    field for field."""
    sc = load(path)
    core = CORES[sc.cfg.policy]
    refused = core.unsupported(sc.cfg, Params.of(sc.workload))
    if path.stem in SCENARIOS_OUTSIDE_THE_CORE:
        assert refused is not None and refused[0] == SCENARIOS_OUTSIDE_THE_CORE[path.stem]
        return
    assert refused is None
    assert diverges(sc.cfg, sc.workload, max_steps=20_000) is None


@pytest.mark.parametrize("block", range(BLOCKS))
@pytest.mark.parametrize("policy", POLICIES)
def test_random_runs_agree_field_for_field(policy, block):
    cases = CASES[policy]
    core = CORES[policy]
    for seed in compared_seeds(cases)[block::BLOCKS]:
        cfg, workload = cases.random_case(seed)
        assert core.unsupported(cfg, Params.of(workload)) is None, (seed, cfg)
        d = diverges(cfg, workload, max_steps=cases.MAX_STEPS)
        assert d is None, f"{policy} seed {seed}: {d}\n  {cfg}\n  {workload}"


# Long cases: the random cases draw at most SLOTS (4-5) requests, where a bug that needs a count or a position
# of five or more would not show. These hold 8 and 16 requests with batch caps of 8-17, past every constant the
# cores' step code compares or computes with (checkers/parametric/sealed.py `code_constants`: 16 at most), on
# pools and budgets grown with the count so that many requests run at once.
LONG_COUNTS = (8, 16)
LONG_CASES = 20


@pytest.mark.parametrize("count", LONG_COUNTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_long_workloads_agree_field_for_field(policy, count):
    """... and some step of them schedules five requests or more (not vacuous)."""
    widest = widest_long_run(policy, count, LONG_CASES)
    assert widest >= 5, widest


def test_the_request_counts_the_differential_cases_reach():
    """Every count from 1 to SLOTS among the random cases, and 8 and 16 among the long ones, for every policy."""
    for policy in POLICIES:
        cases = CASES[policy]
        counts = Counter(len(cases.random_case(seed)[1].requests) for seed in range(0, cases.DIFF_RUNS, 3))
        assert set(range(1, cases.SLOTS + 1)) <= set(counts), (policy, counts)
        long = {len(c[1].requests) for c in (long_case(policy, n, s) for n in LONG_COUNTS for s in range(3)) if c}
        assert long == set(LONG_COUNTS), (policy, long)


@pytest.mark.parametrize("policy", POLICIES)
def test_random_runs_reach_every_mechanism(policy):
    """The generator reaches what the policy does (read off the simulator) in the runs compared, so agreement
    is not vacuous."""
    cases = CASES[policy]
    seen: Counter = Counter()
    for seed in compared_seeds(cases):
        cfg, workload = cases.random_case(seed)
        cases.coverage(simulate(cfg, workload, max_steps=cases.MAX_STEPS), seen)
    missing = [what for what in cases.MUST_SEE if seen[what] == 0]
    assert not missing, (missing, seen)


def _structures():
    return [pytest.param(policy, template, id=f"{policy}-{name}")
            for policy in POLICIES for name, template in CASES[policy].structures()]


@pytest.mark.parametrize("policy,template", _structures())
def test_relation_accepts_every_simulator_step(policy, template):
    cases = CASES[policy]
    checker = cases.relation(template, cases.SLOTS)
    rng = random.Random(10_000)
    runs = relation_runs_of(cases)
    traces = relation_runs(checker, lambda: cases.structure_case(template, rng), runs, CROSS_CHECKED,
                           max_steps=min(cases.MAX_STEPS, 200))
    assert sum(len(trace.records) for trace in traces) > 3 * runs


@pytest.mark.parametrize("policy", POLICIES)
def test_the_solver_and_the_evaluators_agree(policy):
    """The solver's own relation check (one query per step) accepts short simulator runs, as the
    compiled relation does; a step with one field changed is refused by all three evaluators."""
    cases = CASES[policy]
    name, template = cases.structures()[0]
    rng = random.Random(3)
    n = 2
    compiled = cases.relation(template, n)
    checked = 0
    while checked < 3:
        cfg, workload = cases.structure_case(template, rng)
        workload = Workload(workload.requests[:n])
        trace = simulate(cfg, workload, max_steps=40)
        if len(trace.records) < 2:
            continue
        trace = dataclasses.replace(trace, states=trace.states[:6], records=trace.records[:5])
        # options concrete as in `cfg` (a core may make numeric options symbolic in `compiled`)
        solver = RelationChecker(CORES[policy], cfg, n)
        assert solver.rejects(cfg, workload, trace) is None, (cfg, workload)
        assert compiled.rejects(cfg, workload, trace) is None
        checked += 1
    # one wrong post-state field: a request one token further
    bad = dataclasses.replace(trace, states=list(trace.states))
    s1 = bad.states[1]
    bad.states[1] = s1.with_request(dataclasses.replace(s1.req(0), computed=s1.req(0).computed + 1))
    assert solver.rejects(cfg, workload, bad) is not None
    assert compiled.rejects(cfg, workload, bad) is not None
    assert not compiled.agrees_with_z3_simplifier(cfg, workload, bad)


@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_hold_on_random_runs(policy):
    """Core.invariants (the shared ones and the core's own) on every state of random core runs;
    checkers/induction.py proves them inductive per space. The context cursor assumes prompts of at
    least one token (induction.workload_constraints), so it is not asked of empty prompts."""
    cases, core = CASES[policy], CORES[policy]
    for seed in range(0, cases.DIFF_RUNS, 7):
        cfg, workload = cases.random_case(seed)
        k, p = Knobs.of(cfg), Params.of(workload)
        empty = {i for i, r in enumerate(workload.requests) if r.prompt == 0}
        for t, s in enumerate(run_core(core, k, p, max_steps=cases.MAX_STEPS).states):
            bad = [name for name, c in core.invariants(CONCRETE, k, p, s).items() if not c
                   and not (name.endswith("context-cursor") and int(name[1:].split(".")[0]) in empty)]
            assert not bad, (seed, t, bad, cfg, workload)


@pytest.mark.parametrize("policy", [p for p in POLICIES if CORES[p].accelerates])
def test_decode_advance_is_m_single_steps(policy):
    """On reachable states: where decode_guard(s, m) holds, m single steps reach
    decode_advance(s, m), each a pure decode step."""
    cases, core = CASES[policy], CORES[policy]
    held = Counter()
    for seed in range(0, cases.DIFF_RUNS, 5):
        cfg, workload = cases.random_case(seed)
        k, p = Knobs.of(cfg), Params.of(workload)
        for s in run_core(core, k, p, max_steps=cases.MAX_STEPS).states[::2]:
            for m in (1, 2, 5):
                if not core.decode_guard(CONCRETE, k, p, s, m):
                    continue
                held[m] += 1
                x = s
                for _ in range(m):
                    x, rec = core.step(CONCRETE, k, p, x)
                    assert not any(rec.flags["preempted"] + rec.flags["finished"] + rec.flags["rejected"])
                assert diff(x, core.decode_advance(CONCRETE, k, p, s, m)) is None, (seed, cfg, workload, m)
    assert min(held.values(), default=0) > 20, held
