"""The sglang core in SGLang's default loop, event_loop_overlap (model/symbolic/overlap.py's launch-then-land with
the sglang core's rules, model/symbolic/cores/sglang.py; model/policies/sglang_overlap.py `overlap_step` in the
simulator): held to the simulator field for field (`in_flight` and `prefill_only` included) on random workloads that
reach every mechanism of the loop, the Z3 relation accepting every simulator step, the invariants holding on random
runs and inductive on 2-slot designs, event_loop_normal's terms untouched by the loop's fields, and the one-request
argument for any number of requests (checkers/parametric/local_sglang.py) refusing the loop.

The cases are cases/sglang.py's with `disable_overlap_schedule` false, and `paged_case`: pages of 8 or 16 tokens with
page-aligned prompts and short outputs, where ignore_eos admission (which reserves outputs in tokens, not pages) lets
a decode retraction happen (scenarios/sglang-ignore-eos-page-retraction.toml), and in this loop the retracted
request's token in flight is lost. Sizes: `sized` (tests/helpers.py), SCHEDPROOF_PROFILE=nightly for more runs."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import z3

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import relation_runs
from cases import sglang as cases
from checkers.differential import CompiledRelation, RelationChecker, diverges
from checkers.encode import fresh_state
from checkers.induction import any_params, check_obligations, symbolic_knobs, workload_constraints
from checkers.parametric import local_sglang
from checkers.parametric.local_vllm import Recorder
from helpers import sized
from model.config import EngineConfig
from model.policies.sglang import Options
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase
from model.symbolic.core import CORES, Core
from model.symbolic.ops import Concrete, Symbolic
from model.symbolic.run import run_core
from model.symbolic.slots import DECODING, Knobs, Params, diff, diff_record, record_of
from proofs import claims as C
from proofs import modes
from proofs import run as R

CORE = CORES["sglang"]
CONCRETE = Concrete()
RUNS = sized(ci=600, nightly=3000)       # per generator: cases/sglang.py's (in the overlap loop) and `paged_case`
BLOCKS = 2
RELATION_RUNS = sized(ci=250, nightly=1000)
MAX_STEPS = cases.MAX_STEPS


def overlap(cfg: EngineConfig) -> EngineConfig:
    return dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, disable_overlap_schedule=False))


def paged_options(context_len=None) -> Options:
    return Options(ignore_eos=True, disable_radix_cache=True, context_len=context_len)


def paged_cfg(rng: random.Random, options: Options) -> EngineConfig:
    page = rng.choice([8, 16])
    while True:
        cfg = EngineConfig("sglang", block_size=page, num_blocks=rng.randint(4, 7),
                           max_num_tokens=rng.randint(page, 6 * page), max_batch_size=rng.randint(2, 6),
                           options=options)
        if CORE.unsupported(cfg) is None:
            return cfg


def paged_workload(rng: random.Random, page: int) -> Workload:
    reqs = []
    for _ in range(rng.randint(2, 6)):
        reqs.append(RequestSpec(prompt=rng.choice([page, page, 2 * page, rng.randint(1, 2 * page)]),
                                max_new=rng.choice([rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 2 * page)]),
                                arrival=rng.randint(0, 3), cancel_at=rng.choice([None] * 3 + [rng.randint(0, 12)])))
    return Workload(tuple(reqs))


def paged_case(seed: int):
    """Pages of 8 or 16 tokens, a pool of 4-7 pages, page-aligned prompts and mostly short outputs: several requests
    reach a page boundary at once, and a decode retraction happens (in about one run in a hundred)."""
    rng = random.Random(seed)
    page_ctx = rng.choice([None, None, None, 5])
    cfg = paged_cfg(rng, paged_options())
    if page_ctx is not None:
        cfg = dataclasses.replace(cfg, options=paged_options(page_ctx * cfg.block_size))
    return cfg, paged_workload(rng, cfg.block_size)


def random_case(seed: int):
    """Seeds below RUNS: cases/sglang.py's case in the overlap loop; the next RUNS: `paged_case`."""
    if seed < RUNS:
        cfg, workload = cases.random_case(seed)
        return overlap(cfg), workload
    return paged_case(seed)


SEEDS = list(range(2 * RUNS))
# Two runs where the finishing-in-flight skip leaves a running batch that does not fit, so nothing is decoded nor
# retracted (SC:4469-4474): about one paged run in 5000 (`paged_case` seeds 9668 and 10478, written out).
DIRECTED = [
    (EngineConfig("sglang", 16, 7, 87, 3, options=Options(ignore_eos=True, disable_radix_cache=True)),
     Workload((RequestSpec(31, 4), RequestSpec(16, 2, arrival=1, cancel_at=3), RequestSpec(32, 6, arrival=2),
               RequestSpec(31, 4, arrival=2)))),
    (EngineConfig("sglang", 8, 5, 14, 6, options=Options(ignore_eos=True, disable_radix_cache=True, context_len=40)),
     Workload((RequestSpec(8, 2), RequestSpec(8, 1), RequestSpec(7, 3, arrival=1),
               RequestSpec(8, 4, arrival=2, cancel_at=5)))),
]


def all_cases():
    return [random_case(seed) for seed in SEEDS] + DIRECTED


# -- the loop is expressed, and the argument for any number of requests refuses it -------------------------
def test_the_overlap_loop_is_in_the_core_and_the_one_request_argument_refuses_it():
    """The core takes SGLang's default loop (no refusal naming disable_overlap_schedule any more); the one-request
    argument (checkers/parametric/local_sglang.py) refuses it in one line at `covers` and at every entry point, and
    the core's step refuses an environment there, so the normal loop's semantics are never applied to it."""
    base = C.sglang()
    assert base.options.disable_overlap_schedule and CORE.unsupported(base) is None
    default = overlap(base)
    assert not default.options.disable_overlap_schedule and CORE.unsupported(default) is None
    assert local_sglang.covers(base, "LIVE-NO-PROGRESS") is None
    why = local_sglang.covers(default, "LIVE-NO-PROGRESS")
    assert why.startswith("engine.options.disable_overlap_schedule: ") and "\n" not in why
    assert local_sglang.unsupported(Knobs.of(default)) == why and local_sglang.unsupported(Knobs.of(base)) is None
    k, cons = symbolic_knobs(default, {"num_blocks": (7, None)})
    for call in (lambda: local_sglang.refines(k, cons, 1, 10), lambda: local_sglang.head_env(k, cons, 1, 10),
                 lambda: local_sglang.local_invariants(k, cons, 10), lambda: local_sglang.progress(k, cons, 10),
                 lambda: local_sglang.obligations(default, k, cons, 10),
                 lambda: local_sglang.concrete_disagreement(default, Workload((RequestSpec(4, 2),)))):
        with pytest.raises(ValueError, match="disable_overlap_schedule"):
            call()
    assert local_sglang.argument(default, k, cons, 10)[0][2:] == ("failed", 0.0, why)
    params = any_params(1)
    with pytest.raises(ValueError, match="event_loop_normal only"):
        CORE.step(Symbolic(), k, params, fresh_state(CORE, 1, "pre"), env=Recorder())
    # the simulator runs the same loop for these designs
    assert POLICIES["sglang"].loop(default.options).startswith("Scheduler.event_loop_overlap")


def test_the_normal_loop_neither_reads_nor_writes_the_overlap_fields():
    """event_loop_normal's step on 3 symbolic slots: `in_flight` and `prefill_only` come out as they went in, and
    no other output of the step mentions them, so that loop's terms are those it had before the fields existed."""
    cfg = C.sglang()
    k, _ = symbolic_knobs(cfg, {"num_blocks": (7, None), "max_num_tokens": (1, None), "max_batch_size": (1, None)})
    pre = fresh_state(CORE, 3, "pre")
    post, rec = CORE.step(Symbolic(), k, any_params(3), pre)
    fields = [r["in_flight"] for r in pre.req] + [pre.g["prefill_only"]]
    assert all(a["in_flight"].eq(b["in_flight"]) for a, b in zip(post.req, pre.req))
    assert post.g["prefill_only"].eq(pre.g["prefill_only"])
    names = {str(f) for f in fields}
    outs = [v for r in post.req for f, v in r.items() if f != "in_flight"] + \
        [v for f, v in post.g.items() if f != "prefill_only"] + list(rec.tokens) + \
        [x for f in rec.flags.values() for x in f] + [rec.charged, rec.error, rec.error_kind]

    def mentions(t) -> bool:
        todo, seen = [t], set()
        while todo:
            e = todo.pop()
            if not z3.is_expr(e) or e.get_id() in seen:
                continue
            seen.add(e.get_id())
            if z3.is_const(e) and str(e) in names:
                return True
            todo.extend(e.children())
        return False
    assert not any(mentions(t) for t in outs)


# -- field for field against the simulator ----------------------------------------------------------
@pytest.mark.parametrize("block", range(BLOCKS))
def test_random_runs_agree_field_for_field(block):
    """Simulator and core side by side on every state (in_flight and prefill_only included) and every step record."""
    for at, (cfg, workload) in enumerate(all_cases()[block::BLOCKS]):
        assert CORE.unsupported(cfg, Params.of(workload)) is None, (at, cfg)
        d = diverges(cfg, workload, max_steps=MAX_STEPS)
        assert d is None, f"case {at * BLOCKS + block}: {d}\n  {cfg}\n  {workload}"


def test_single_steps_from_states_short_of_pages_agree():
    """What random runs reach rarely or never (retractions, most with a token in flight, and the last request's
    abort, which no random run reaches): one step of simulator and core from states of random runs with the free
    pool cut to a random smaller size, compared field for field. The pool then no longer adds up, which neither
    step reads."""
    policy = POLICIES["sglang"]
    seen = Counter()
    for seed in SEEDS[::3]:
        cfg, workload = random_case(seed)
        rng, n = random.Random(seed), len(workload.requests)
        k, p = Knobs.of(cfg), Params.of(workload)
        for s in simulate(cfg, workload, max_steps=400).states[:-1]:
            if s.error is not None:
                continue
            s = dataclasses.replace(s, free_blocks=rng.randint(0, s.free_blocks))
            post, rec = policy.step(cfg, s, workload.env_at(s))
            cpost, crec = CORE.step(CONCRETE, k, p, CORE.abstract(cfg, s, n))
            d = diff(CORE.abstract(cfg, post, n), cpost) or diff_record(record_of(rec, n), crec)
            assert not d, (seed, s.step, d, cfg, workload)
            queued = {row[0] for row in s.sched.in_flight}
            seen["retract"] += bool(rec.preempted)
            seen["retracted with its token in flight (lost)"] += any(rid in queued for rid in rec.preempted)
            seen["the last request aborted"] += bool(rec.failed) and rec.error is None
    assert all(seen[what] >= 20 for what in ("retract", "retracted with its token in flight (lost)",
                                             "the last request aborted")), seen


def coverage(trace, seen: Counter) -> None:
    """What the overlap loop does, read off a simulator run; and what the slot field leaves out of the simulator's
    rows is fixed within the subset: every row samples (no chunked request), and a launched request's extend_end is
    its KV (extend_end and in_flight_extend are read only by the radix cache's checkpoint, outside the subset)."""
    cases.coverage(trace, seen)
    for pre, rec, post in zip(trace.states, trace.records, trace.states[1:]):
        s0, s1 = pre.sched, post.sched
        queued = {row[0] for row in s0.in_flight}
        scheduled = {rid for rid, _ in rec.scheduled}
        for rid, samples, end in s1.in_flight:
            assert samples == 1 and rid in scheduled and (
                end == post.req(rid).computed or post.req(rid).phase.terminal), (rid, samples, end, post.req(rid))
        seen["in flight"] += bool(queued)
        seen["decoded again with its token in flight"] += bool(queued & scheduled)
        merged = set(s0.running) | set(s0.last_extend or ())
        for rid in queued:
            r, a = pre.req(rid), post.req(rid)
            if rid in merged and r.phase == Phase.DECODING and r.generated + 1 >= s0.cap(rid):
                seen["finishing in flight"] += 1
                seen["finishing in flight scheduled (must not be)"] += rid in scheduled
                seen["finishing in flight left the running batch"] += rid not in s1.running
            if rid in rec.preempted:
                seen["retracted with its token in flight (lost)"] += a.generated == r.generated
            if r.phase == Phase.DECODING and a.phase == Phase.CANCELLED:
                seen["cancelled in flight"] += 1
                seen["input-length abort cancelled in flight"] += rid in s0.doomed
            if r.phase == Phase.DECODING and a.phase == Phase.REJECTED:
                seen["input-length abort rejected at its landing"] += 1
                seen["... after being decoded once more"] += rid in scheduled
            seen["row of a request ended since its launch skipped"] += r.phase.terminal
        if queued and any(rid in s0.running and rid in queued and pre.req(rid).generated + 1 >= s0.cap(rid)
                          for rid in s0.running) and not scheduled and s1.running and not s1.prefill_only:
            seen["finishing in flight, the rest not decoded"] += 1
        seen["prefill-only running batch not decoded"] += bool(s1.prefill_only and s1.running and not scheduled)
        seen["latch cleared by the finishing in flight"] += s0.batch_is_full and not s1.batch_is_full and any(
            rid in queued and rid not in s1.running for rid in s0.running)


MUST_SEE = (*cases.MUST_SEE, "retract", "in flight", "decoded again with its token in flight", "finishing in flight",
            "finishing in flight left the running batch", "retracted with its token in flight (lost)",
            "cancelled in flight", "input-length abort cancelled in flight",
            "input-length abort rejected at its landing",
            "... after being decoded once more", "row of a request ended since its launch skipped",
            "prefill-only running batch not decoded", "latch cleared by the finishing in flight",
            "finishing in flight, the rest not decoded")


def test_random_runs_reach_every_mechanism_of_the_overlap_loop():
    seen: Counter = Counter()
    for cfg, workload in all_cases():
        coverage(simulate(cfg, workload, max_steps=MAX_STEPS), seen)
    missing = [what for what in MUST_SEE if seen[what] == 0]
    assert not missing, (missing, seen)
    assert seen["finishing in flight scheduled (must not be)"] == 0, seen


# -- the Z3 relation ----------------------------------------------------------------------------------
def paged_structure_case(template: EngineConfig, rng: random.Random):
    cfg = paged_cfg(rng, template.options)
    return cfg, paged_workload(rng, cfg.block_size)


def _structures():
    return [pytest.param(overlap(t), cases.structure_case, id=name) for name, t in cases.structures()] + [
        pytest.param(EngineConfig("sglang", 8, 6, 48, 3, options=paged_options()), paged_structure_case, id="paged")]


@pytest.mark.parametrize("template,case", _structures())
def test_relation_accepts_every_simulator_step(template, case):
    """The relation built once per structure (knobs, workload and pre-state symbolic) accepts every step of random
    simulator runs in the overlap loop (compiled evaluation; Z3's own simplifier on the first two runs)."""
    assert not template.options.disable_overlap_schedule
    checker = CompiledRelation(CORE, template, cases.SLOTS + 1)
    rng = random.Random(20_000)
    steps = in_flight = 0
    for trace in relation_runs(checker, lambda: case(template, rng), RELATION_RUNS, 2):
        steps += len(trace.records)
        in_flight += sum(bool(s.sched.in_flight) for s in trace.states)
    assert steps > 3 * RELATION_RUNS and in_flight > RELATION_RUNS


def test_the_solver_accepts_short_runs_and_refuses_a_wrong_in_flight_set():
    """The solver's own relation check (one query a step) accepts short overlap runs, as the compiled relation does;
    a post-state with the batch in flight forgotten, or with the prefill-only flag flipped, is refused by both."""
    template = overlap(cases.structures()[0][1])
    rng = random.Random(3)
    n = 2
    compiled = CompiledRelation(CORE, template, n)
    checked = 0
    while checked < 3:
        cfg, workload = cases.structure_case(template, rng)
        workload = Workload(workload.requests[:n])
        trace = simulate(cfg, workload, max_steps=40)
        if len(trace.records) < 3 or not any(s.sched.in_flight for s in trace.states[1:6]):
            continue
        trace = dataclasses.replace(trace, states=trace.states[:6], records=trace.records[:5])
        solver = RelationChecker(CORE, cfg, n)
        assert solver.rejects(cfg, workload, trace) is None, (cfg, workload)
        assert compiled.rejects(cfg, workload, trace) is None
        checked += 1
    t = next(t for t, s in enumerate(trace.states[1:], 1) if s.sched.in_flight)
    for wrong in ({"in_flight": ()}, {"prefill_only": not trace.states[t].sched.prefill_only}):
        bad = dataclasses.replace(trace, states=list(trace.states))
        bad.states[t] = dataclasses.replace(bad.states[t], sched=dataclasses.replace(bad.states[t].sched, **wrong))
        assert solver.rejects(cfg, workload, bad) is not None, wrong
        assert compiled.rejects(cfg, workload, bad) is not None, wrong


# -- invariants -------------------------------------------------------------------------------------------
def test_invariants_hold_on_random_runs():
    held = Counter()
    for seed in SEEDS[::3]:
        cfg, workload = random_case(seed)
        k, p = Knobs.of(cfg), Params.of(workload)
        for t, s in enumerate(run_core(CORE, k, p, max_steps=MAX_STEPS).states):
            inv = CORE.invariants(CONCRETE, k, p, s)
            bad = [name for name, c in inv.items() if not c]
            assert not bad, (seed, t, bad, cfg, workload)
            held["decoding in flight"] += any(r["in_flight"] and r["phase"] == DECODING for r in s.req)
            held["ended in flight"] += any(r["in_flight"] and r["phase"] > DECODING for r in s.req)
            held["prefill only"] += s.g["prefill_only"]
    assert held["decoding in flight"] > 1000 and held["ended in flight"] > 10 and held["prefill only"] > 10, held


OVERLAP_INVARIANTS = {"r0.in-flight-launched", "r1.doomed-queued", "prefill-only-asked-nothing", "r1.decode-cursor",
                      "latch-only-with-a-batch"}


def _obligations(core, block_size: int):
    cfg = overlap(C.sglang(block_size=block_size))
    knobs, cons = symbolic_knobs(cfg, C.SGLANG_ANY)
    params = any_params(2)
    return check_obligations(core, knobs, params, cons + workload_constraints(params), core.invariants, 120,
                             batch=True)


@pytest.mark.parametrize("block_size", [1, 4])
def test_invariants_are_inductive_on_two_slots(block_size):
    """Pool, budget and batch cap symbolic (pool >= 7 pages: the policy's own floor), any workload, 2 slots."""
    obligations = _obligations(CORE, block_size)
    failed = [o.line() for o in obligations if o.status != "proved"]
    assert not failed, failed
    assert OVERLAP_INVARIANTS <= {o.invariant for o in obligations}


def test_the_normal_loops_decode_cursor_is_not_inductive_in_the_overlap_loop():
    """The induction is not vacuous: event_loop_normal's decode-cursor (computed = prompt + generated - 1 for every
    decoder) fails its step obligation in the overlap loop, where a launched request's token has not landed."""
    class Sync(type(CORE)):
        def decode_cursor(self, ops, k, p, s, i):
            return Core.decode_cursor(self, ops, k, p, s, i)

    obligations = _obligations(Sync(), 1)
    assert any(o.status == "failed" and o.invariant.endswith("decode-cursor") for o in obligations)


@pytest.mark.parametrize("drop", ["prefill-only-asked-nothing", "in-flight-launched", "doomed-queued"])
def test_each_overlap_invariant_is_needed_by_the_below_clip_twin(drop):
    """sglang-ignore-eos-below-clip in the default loop (proofs/modes.py; `prove --loop default` proves it for up to 3
    requests, tests/symbolic/test_modes.py): at n = 2, without the overlap-only invariant `drop` (doomed-queued: its
    overlap form) some obligation is not proved, so each is needed (prefill-only-asked-nothing by the property: a
    prefill-only flag over a request that asked for output would never decode it)."""
    twin = modes.in_default_loop(next(c for c in C.CLAIMS if c.name == "sglang-ignore-eos-below-clip"))
    full = R.invariant_set(twin)
    obligations, prop = R.prove(twin, 2, 1, 120)
    assert all(o.status == "proved" for o in obligations + [prop]), [o.line() for o in obligations + [prop]]
    without = lambda ops, k, p, s: {n: c for n, c in full(ops, k, p, s).items() if not n.endswith(drop)}  # noqa: E731
    obligations, prop = R.prove(twin, 2, 1, 120, invariants=without)
    assert any(o.status != "proved" for o in obligations + [prop])

