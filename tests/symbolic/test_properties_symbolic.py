"""properties/symbolic.py held to properties/registry.py, for every policy core: the symbolic
conditions, evaluated with the Concrete ops on the transitions of random simulator runs
(tests/symbolic/cases/), flag exactly the steps the registry flags (LIVE-NO-PROGRESS: the symbolic
one adds "the environment is quiet", so it implies the registry's and agrees with it once everything
has arrived); and on states broken on purpose (a finished request that keeps its blocks or its
shared prefix references) both flag SAFE-NO-LEAK and SAFE-BLOCKS alike."""

import dataclasses
from collections import Counter

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import CASES, POLICIES
from model.simulator import simulate
from model.symbolic.core import CORES
from model.symbolic.ops import Concrete
from model.symbolic.slots import Knobs, Params, record_of
from properties import REGISTRY
from properties.symbolic import PRIORITY, Transition, quiet, violations

RUNS = 300
OPS = Concrete()


@dataclasses.dataclass
class _Enc:
    knobs: Knobs
    params: Params


@dataclasses.dataclass
class _Unrolling:
    """What `violations` reads from a bmc.Unrolling, for one concrete run."""
    core: object
    enc: _Enc
    states: list
    transitions: list


def _unrolling(cfg, wl, trace):
    core = CORES[cfg.policy]
    n = len(wl.requests)
    states = [core.abstract(cfg, s, n) for s in trace.states]
    transitions = [Transition(t, states[t], states[t + 1], record_of(rec, n), True, 1)
                   for t, rec in enumerate(trace.records)]
    return _Unrolling(core, _Enc(Knobs.of(cfg), Params.of(wl)), states, transitions)


def _registry_flags(cfg, trace, prop_id):
    p = REGISTRY[prop_id]
    return [bool(p.step_check(cfg, prev, rec, cur)) for prev, rec, cur in
            zip(trace.states, trace.records, trace.states[1:])]


def _agree(cfg, wl, trace, seen: Counter, where: str) -> None:
    u = _unrolling(cfg, wl, trace)
    flags = {p: _registry_flags(cfg, trace, p) for p in PRIORITY if REGISTRY[p].step_check}
    for t, tr in enumerate(u.transitions):
        got = {p: bool(c) for p, (c, _) in violations(OPS, u, tr).items()}
        for p, f in flags.items():
            assert got[p] == f[t], f"{where} step {t}: {p} symbolic {got[p]} registry {f[t]}"
            seen[p] += got[p]
        prev, rec, cur = trace.states[t], trace.records[t], trace.states[t + 1]
        registry_stuck = bool([r for r in prev.requests if r.phase.unfinished]) and not rec.scheduled \
            and not rec.error and prev.requests == cur.requests
        if got["LIVE-NO-PROGRESS"]:
            assert registry_stuck, f"{where} step {t}"
        elif registry_stuck and prev.sched == cur.sched:
            # a step that changes the scheduler's own memory is not a fixpoint yet (sglang drops a finished
            # request from its running batch, and may clear its latch, one iteration after it finished)
            assert not quiet(OPS, u.enc.params, u.states[t]), f"{where} step {t}"
        seen["LIVE-NO-PROGRESS"] += got["LIVE-NO-PROGRESS"]


@pytest.mark.parametrize("policy", POLICIES)
def test_conditions_agree_with_the_registry_on_random_runs(policy):
    cases = CASES[policy]
    seen: Counter = Counter()
    for seed in range(RUNS):
        cfg, wl = cases.random_case(seed)
        _agree(cfg, wl, simulate(cfg, wl, max_steps=60), seen, f"{policy} seed {seed}")
    # the runs must have met the interesting cases, or the agreement is vacuous
    assert seen["LIVE-NO-PROGRESS"] + seen["ENGINE-ERROR"] > 0, seen


@pytest.mark.parametrize("policy", POLICIES)
def test_a_leak_is_flagged_by_both(policy):
    """A finished request made to keep a block (and, where the policy shares prefix blocks, a
    shared reference): the registry and the symbolic condition both flag the step."""
    cases = CASES[policy]
    broken = 0
    for seed in range(RUNS):
        cfg, wl = cases.random_case(seed)
        trace = simulate(cfg, wl, max_steps=60)
        t = next((t for t, rec in enumerate(trace.records) if rec.finished), None)
        if t is None:
            continue
        rid = trace.records[t].finished[0]
        post = trace.states[t + 1]
        for leak in ({"blocks": 1}, {"shared_blocks": 1}):
            bad = post.with_request(dataclasses.replace(post.req(rid), **leak))
            if leak == {"blocks": 1}:
                bad = dataclasses.replace(bad, free_blocks=bad.free_blocks - 1)   # still adds up
            elif CORES[policy].shared_blocks(OPS, Knobs.of(cfg), Params.of(wl),
                                             CORES[policy].abstract(cfg, bad, len(wl.requests)), rid) == 0:
                continue   # the core keeps no per-request shared references (no prefix sharing)
            cut = dataclasses.replace(trace, states=trace.states[:t + 1] + [bad], records=trace.records[:t + 1])
            assert REGISTRY["SAFE-NO-LEAK"].step_check(cfg, trace.states[t], trace.records[t], bad)
            u = _unrolling(cfg, wl, cut)
            assert violations(OPS, u, u.transitions[t])["SAFE-NO-LEAK"][0], (policy, seed, leak)
            broken += 1
    assert broken > 10


@pytest.mark.parametrize("policy", POLICIES)
def test_livelock_is_flagged_exactly_where_a_run_ends_in_a_cycle(policy):
    """LIVE-LIVELOCK is the registry's trace property "the run ends in a cycle" (a state repeating
    two or more steps later); the symbolic lasso, on the run's transitions, flags the transition
    that closes the cycle and nothing in a run that ends otherwise: a fixpoint is never a livelock
    (the lasso once closed on it, and `check --property LIVE-LIVELOCK` reported traces that did
    not replay)."""
    cases = CASES[policy]
    ends: Counter = Counter()
    for seed in range(RUNS):
        cfg, wl = cases.random_case(seed)
        trace = simulate(cfg, wl, max_steps=60)
        u = _unrolling(cfg, wl, trace)
        flagged = [t for t, tr in enumerate(u.transitions) if violations(OPS, u, tr)["LIVE-LIVELOCK"][0]]
        ends[trace.end] += 1
        want = [len(trace.records) - 1] if trace.end == "cycle" else []
        assert flagged == want, f"{policy} seed {seed}: ends {trace.end}, flagged at {flagged}"
    assert ends["fixpoint"] > 0, ends
