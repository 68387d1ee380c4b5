"""The hf_cb core (model/symbolic/cores/hf_cb.py): the seed failures it expresses, shared prefixes
(the scenarios, and the policy's per-block reference counts rebuilt from the core's slots), what it
refuses, its exact safety-margin test, its invariants proved inductive, and its decode acceleration
proved sound (with a careless guard whose proof fails). The differential checks against the
engine-checked policy are test_core_differential.py's, with cases/hf_cb.py."""

import dataclasses
import random
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import hf_cb as cases
from checkers.accel import ANY_KNOBS, prove_acceleration
from checkers.bmc import search
from checkers.differential import diverges
from checkers.encode import fresh_params_slots
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from checkers.replay import replay
from model.config import EngineConfig, build_options
from model.policies.hf_cb import ANON, ERROR, Options
from model.simulator import RequestSpec, Workload, simulate
from model.state import PrefixEntry
from model.symbolic.core import CORES
from model.symbolic.cores.hf_cb import MAX_NUM_BLOCKS, margin_threshold
from model.symbolic.run import run_workload
from model.symbolic.slots import Params
from schedproof.checkspec import load_check
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
    assert CORE.unsupported(ok, Params.of(shared)) is None
    assert CORE.unsupported(ok, Params(fresh_params_slots(2))) is None


# -- shared prefixes ------------------------------------------------------------------------------

def test_shared_prefix_scenarios_are_expressed():
    """Both shared-prefix scenarios are in the core and equal the simulator; on the one whose offload
    frees nothing, the core's own run has the engine's free blocks per step (transformers 5.19.0, in the
    scenario's description) and r2's soft reset at step 3 returns no block."""
    for name in ("hf-cb-shared-prefix", "hf-cb-shared-prefix-offload-frees-nothing"):
        sc = load(ROOT / "scenarios" / f"{name}.toml")
        assert CORE.unsupported(sc.cfg, Params.of(sc.workload)) is None
        assert diverges(sc.cfg, sc.workload) is None
    t = run_workload(sc.cfg, sc.workload)
    assert [s.g["free_blocks"] for s in t.states[1:]] == [2, 2, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 2]
    assert [i for i, f in enumerate(t.records[3].flags["preempted"]) if f] == [2]
    before, after = t.states[3], t.states[4]
    assert before.req[2]["phase"] == 0 and after.req[2]["shared_blocks"] == 0   # arrived, matched, reset
    assert after.req[0]["pc_blocks"] == 2 and after.g["block_new"]
    assert t.end == "done"


def rebuilt_cache(workload, s):
    """`Sched.slots` and the group `PrefixEntry`s as the policy keeps them, from a core state alone: a
    group's blocks 0 .. E - 1 (E in its home slot), block i counted by the members referencing more than
    i blocks; the anonymous entry from `cached`."""
    slots, entries = [], []
    for h, r in enumerate(s.req):
        if r["pc_blocks"]:
            group = workload.requests[h].prefix_group
            held = [s.req[j]["shared_blocks"] for j, w in enumerate(workload.requests) if w.prefix_group == group]
            slots.append((group, tuple(sum(1 for u in held if u > b) for b in range(r["pc_blocks"]))))
            entries.append(PrefixEntry(group, r["pc_blocks"], sum(1 for u in held if u > 0)))
    if s.g["cached"]:
        entries.append(PrefixEntry(ANON, s.g["cached"], 0))
    return tuple(sorted(slots)), sorted(entries, key=lambda e: e.group)


def test_the_policy_prefix_cache_is_a_function_of_the_slots():
    """The core keeps one number per group (its existing prefix blocks) where the policy keeps a
    reference count per block: on every state of random runs, rebuilding the policy's counts and
    entries from the core's state gives the simulator's own (so the differential test, which compares
    slots, compares the whole prefix cache)."""
    compared = 0
    for seed in range(0, cases.DIFF_RUNS, 2):
        cfg, workload = cases.random_case(seed)
        sim = simulate(cfg, workload, max_steps=cases.MAX_STEPS)
        core = run_workload(cfg, workload, max_steps=cases.MAX_STEPS)
        assert len(sim.states) == len(core.states), seed
        for st, s in zip(sim.states, core.states):
            slots, entries = rebuilt_cache(workload, s)
            assert slots == st.sched.slots, (seed, st.step)
            assert entries == sorted(st.prefix_cache, key=lambda e: e.group), (seed, st.step)
            compared += bool(slots)
    assert compared > 1000


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
    params = any_params(2)   # prefix groups and lengths free
    cons += workload_constraints(params)
    obligations = check_obligations(CORE, knobs, params, cons, CORE.invariants, timeout=300, batch=True)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations if o.status != "proved"]
    assert {o.action for o in obligations} == {"init", "step", "decode-run"}


# -- decode acceleration ---------------------------------------------------------------------------

@pytest.mark.parametrize("options", [cases.STRUCTURES[0], cases.STRUCTURES[3]],
                         ids=lambda o: "-".join(map(str, o.values())))
def test_decode_acceleration_is_sound(options):
    """The 7 obligations of checkers/accel.py, 2 slots, every knob symbolic, any workload (prefix
    groups included)."""
    obligations = prove_acceleration(CORE, cases.rand_cfg(random.Random(0), options), 2, timeout=300)
    assert len(obligations) == 7 and all(o.status == "proved" for o in obligations), [o.line() for o in obligations]


class _Careless(type(CORE)):
    """A guard that forgets that a waiting request reached after the decoders may match its group's
    prefix: the match moves it into active_requests even when its allocation then fails."""

    def left_waiting(self, ops, k, p, s, i, budget):
        r = s.req[i]
        context = p.slots[i]["prompt"] + r["generated"]
        chunk = ops.min(context - r["computed"], budget)
        need = k.blocks_for(ops, r["computed"] + chunk) - r["blocks"] - r["shared_blocks"]
        return ops.implies(r["wait"] >= 0, need > s.g["free_blocks"])


def test_a_careless_acceleration_is_refused():
    """The proof can fail: with the careless guard, one step is not the closed form (a concrete block
    size and exact page counts keep this refutation quick)."""
    template = cases.rand_cfg(random.Random(0), cases.STRUCTURES[0])
    bounds = {k: v for k, v in ANY_KNOBS.items() if k != "block_size"}
    obligations = prove_acceleration(_Careless(), template, 2, timeout=300, knob_bounds=bounds, pages="exact")
    assert [o.status for o in obligations if o.action == "one-step"] == ["failed", "failed"]
    assert all(o.status == "proved" for o in obligations if o.action != "one-step")


# -- seed failure 1 through a shared prefix, from ranges ------------------------------------------

def test_shared_prefix_failure_is_found_from_ranges():
    """`schedproof check scenarios/check/hf-cb-shared-prefix-ranges.toml` (its search, as `check` runs
    it): the fatal RuntimeError, replayed in the simulator; on the way, the second request of the group
    matched r0's prefix, was starved and soft reset holding only prefix blocks, freeing nothing (the
    file's description says why every fatal run of that space goes this way). About 30 CPU seconds,
    most of them proving the invariants and the acceleration for the space."""
    spec = load_check(str(ROOT / "scenarios" / "check" / "hf-cb-shared-prefix-ranges.toml"))
    result = search(CORE, spec.space, spec.max_depth, timeout=600, properties=list(spec.properties))
    assert result.status == "violated" and result.cex.property == "ENGINE-ERROR", (result.status, result.reason)
    assert result.scope == ""                          # shortest in the whole space
    rep = replay(result.cex)
    assert rep.ok, rep.message
    trace = rep.trace
    assert trace.end == "error" and trace.records[-1].error == ERROR
    frees_nothing = [rec.step for prev, rec, cur in zip(trace.states, trace.records, trace.states[1:])
                     if 1 in rec.preempted and "r1 prefix match: 2 shared block(s)" in rec.notes
                     and any(e.group == 0 and e.blocks == 2 for e in cur.prefix_cache)]   # the prefix kept
    assert len(frees_nothing) == 1 and frees_nothing[0] < trace.records[-1].step
