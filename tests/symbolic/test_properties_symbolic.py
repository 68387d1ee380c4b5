"""properties/symbolic.py held to properties/registry.py: the symbolic conditions, evaluated with
the Concrete ops on the transitions of random simulator runs, flag exactly the steps the registry
flags (LIVE-NO-PROGRESS: the symbolic one adds "the environment is quiet", so it implies the
registry's and agrees with it once everything has arrived)."""

import dataclasses
import random

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options
from model.simulator import RequestSpec, Workload, simulate
from model.symbolic.core import CORES
from model.symbolic.ops import Concrete
from model.symbolic.slots import Knobs, Params, record_of
from properties import REGISTRY
from properties.symbolic import PRIORITY, Transition, quiet, violations

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


def test_conditions_agree_with_the_registry_on_random_runs():
    rng = random.Random(11)
    seen = {p: 0 for p in PRIORITY}
    for case in range(300):
        cfg = EngineConfig("trtllm_v2", rng.choice([1, 2, 4]), rng.randint(1, 10), rng.randint(1, 16),
                           rng.randint(1, 4), 0, rng.random() < 0.3, 0,
                           Options(stall_limit=rng.choice([2, 5, 1000]), max_util_for_resume=rng.choice([0.95, 1.0]),
                                   fix_replay_fit=rng.random() < 0.3))
        reqs = []
        for _ in range(rng.randint(1, 4)):
            mx = rng.randint(1, 10)
            reqs.append(RequestSpec(rng.randint(1, 14), mx, rng.randint(0, 3),
                                    cancel_at=rng.choice([None, None, rng.randint(3, 9)])))
        wl = Workload(tuple(reqs))
        trace = simulate(cfg, wl, max_steps=60)
        u = _unrolling(cfg, wl, trace)
        flags = {p: _registry_flags(cfg, trace, p) for p in PRIORITY if REGISTRY[p].step_check}
        for t, tr in enumerate(u.transitions):
            got = {p: bool(c) for p, (c, _) in violations(OPS, u, tr).items()}
            for p, f in flags.items():
                assert got[p] == f[t], f"case {case} step {t}: {p} symbolic {got[p]} registry {f[t]}"
                seen[p] += got[p]
            prev, rec, cur = trace.states[t], trace.records[t], trace.states[t + 1]
            registry_stuck = bool([r for r in prev.requests if r.phase.unfinished]) and not rec.scheduled \
                and not rec.error and prev.requests == cur.requests
            if got["LIVE-NO-PROGRESS"]:
                assert registry_stuck, f"case {case} step {t}"
            elif registry_stuck:
                assert not quiet(OPS, u.enc.params, u.states[t]), f"case {case} step {t}"
            seen["LIVE-NO-PROGRESS"] += got["LIVE-NO-PROGRESS"]
    # the search must have met the interesting cases, or the agreement is vacuous
    assert seen["LIVE-NO-PROGRESS"] > 0 and seen["ENGINE-ERROR"] > 0
