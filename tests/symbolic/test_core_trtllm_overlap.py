"""The trtllm_v2 and trtllm_v1 cores in TensorRT-LLM's default loop, the overlap executor (`_executor_loop_overlap`:
model/symbolic/overlap.py over the slots, model/policies/trtllm_overlap.py in the simulator): held to the simulator
field for field (`in_flight` included) on random workloads that reach every mechanism of the loop, the Z3 relation
accepting every simulator step, the invariants holding on random runs and inductive on 2-slot designs, and (V2) a
`check` of an overlap design finding the wedge the simulator runs into. The cases are cases/trtllm_v2.py's and
cases/trtllm_v1.py's with `disable_overlap_scheduler` false (`overlap_case`)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import relation_runs
from cases import trtllm_v1 as cases_v1
from cases import trtllm_v2 as cases
from checkers.bmc import search
from checkers.differential import CompiledRelation, RelationChecker, diverges
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from checkers.replay import replay
from model.config import EngineConfig
from model.policies.trtllm_overlap import in_flight
from model.policies.trtllm_v1 import GNE, MAX_UTIL
from model.policies.trtllm_v1 import Options as V1Options
from model.policies.trtllm_v2 import Options as V2Options
from model.simulator import Workload, simulate
from model.state import Phase
from model.symbolic.core import CORES, Core
from model.symbolic.cores import trtllm_v2_micro as micro
from model.symbolic.ops import Concrete
from model.symbolic.run import run_core
from model.symbolic.slots import Knobs, Params
from schedproof.checkspec import load_check
from schedproof.runner import run_scenario
from schedproof.scenario import load
from helpers import sized

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["trtllm_v2"]
CONCRETE = Concrete()
RUNS = 1200         # trtllm_v2's random cases: seeds 0..599 (any design) and 1000..1599 (a host tier under pressure)
BLOCKS = 4
SEEDS = [s for s in range(RUNS // 2)] + [1000 + s for s in range(RUNS // 2)]
# trtllm_v1's: every seed of its differential cases (any design, block reuse under pressure, reuse shortfalls)
CASES = {"trtllm_v2": (cases, SEEDS), "trtllm_v1": (cases_v1, list(range(cases_v1.DIFF_RUNS)))}
# trtllm_v1's every other seed in the ci profile, spread over its generator's ranges, and its overlap loop's
# mechanisms must be reached among those; trtllm_v2's 1,200 stay (half of them never pause a request ended by its
# token in flight, which MUST_SEE asks for)
CASES["trtllm_v1"] = sized(ci=(cases_v1, CASES["trtllm_v1"][1][::2]), nightly=CASES["trtllm_v1"])
POLICIES = tuple(CASES)


def overlap(cfg: EngineConfig) -> EngineConfig:
    return dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, disable_overlap_scheduler=False))


def overlap_case(seed: int, policy: str = "trtllm_v2"):
    cfg, workload = CASES[policy][0].random_case(seed)
    return overlap(cfg), workload


def test_the_overlap_loop_is_in_the_core_and_the_micro_steps_refuse_it():
    """The core takes TensorRT-LLM's default loop; the micro-steps (the proofs for every n) refuse it in one line,
    so the overlap step is `Core.step`'s with overlap.py's launch and land."""
    cfg = EngineConfig("trtllm_v2", 4, 8, 16, 4, options=V2Options())
    assert not cfg.options.disable_overlap_scheduler and CORE.unsupported(cfg) is None
    why = micro.unsupported(Knobs.of(cfg))
    assert why and "overlap" in why and "\n" not in why
    assert micro.unsupported(Knobs.of(dataclasses.replace(cfg, options=V2Options(disable_overlap_scheduler=True)))) \
        is None
    assert CORES["trtllm_v1"].unsupported(EngineConfig("trtllm_v1", 4, 8, 16, 4, options=V1Options())) is None


def coverage(trace, seen: Counter) -> None:
    """What the overlap loop does, read off a simulator run."""
    cases.coverage(trace, seen)
    for t, rec in enumerate(trace.records):
        pre, post = trace.states[t], trace.states[t + 1]
        queued = set(in_flight(pre))
        scheduled = {rid for rid, _ in rec.scheduled}
        seen["in flight"] += bool(queued)
        seen["drained (nothing launched, a batch landed)"] += bool(queued) and not scheduled and rec.error is None
        for rid in queued:
            r, a = pre.req(rid), post.req(rid)
            if r.phase == Phase.DECODING and r.generated + 1 >= r.max_new:
                seen["GENERATION_TO_COMPLETE"] += 1
                seen["GENERATION_TO_COMPLETE scheduled (must not be)"] += rid in scheduled
            if rid in rec.preempted:
                seen["paused with its token in flight"] += 1
                seen["paused, ended by its token"] += rid in rec.finished
                seen["paused, replays its token"] += a.phase == Phase.PREEMPTED and a.generated == r.generated + 1
            if rid in scheduled and rid in rec.finished and a.generated < a.max_new:
                seen["stop seen late (scheduled once more)"] += 1
            seen["cancelled in flight"] += any(n == f"r{rid} cancelled" for n in rec.notes)
        for rid in scheduled:
            seen["chunk (not the last)"] += post.req(rid).phase == Phase.PREFILLING
            seen["last chunk launched with no token yet"] += (pre.req(rid).phase != Phase.DECODING
                                                               and post.req(rid).phase == Phase.DECODING
                                                               and rid in in_flight(post))
        seen["early stop"] += any(post.req(rid).generated < post.req(rid).max_new for rid in rec.finished)


MUST_SEE = ("in flight", "drained (nothing launched, a batch landed)", "GENERATION_TO_COMPLETE",
            "paused with its token in flight", "paused, ended by its token", "paused, replays its token",
            "stop seen late (scheduled once more)", "cancelled in flight", "chunk (not the last)",
            "last chunk launched with no token yet", "early stop", "preempted", "recompute pause", "stall detector",
            "end error", "end done", "suspended to the host tier", "suspended on the GPU (host tier full)",
            "resumed from the host tier", "recompute pause of a suspended request")


@pytest.mark.parametrize("block", range(BLOCKS))
@pytest.mark.parametrize("policy", POLICIES)
def test_random_runs_agree_field_for_field(policy, block):
    """Simulator and core side by side on every state (in_flight included) and every step record."""
    mod, seeds = CASES[policy]
    for seed in seeds[block::BLOCKS]:
        cfg, workload = overlap_case(seed, policy)
        assert CORES[policy].unsupported(cfg, Params.of(workload)) is None, (seed, cfg)
        d = diverges(cfg, workload, max_steps=mod.MAX_STEPS)
        assert d is None, f"{policy} seed {seed}: {d}\n  {cfg}\n  {workload}"


def coverage_v1(trace, seen: Counter) -> None:
    """trtllm_v1's mechanisms (cases_v1.coverage) and what its overlap loop adds: the capacity pass pauses a
    request whose in-flight token is its last, and E `_pause_requests` pauses it anyway (rule 5): it replays that
    token and lands one more, finishing past max_new."""
    cases_v1.coverage(trace, seen)
    for t, rec in enumerate(trace.records):
        pre, post = trace.states[t], trace.states[t + 1]
        queued = set(in_flight(pre))
        scheduled = {rid for rid, _ in rec.scheduled}
        seen["in flight"] += bool(queued)
        for rid in queued:
            r, a = pre.req(rid), post.req(rid)
            if r.phase == Phase.DECODING and r.generated + 1 >= r.max_new:
                seen["GENERATION_TO_COMPLETE"] += 1
                seen["GENERATION_TO_COMPLETE scheduled (must not be)"] += rid in scheduled
                seen["GENERATION_TO_COMPLETE paused (capacity pass)"] += rid in rec.preempted
            if rid in rec.preempted:
                seen["paused with its token in flight"] += 1
                seen["paused after its last token (kept live)"] += a.phase.unfinished and a.generated >= a.max_new
            if rid in scheduled and rid in rec.finished and a.generated < a.max_new:
                seen["stop seen late (scheduled once more)"] += 1
        seen["finished past max_new"] += any(post.req(rid).generated > post.req(rid).max_new for rid in rec.finished)


MUST_SEE_V1 = (*cases_v1.MUST_SEE, "in flight", "GENERATION_TO_COMPLETE",
               "GENERATION_TO_COMPLETE paused (capacity pass)", "paused with its token in flight", "paused after its last token (kept live)",
               "stop seen late (scheduled once more)", "finished past max_new")


@pytest.mark.parametrize("policy", POLICIES)
def test_random_runs_reach_every_mechanism_of_the_overlap_loop(policy):
    mod, seeds = CASES[policy]
    cover, must = (coverage, MUST_SEE) if policy == "trtllm_v2" else (coverage_v1, MUST_SEE_V1)
    seen: Counter = Counter()
    for seed in seeds:
        cfg, workload = overlap_case(seed, policy)
        cover(simulate(cfg, workload, max_steps=mod.MAX_STEPS), seen)
    missing = [what for what in must if seen[what] == 0]
    assert not missing, (missing, seen)
    assert seen["GENERATION_TO_COMPLETE scheduled (must not be)"] == 0, seen


def _structures():
    return [pytest.param(policy, overlap(template), id=f"{policy}-{name}")
            for policy in POLICIES for name, template in CASES[policy][0].structures()]


@pytest.mark.parametrize("policy,template", _structures())
def test_relation_accepts_every_simulator_step(policy, template):
    mod = CASES[policy][0]
    checker = mod.relation(template, mod.SLOTS)
    rng = random.Random(20_000)
    traces = relation_runs(checker, lambda: mod.structure_case(template, rng), 60, 2)
    assert sum(len(trace.records) for trace in traces) > 3 * 60


def test_the_solver_accepts_short_runs_and_refuses_a_wrong_in_flight_set():
    name, template = cases.structures()[0]
    template = overlap(template)
    rng = random.Random(3)
    n = 2
    compiled = CompiledRelation(CORE, template, n)
    checked = 0
    while checked < 3:
        cfg, workload = cases.structure_case(template, rng)
        workload = Workload(workload.requests[:n])
        trace = simulate(cfg, workload, max_steps=40)
        if len(trace.records) < 3 or not any(in_flight(s) for s in trace.states[1:6]):
            continue
        trace = dataclasses.replace(trace, states=trace.states[:6], records=trace.records[:5])
        solver = RelationChecker(CORE, cfg, n)
        assert solver.rejects(cfg, workload, trace) is None, (cfg, workload)
        assert compiled.rejects(cfg, workload, trace) is None
        checked += 1
    # one wrong post-state: the batch in flight forgotten
    t = next(t for t, s in enumerate(trace.states[1:], 1) if in_flight(s))
    bad = dataclasses.replace(trace, states=list(trace.states))
    bad.states[t] = dataclasses.replace(bad.states[t], sched=dataclasses.replace(bad.states[t].sched, in_flight=()))
    assert solver.rejects(cfg, workload, bad) is not None
    assert compiled.rejects(cfg, workload, bad) is not None


@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_hold_on_random_runs(policy):
    mod, seeds = CASES[policy]
    core = CORES[policy]
    held = Counter()
    for seed in seeds[::3]:
        cfg, workload = overlap_case(seed, policy)
        k, p = Knobs.of(cfg), Params.of(workload)
        for t, s in enumerate(run_core(core, k, p, max_steps=mod.MAX_STEPS).states):
            inv = core.invariants(CONCRETE, k, p, s)
            bad = [name for name, c in inv.items() if not c]
            assert not bad, (seed, t, bad, cfg, workload)
            held["in flight"] += any(r["in_flight"] and r["phase"] == 3 for r in s.req)
    assert held["in flight"] > 100, held


def _designs():
    v2 = [pytest.param(overlap(EngineConfig("trtllm_v2", 4, 16, 16, 4, 0, chunked, 0, V2Options(draft_len=1))),
                       id=f"trtllm_v2-{'chunked' if chunked else 'whole'}") for chunked in (False, True)]
    v1 = [pytest.param(overlap(EngineConfig("trtllm_v1", 32, 256, 2048, 8, chunked_prefill=chunked,
                                            options=V1Options(capacity_scheduler_policy=cap, draft_len=1,
                                                              enable_block_reuse=reuse))),
                       id=f"trtllm_v1-{cap}-{'chunked' if chunked else 'whole'}-{'reuse' if reuse else 'noreuse'}")
          for cap in (GNE, MAX_UTIL) for chunked in (False, True) for reuse in (False, True)]
    return v2 + v1


@pytest.mark.parametrize("cfg", _designs())
def test_invariants_are_inductive_on_two_slots(cfg):
    """Pool, budget and batch cap symbolic (trtllm_v2: the page size too; host_blocks 0, the GPU-only form),
    2 slots, drafts on."""
    core = CORES[cfg.policy]
    bounds = {"num_blocks": (1, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)}
    if cfg.policy == "trtllm_v2":
        bounds["block_size"] = (1, None)
    knobs, cons = symbolic_knobs(cfg, bounds)
    params = any_params(2)
    obligations = check_obligations(core, knobs, params, cons + workload_constraints(params), core.invariants, 120,
                                    batch=cfg.policy == "trtllm_v1")
    failed = [o.line() for o in obligations if o.status != "proved"]
    assert not failed, failed
    names = {o.invariant for o in obligations}
    assert {"r0.in-flight-decodes", "r1.decode-cursor", "r1.live-owes-tokens"} <= names


@pytest.mark.parametrize("policy", POLICIES)
def test_the_other_loops_decode_cursor_is_not_inductive_in_the_overlap_loop(policy):
    """The induction is not vacuous: `_executor_loop`'s decode-cursor (computed = prompt + generated - 1 for every
    decoder) fails its step obligation in the overlap loop, where a launched decoder is one token ahead."""
    class Sync(type(CORES[policy])):
        def decode_cursor(self, ops, k, p, s, i):
            return Core.decode_cursor(self, ops, k, p, s, i)

    cfg = next(p.values[0] for p in _designs() if p.values[0].policy == policy)
    knobs, cons = symbolic_knobs(cfg, {"num_blocks": (1, None), "max_num_tokens": (1, None),
                                       "max_batch_size": (1, None)})
    params = any_params(2)
    core = Sync()
    obligations = check_obligations(core, knobs, params, cons + workload_constraints(params), core.invariants, 120)
    assert any(o.status == "failed" and o.invariant.endswith("decode-cursor") for o in obligations)


def test_check_finds_the_field_wedge_in_the_overlap_loop_as_the_simulator_does():
    """scenarios/check/trtllm-v2-field-ranges-small-overlap.toml (the field wedge from ranges, small sizes, the
    default loop): LIVE-NO-PROGRESS, and the counterexample replays to the deadlock that `schedproof run` of the
    field report's scenario (trtllm-v2-replay-over-budget) gives in the same loop. About 10 CPU seconds."""
    field = load(ROOT / "scenarios" / "trtllm-v2-replay-over-budget.toml")
    default_loop = dataclasses.replace(field, cfg=overlap(field.cfg))
    run = run_scenario(default_loop)
    assert (run.verdict, run.completed, run.failed) == ("deadlock", 3, 9)

    spec = load_check(str(ROOT / "scenarios" / "check" / "trtllm-v2-field-ranges-small-overlap.toml"))
    assert not spec.space.template.options.disable_overlap_scheduler
    result = search(CORE, spec.space, spec.max_depth, timeout=300, properties=list(spec.properties))
    assert result.status == "violated" and result.cex.property == "LIVE-NO-PROGRESS", (result.status, result.reason)
    rep = replay(result.cex)
    assert rep.ok, rep.message
    trace = rep.trace
    assert not trace.cfg.options.disable_overlap_scheduler and trace.end == "error"
    assert trace.records[-1].error_kind == "deadlock"
    stuck = trace.states[-2]
    assert any(r.phase == Phase.PREEMPTED and r.context_len > trace.cfg.max_num_tokens for r in stuck.requests)
