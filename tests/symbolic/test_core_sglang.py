"""The sglang core (model/symbolic/cores/sglang.py): what it refuses, and the searches over it. Its runs are held
to the policy by tests/symbolic/test_core_differential.py."""

import dataclasses
from collections import Counter
from pathlib import Path

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import sglang as cases
from checkers import bmc
from checkers.replay import replay
from model.config import EngineConfig, cdiv
from model.policies.sglang import Options as SglangOptions, max_req_input_len
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload, simulate
from model.symbolic.core import CORES
from model.symbolic.ops import Concrete
from model.symbolic.run import run_core
from model.symbolic.slots import Knobs, Params
from proofs import claims as C
from proofs import run as R
from schedproof.checkspec import load_check


def Options(**options) -> SglangOptions:
    """event_loop_normal, the loop these tests search (the overlap loop, SGLang's default, has its own tests:
    tests/symbolic/test_core_sglang_overlap.py)."""
    return SglangOptions(**{"disable_overlap_schedule": True, **options})


ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["sglang"]


def test_refuses_what_it_does_not_model():
    base = EngineConfig("sglang", 1, 64, 64, 4, options=Options(ignore_eos=True, disable_radix_cache=True))
    assert CORE.unsupported(base) is None
    overlap = dataclasses.replace(base, options=dataclasses.replace(base.options, disable_overlap_schedule=False))
    assert CORE.unsupported(overlap) is None     # SGLang's default loop, event_loop_overlap: expressed
    ratio = dataclasses.replace(base, options=Options(ignore_eos=False, disable_radix_cache=True))
    assert CORE.unsupported(ratio)[0] == "engine.options.ignore_eos"
    tree = dataclasses.replace(base, options=Options(ignore_eos=True))
    assert CORE.unsupported(tree)[0] == "engine.options.disable_radix_cache"
    chunked = dataclasses.replace(base, chunked_prefill=True)
    assert CORE.unsupported(chunked)[0] == "engine.chunked_prefill"
    ranked = dataclasses.replace(base, options=Options(ignore_eos=True, disable_radix_cache=True,
                                                       enable_priority_scheduling=True))
    assert CORE.unsupported(ranked)[0] == "engine.options.enable_priority_scheduling"
    bad = dataclasses.replace(base, block_size=4, chunked_prefill=True, options=Options(ignore_eos=True,
                                                                                       chunked_prefill_size=6))
    assert CORE.unsupported(bad)[0] == "engine.options.chunked_prefill_size"   # the policy's own refusal


def test_check_finds_the_clip_stall_from_ranges():
    """`schedproof check scenarios/check/sglang-ignore-eos-ranges.toml`: a lone request on an empty engine, never
    admitted; the search is given no hint of the mechanism, and the request it finds is one whose max_new the
    arrival clip cut to exactly the memory bound C - ceil_page(P) - page - 1. About 60-180 CPU seconds."""
    spec = load_check(str(ROOT / "scenarios" / "check" / "sglang-ignore-eos-ranges.toml"))
    result = bmc.search(CORE, spec.space, spec.max_depth, timeout=600, properties=list(spec.properties))
    assert result.status == "violated" and result.cex.property == "LIVE-NO-PROGRESS", (result.status, result.reason)
    rep = replay(result.cex)
    assert rep.ok, rep.message
    trace = rep.trace
    cfg, final = trace.cfg, trace.final
    assert trace.end == "fixpoint" and not any(rec.scheduled for rec in trace.records)
    page, pool = cfg.block_size, cfg.num_blocks * cfg.block_size
    rid = final.sched.waiting[0]
    assert final.sched.cap(rid) == pool - cdiv(final.req(rid).prompt, page) * page - page - 1


def test_check_finds_the_page_rounding_stall_from_ranges():
    """`schedproof check scenarios/check/sglang-page-rounding-ranges.toml` (#39271's mechanism): outputs too short
    for the arrival clip to bind, so the stall found must be a prompt the input check accepts whose page-rounded
    size plus a page exceeds the pool. A few CPU seconds."""
    spec = load_check(str(ROOT / "scenarios" / "check" / "sglang-page-rounding-ranges.toml"))
    result = bmc.search(CORE, spec.space, spec.max_depth, timeout=600, properties=list(spec.properties))
    assert result.status == "violated" and result.cex.property == "LIVE-NO-PROGRESS", (result.status, result.reason)
    assert result.scope == "" and result.depth == 2        # certified shortest over the whole space
    rep = replay(result.cex)
    assert rep.ok, rep.message
    cfg, final = rep.trace.cfg, rep.trace.final
    assert rep.trace.end == "fixpoint" and not any(rec.scheduled for rec in rep.trace.records)
    page, pool = cfg.block_size, cfg.num_blocks * cfg.block_size
    prompt = final.req(final.sched.waiting[0]).prompt
    assert prompt < max_req_input_len(cfg) and cdiv(prompt, page) * page + page > pool


def test_below_the_clip_bound_a_lone_request_is_admitted():
    """Control: with context_len one below the pool, max_req_len (not the memory bound) clips max_new, one token
    lower, and no run of up to 2 requests stalls within the depth."""
    spec = load_check(str(ROOT / "scenarios" / "check" / "sglang-ignore-eos-ranges.toml"))
    opts = dataclasses.replace(spec.space.template.options, context_len=spec.space.template.num_blocks - 1)
    space = dataclasses.replace(spec.space, template=dataclasses.replace(spec.space.template, options=opts),
                                groups=tuple(dataclasses.replace(g, count=(1, 2)) for g in spec.space.groups))
    result = bmc.search(CORE, space, 4, timeout=600, properties=["LIVE-NO-PROGRESS"])
    assert result.status == "bounded", (result.status, result.reason)


def test_the_cores_subset_never_retracts_and_a_quarter_of_its_random_runs_stall():
    """What docs/fidelity/sglang.md and the clip-stall finding say of the differential harness's random runs
    (tests/symbolic/cases/sglang.py): with ignore_eos no run retracts (admission's finish-order simulation reserves
    every running request's whole remaining output), and about a quarter end stuck, every one at the clip stall."""
    ends, retractions = Counter(), 0
    for seed in range(cases.DIFF_RUNS):
        cfg, workload = cases.random_case(seed)
        trace = simulate(cfg, workload, cases.MAX_STEPS)
        ends[trace.end] += 1
        retractions += sum(len(rec.preempted) for rec in trace.records)
        if trace.end == "fixpoint" and trace.final.sched.waiting:
            reason = POLICIES["sglang"].stall_reason(cfg, trace.final)
            assert reason and "add_one_req_ignore_eos" in reason, (seed, reason)
    assert retractions == 0
    assert ends["fixpoint"] >= cases.DIFF_RUNS // 5, ends


def test_the_latch_is_set_only_while_a_request_is_in_a_batch():
    """What the latch can wedge in 0.5.23's normal loop: nothing. `latch-only-with-a-batch` (set only while a
    request is in the running batch or the last prefill batch, so the filter that empties them clears it) is part
    of the inductive invariant `prove` establishes for `sglang-ignore-eos-below-clip`; it holds on every state of
    a run that latches, and fails on a state latched with empty batches (#39271's persistent latch)."""
    claim = next(c for c in C.CLAIMS if c.name == "sglang-ignore-eos-below-clip")
    obligations, progress = R.prove(claim, 2, 1, 120)
    latch = [o for o in obligations if o.invariant == "latch-only-with-a-batch"]
    assert {o.action for o in latch} == {"init", "step"} and all(o.status == "proved" for o in latch)
    assert progress.status == "proved", progress.line()

    # r0 runs; r1 asks more than is left: NO_TOKEN while r0 runs sets the latch
    cfg = EngineConfig("sglang", 1, 24, 64, 4, options=Options(ignore_eos=True, disable_radix_cache=True))
    k, p = Knobs.of(cfg), Params.of(Workload((RequestSpec(4, 10), RequestSpec(4, 8, arrival=1))))
    states = run_core(CORE, k, p, max_steps=40).states
    latched = [s for s in states if s.g["full"]]
    assert latched and all(CORE.core_invariants(Concrete(), k, p, s)["latch-only-with-a-batch"] for s in states)
    stale = latched[0].copy()
    for r in stale.req:
        r["rpos"], r["lpos"] = -1, -1
    assert not CORE.core_invariants(Concrete(), k, p, stale)["latch-only-with-a-batch"]
