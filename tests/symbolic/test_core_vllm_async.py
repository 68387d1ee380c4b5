"""The vllm_v1 core in vLLM's default loop, async scheduling (`AsyncScheduler` under `EngineCore.step_with_batch_queue`:
model/symbolic/batch_queue.py and the core's `launch_batch` / `land_batch` over the slots, model/pipeline.py with
model/policies/vllm_v1_async.py in the simulator): held to the simulator field for field (the counters, the queued
batch, `finished_pending`, and with prefix caching the pool and each request's cached count included) on random
workloads that reach every mechanism of the loop and of the pool under it (hits, evictions, a preempted request whose
cached blocks lag its computed tokens), the Z3 relation accepting every simulator step, the invariants holding on
random runs and inductive on 2-slot designs (prefix caching on and off), and the refusal of async scheduling in the
one-request view (the argument for any number of requests). The cases are cases/vllm_v1.py's (prefix caching in
about 60% of them) with `async_scheduling` on (`async_case`). Sizes: SCHEDPROOF_PROFILE=nightly runs every
differential case (tests/helpers.py)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import relation_runs, widest_long_run
from cases import vllm_v1 as cases
from checkers.differential import RelationChecker, diverges
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from checkers.parametric import local_vllm
from helpers import sized
from model.config import EngineConfig
from model.policies.vllm_v1 import Options
from model.policies.vllm_v1_async import flight_tuple
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase
from model.symbolic.core import CORES, Core
from model.symbolic.cores.vllm_v1 import VllmV1Core, pool_facts
from model.symbolic.ops import Concrete
from model.symbolic.run import run_core
from model.symbolic.slots import Knobs, Params, diff, diff_record, record_of

CORE = CORES["vllm_v1"]
CONCRETE = Concrete()
RUNS = sized(ci=cases.DIFF_RUNS, nightly=4 * cases.DIFF_RUNS)
BLOCKS = 4
RELATION_RUNS = sized(ci=40, nightly=cases.RELATION_RUNS)   # per structure (the 12, 4 with prefix caching)


def in_async(cfg: EngineConfig) -> EngineConfig:
    return dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, async_scheduling=True))


def async_case(seed: int):
    cfg, workload = cases.random_case(seed)
    return in_async(cfg), workload


def test_the_async_loop_is_in_the_core_and_the_one_request_view_refuses_it():
    """Async scheduling is expressed with prefix caching off and on (vLLM's defaults: both on), PRIORITY with prefix
    caching refused as in the synchronous loop; no decode run is accelerated there; the argument for any number of
    requests refuses it (`covers`), and the core refuses an environment under it rather than building the
    synchronous step."""
    cfg = EngineConfig("vllm_v1", 4, 8, 16, 4, options=Options(max_model_len=12, enable_prefix_caching=False))
    assert cfg.options.async_scheduling and CORE.unsupported(cfg) is None
    k = Knobs.of(cfg)
    assert not CORE.accelerates_in(k)
    assert CORE.accelerates_in(Knobs.of(dataclasses.replace(cfg, options=dataclasses.replace(
        cfg.options, async_scheduling=False))))
    assert CORE.unsupported(dataclasses.replace(cfg, options=Options(max_model_len=12))) is None
    field, why = CORE.unsupported(dataclasses.replace(cfg, options=Options(max_model_len=12, policy="priority")))
    assert field == "engine.options.policy" and "\n" not in why
    assert not CORE.accelerates_in(Knobs.of(dataclasses.replace(cfg, options=Options(max_model_len=12))))
    why = local_vllm.covers(cfg, "LIVE-NO-PROGRESS")
    assert why and "async scheduling" in why and "\n" not in why
    assert local_vllm.argument(cfg, k, [], 1.0)[0][2] == "failed"
    sync = dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, async_scheduling=False))
    assert local_vllm.covers(sync, "LIVE-NO-PROGRESS") is None
    p = Params.of(async_case(0)[1])
    s = CORE.initial(CONCRETE, k, p)
    for env in (local_vllm.Recorder(), local_vllm.Environment()):
        with pytest.raises(ValueError, match="synchronous loop only"):
            CORE.step(local_vllm.SYM, k, p, s, env=env)


def coverage(trace, seen: Counter) -> None:
    """What the batch queue does, read off a simulator run (the policy's Sched: in_flight, flight,
    finished_pending)."""
    seen[f"policy {trace.cfg.options.policy}"] += 1
    seen[f"chunked {trace.cfg.chunked_prefill}"] += 1
    seen[f"end {trace.end}"] += 1
    for t, rec in enumerate(trace.records):
        pre, post = trace.states[t], trace.states[t + 1]
        flight = {f[0]: f[1:] for f in pre.sched.flight}
        queued = {x.rid: x for batch in pre.sched.in_flight for x in batch}
        scheduled = {rid for rid, _ in rec.scheduled}
        seen["a batch in flight"] += bool(pre.sched.in_flight)
        seen["an empty batch queued"] += any(not b for b in post.sched.in_flight)
        seen["early return (the queue had room)"] += not pre.sched.in_flight and bool(post.sched.in_flight)
        seen["idle step"] += "idle step" in rec.notes
        seen["drained (no requests, the batch landed)"] += bool(pre.sched.in_flight) and not post.sched.in_flight \
            and not scheduled
        seen["has_requests only by finished_pending"] += pre.sched.finished_pending and not pre.sched.running \
            and not pre.sched.waiting
        for rid in rec.preempted:
            if flight.get(rid, (0, 0, 0))[1] > 0:
                seen["preempted with its output in flight (stale)"] += 1
                seen["stale output finished it"] += rid in rec.finished
                seen["stale output kept it preempted"] += post.req(rid).phase == Phase.PREEMPTED and \
                    post.req(rid).generated == pre.req(rid).generated + 1
        for rid in pre.sched.running:
            r = pre.req(rid)
            ph = flight.get(rid, (0, 0, 0))[0]
            if ph > 0 and r.computed + 2 - ph >= r.prompt + r.max_new:
                seen["skipped: its last token in flight"] += 1
                seen["skipped but scheduled (must not be)"] += rid in scheduled
        for rid in rec.finished:
            seen["finish landed a step late (scheduled again)"] += rid in scheduled
            seen["early stop"] += post.req(rid).generated < post.req(rid).max_new
        for rid, x in queued.items():
            seen["cancelled with its batch in flight"] += any(n == f"r{rid} cancelled" for n in rec.notes)
            seen["chunk in flight (no placeholder)"] += not x.samples
        seen["two batches' tokens of one request"] += any(f[1] > 0 and f[0] >= 1 and rid in scheduled
                                                          for rid, f in flight.items())
        seen["error"] += rec.error is not None
        if trace.cfg.options.enable_prefix_caching:
            pool_coverage(trace.cfg, pre, post, rec, seen)


def pool_coverage(cfg, pre, post, rec, seen: Counter) -> None:
    """The block pool under async scheduling: cases/vllm_v1.py's mechanisms (hits, evictions, copies), a landing
    that caches past what scheduling did (AS:70-74), and preemptions and completions of a request whose cached
    blocks (`ncached`) lag its computed tokens (a token in flight at a block boundary)."""
    cases.pool_coverage(pre.sched, post.sched, seen)
    seen["prefix caching"] += 1
    bs = cfg.block_size
    before = dict(pre.sched.ncached)
    lag = {rid for rid in pre.sched.running if before.get(rid, 0) < pre.req(rid).computed // bs}
    seen["a running request's cache lags its computed tokens"] += bool(lag)
    scheduled = {rid for rid, _ in rec.scheduled}
    flight = {f[0]: f[1:] for f in pre.sched.flight}
    for x in (pre.sched.in_flight[-1] if pre.sched.in_flight else ()):   # the batch this call lands
        if x.samples and x.rid in pre.sched.running and x.rid not in scheduled and x.rid not in rec.preempted:
            ph = flight.get(x.rid, (0, 0, 0))[0]
            seen["a landing cached blocks (not scheduled)"] += (pre.req(x.rid).computed - (ph - 1)) // bs > \
                before.get(x.rid, 0)
    for rid in rec.preempted:
        seen["preempted with its cache lagging"] += rid in lag
        seen["preempted with a cached own run"] += any(b in post.sched.free_q and post.sched.hashed[b]
                                                       and post.sched.ident[b][:2] == (1, rid)
                                                       for b in range(len(post.sched.ref)))
    for rid in rec.finished:
        seen["finished with its cache lagging"] += rid in lag


MUST_SEE = ("policy fcfs", "policy priority", "chunked True", "chunked False", "end done", "end fixpoint",
            "a batch in flight", "an empty batch queued", "early return (the queue had room)", "idle step",
            "drained (no requests, the batch landed)", "has_requests only by finished_pending",
            "preempted with its output in flight (stale)", "stale output finished it", "stale output kept it preempted",
            "skipped: its last token in flight", "finish landed a step late (scheduled again)", "early stop",
            "cancelled with its batch in flight", "chunk in flight (no placeholder)",
            "two batches' tokens of one request",
            "prefix caching", "hit a shared prefix", "hit its own blocks after preemption", "hit a free cached block",
            "cached block evicted", "duplicate cached copies", "first copy free, a later one held",
            "a running request's cache lags its computed tokens", "a landing cached blocks (not scheduled)",
            "preempted with its cache lagging", "preempted with a cached own run", "finished with its cache lagging")


@pytest.mark.parametrize("block", range(BLOCKS))
def test_random_runs_agree_field_for_field(block):
    """Simulator and core side by side on every state (counters, queued batch, flags) and every step record."""
    for seed in range(block, RUNS, BLOCKS):
        cfg, workload = async_case(seed)
        assert CORE.unsupported(cfg, Params.of(workload)) is None, (seed, cfg)
        d = diverges(cfg, workload, max_steps=cases.MAX_STEPS)
        assert d is None, f"seed {seed}: {d}\n  {cfg}\n  {workload}"


@pytest.mark.parametrize("count", (8, 16))
def test_long_workloads_agree_field_for_field(count):
    """8 and 16 requests (consecutive random cases' requests) on designs with the batch cap, pool and budget grown,
    as test_core_differential.py's long cases; some step schedules five requests or more."""
    widest = widest_long_run("vllm_v1", count, 10, draw=async_case)
    assert widest >= 5, widest


def test_random_runs_reach_every_mechanism_of_the_batch_queue():
    seen: Counter = Counter()
    for seed in range(RUNS):
        cfg, workload = async_case(seed)
        coverage(simulate(cfg, workload, max_steps=cases.MAX_STEPS), seen)
    missing = [what for what in MUST_SEE if seen[what] == 0]
    assert not missing, (missing, seen)
    assert seen["skipped but scheduled (must not be)"] == 0 and seen["error"] == 0, seen


def _structures():
    return [pytest.param(in_async(template), id=name) for name, template in cases.structures()]


@pytest.mark.parametrize("template", _structures())
def test_relation_accepts_every_simulator_step(template):
    checker = cases.relation(template, cases.SLOTS)
    rng = random.Random(30_000)

    def draw():
        cfg, workload = cases.structure_case(template, rng)
        return in_async(cfg), workload

    traces = relation_runs(checker, draw, RELATION_RUNS, 1)
    assert sum(len(trace.records) for trace in traces) > 3 * RELATION_RUNS


def test_the_solver_accepts_short_runs_and_refuses_a_forgotten_batch():
    """The Z3 relation (RelationChecker, a solver call per step) on short runs, and a post-state with the queued
    batch forgotten refused."""
    template = _structures()[4].values[0]
    rng = random.Random(5)
    n = 2
    solver = RelationChecker(CORE, template, n)
    checked = 0
    while checked < 2:
        workload = Workload(cases.rand_workload(rng, template, most=n).requests[:n])
        trace = simulate(template, workload, max_steps=40)
        if len(trace.records) < 3 or not any(s.sched.in_flight for s in trace.states[1:5]):
            continue
        trace = dataclasses.replace(trace, states=trace.states[:5], records=trace.records[:4])
        assert solver.rejects(template, workload, trace) is None, (template, workload)
        checked += 1
    t = next(t for t, s in enumerate(trace.states[1:], 1) if s.sched.in_flight)
    bad = dataclasses.replace(trace, states=list(trace.states))
    bad.states[t] = dataclasses.replace(bad.states[t], sched=dataclasses.replace(bad.states[t].sched, in_flight=()))
    assert solver.rejects(template, workload, bad) is not None


def test_invariants_hold_on_random_runs():
    """The invariants, and with prefix caching `pool_facts` (what the pool encoding rests on beyond them), on every
    state of the core's runs."""
    held = Counter()
    for seed in range(0, RUNS, 5):
        cfg, workload = async_case(seed)
        k, p = Knobs.of(cfg), Params.of(workload)
        apc = cfg.options.enable_prefix_caching
        empty = {i for i, r in enumerate(workload.requests) if r.prompt == 0}
        for t, s in enumerate(run_core(CORE, k, p, max_steps=cases.MAX_STEPS).states):
            bad = [name for name, c in CORE.invariants(CONCRETE, k, p, s).items() if not c
                   and not (name.endswith("context-cursor") and int(name[1:].split(".")[0]) in empty)]
            if apc:
                bad += [name for name, c in pool_facts(CONCRETE, k, p, s).items() if not c]
            assert not bad, (seed, t, bad, cfg, workload)
            held["a placeholder"] += any(r["ph"] == 1 and r["phase"] == Phase.DECODING for r in s.req)
            held["a cached count behind computed // block_size"] += apc and any(
                r["phase"] in (Phase.PREFILLING, Phase.DECODING) and r["cb"] < r["computed"] // cfg.block_size
                for r in s.req)
    assert held["a placeholder"] > 100 and held["a cached count behind computed // block_size"] > 20, held


def _designs():
    """Prefix caching off (FCFS, PRIORITY) and on (FCFS, its subset), chunked prefill off and on; block size and
    max_model_len fixed (with both concrete a prompt reaches (12 - 1) // 4 = 2 shared positions, the others fold
    away), the rest of the knobs and the workload (shared prefixes included) symbolic."""
    return [pytest.param(EngineConfig("vllm_v1", 4, 8, 16, 4, chunked_prefill=chunked,
                                      options=Options(max_model_len=12, enable_prefix_caching=apc, policy=policy)),
                         id=f"{policy}-{'chunked' if chunked else 'whole'}{'-caching' if apc else ''}")
            for policy, apc in (("fcfs", False), ("priority", False), ("fcfs", True)) for chunked in (False, True)]


BOUNDS = {"num_blocks": (1, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)}


# With prefix caching some of the core's pool invariants are not inductive alone on 2 slots with any workload (shared
# prefixes included), in either loop: their step obligations fail in the synchronous loop too (checked below); the
# claims' proofs add `pool_facts` and their workload class (proofs/claims.py `vllm_pages_match_cached`, the twin
# vllm-chunked-fits-alone-caching@default-loop proved for up to 3 requests). queue-holds-cached-free proves under
# async but takes over a minute, so it is left to the prover's runs.
NOT_INDUCTIVE_ALONE = {"blocks-conserved", "r0.pool-idle", "r1.pool-idle", "r0.held", "r1.held"}
SLOW = {"queue-holds-cached-free"}


@pytest.mark.parametrize("cfg", _designs())
def test_invariants_are_inductive_on_two_slots(cfg):
    """Pool, budget and batch cap symbolic, 2 slots, any workload. With prefix caching, every invariant but those not
    inductive alone in the synchronous loop either: the async-only ones (the cached count lagging computed tokens, the
    placeholders, a live request below max_model_len, the batch's order) among them."""
    knobs, cons = symbolic_knobs(cfg, BOUNDS)
    params = any_params(2)
    apc = cfg.options.enable_prefix_caching
    two = Params.of(Workload((RequestSpec(1, 1), RequestSpec(1, 1))))   # the invariants' names on 2 slots
    wanted = [name for name in CORE.invariants(CONCRETE, Knobs.of(cfg), two, CORE.initial(CONCRETE, Knobs.of(cfg), two))
              if name not in SLOW] if apc else None
    obligations = check_obligations(CORE, knobs, params, cons + workload_constraints(params), CORE.invariants, 120,
                                    wanted=wanted)
    failed = {o.invariant for o in obligations if o.status != "proved"}
    assert failed <= (NOT_INDUCTIVE_ALONE if apc else set()), [o.line() for o in obligations if o.status != "proved"]
    names = {o.invariant for o in obligations}
    assert {"r0.in-flight", "r1.decode-cursor", "r1.live-owes-tokens"} <= names
    assert not any(o.action.startswith("decode") for o in obligations)
    if apc:
        assert {"r0.cached-count", "r1.cached-count", "r0.own-run-in-reach", "r0.pool-fields",
                "r1.within-max-model-len"} <= names - failed
        sync = dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, async_scheduling=False))
        knobs, cons = symbolic_knobs(sync, BOUNDS)
        obligations = check_obligations(CORE, knobs, params, cons + workload_constraints(params), CORE.invariants, 120,
                                        wanted=sorted(failed))
        assert {o.invariant for o in obligations if o.status == "failed"} == failed


def test_the_synchronous_decode_cursor_is_not_inductive_under_async_scheduling():
    """Not vacuous: the synchronous loop's decode-cursor (computed = prompt + generated - 1) fails its step
    obligation under async scheduling, where a launched decoder is one placeholder ahead."""
    class Sync(VllmV1Core):
        def decode_cursor(self, ops, k, p, s, i):
            return Core.decode_cursor(self, ops, k, p, s, i)

    cfg = _designs()[1].values[0]
    knobs, cons = symbolic_knobs(cfg, BOUNDS)
    params = any_params(2)
    core = Sync()
    obligations = check_obligations(core, knobs, params, cons + workload_constraints(params), core.invariants, 120)
    assert any(o.status == "failed" and o.invariant.endswith("decode-cursor") for o in obligations)


def test_the_placeholder_assertion_crashes_both_sides_alike():
    """AS:67-68 never fails on a reachable state (the `in-flight` invariant), so its encoding is held to the simulator
    on hand-made states: a queued batch's sampling entry whose placeholder was zeroed (not by a preemption). The
    step that lands it crashes on both sides with the same post-state and record: the batch processed up to that
    entry, the counters as the launch left them, every unfinished request failed."""
    policy = POLICIES["vllm_v1"]
    crashed = 0
    shapes: Counter = Counter()
    for seed in range(400):
        cfg, workload = async_case(seed)
        trace = simulate(cfg, workload, max_steps=cases.MAX_STEPS)
        n = len(workload.requests)
        k, p = Knobs.of(cfg), Params.of(workload)
        for s in trace.states[1:]:
            batch = s.sched.in_flight[0] if s.sched.in_flight else ()
            flight = {f[0]: f[1:] for f in s.sched.flight}
            sampled = [x.rid for x in batch if x.samples and flight.get(x.rid, (0, 0, 0))[0] == 1]
            if s.error is not None or not sampled:
                continue
            rid = sampled[seed % len(sampled)]
            order = [x.rid for x in batch].index(rid)
            ph, infl, stale = flight[rid]
            flight[rid] = (0, infl, stale)
            bad = dataclasses.replace(s, sched=dataclasses.replace(s.sched, flight=flight_tuple(flight)))
            post, rec = policy.step(cfg, bad, workload.env_at(bad))
            if rec.error_kind != "crash":
                continue   # preempted by the pass first: its output stale, no placeholder retired
            cpost, crec = CORE.step(CONCRETE, k, p, CORE.abstract(cfg, bad, n))
            assert diff(CORE.abstract(cfg, post, n), cpost) is None, (seed, diff(CORE.abstract(cfg, post, n), cpost))
            assert diff_record(record_of(rec, n), crec) is None, (seed, diff_record(record_of(rec, n), crec))
            bad_inv = [name for name, c in CORE.invariants(CONCRETE, k, p, CORE.abstract(cfg, bad, n)).items() if not c]
            assert f"r{rid}.in-flight" in bad_inv, bad_inv   # unreachable: the invariant excludes it
            crashed += 1
            shapes["entries landed before it"] += order > 0
            shapes["entries left after it"] += order < len(batch) - 1
            break
    assert crashed > 100 and min(shapes.values()) > 10, (crashed, shapes)
