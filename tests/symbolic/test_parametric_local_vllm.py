"""checkers/parametric/local_vllm.py: vLLM V1's no-progress claims (FCFS, prefix caching off) for any
number of requests, one request at a time with the others as an environment, and what must fail.

- the abstraction: the one-slot step with slot i's recorded reads (selected by its position in each
  loop) is the core's step for slot i, n = 1..3; a view that leaves one of them to the one slot
  (unsound) is not;
- the heads' environments: on the core (n = 1..4) the head of `running` reads the loop's start and
  a free count that with its `above` and its own pages is the pool; with `running` empty the head of
  `waiting` reads the start with the pool free;
- both, the abstraction and the heads, on every state of concrete runs with 5-12 or 16 requests; an unsound
  view shows on some run;
- every obligation proves for both claims, and under each scheduler knob the slot proofs vary; each
  per-request invariant, dropped, fails one;
- without the class's budget condition (chunked prefill off), or at the recompute wedge's
  design, progress fails where the wedge is;
- with prefix caching (no shared prefixes): the reads of the request's own cached run that the others'
  allocations shrink (at its waiting turn, after the loops) and its queue rank, each needed at n = 2;
  on concrete runs where queued requests' runs are evicted and hit back, and the promise that the
  others only shrink a run holds of every recorded read; each pool invariant needed; a class that
  allows shared prefixes is refused;
- the argument's premise (one code with or without an environment) fails on the vllm_v1 core, so `prove`
  keeps all three claims to their slot proofs and names it (the argument refuses PRIORITY).
"""

import dataclasses
import random

import pytest

from checkers.induction import symbolic_knobs
from checkers.parametric import local_vllm
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES
from model.symbolic.run import run_core
from model.symbolic.slots import DECODING, PREEMPTED, PREFILLING, WAITING, Knobs, Params
from proofs import claims as C
from proofs import run as R
from helpers import not_proved, sized

CLAIMS = [c for c in C.CLAIMS if c.parametric == "local" and c.policy == "vllm_v1"]
IDS = [c.name for c in CLAIMS]
CHUNKED = next(c for c in CLAIMS if c.name == "vllm-chunked-fits-alone")
WHOLE = next(c for c in CLAIMS if c.name == "vllm-whole-prefill-within-budget")
CACHING = next(c for c in CLAIMS if c.name == "vllm-chunked-fits-alone-caching")


def knobs(claim):
    return symbolic_knobs(claim.design, claim.knob_bounds)


def test_the_three_vllm_claims_expected_to_hold_use_the_argument():
    assert sorted(IDS) == ["vllm-chunked-fits-alone", "vllm-chunked-fits-alone-caching",
                           "vllm-whole-prefill-within-budget"]


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_one_request_with_its_recorded_reads_is_the_core(claim, n):
    k, cons = knobs(claim)
    assert local_vllm.refines(k, cons, n, 300) == ("proved", "")


@pytest.mark.parametrize("skip", ["running.above", "running.free", "running.preempted_before", "waiting.going",
                                  "waiting.free", "waiting.rank_after", "running.rank_after"])
def test_a_view_that_leaves_a_read_to_the_one_request_is_not(skip):
    k, cons = knobs(CHUNKED)
    assert local_vllm.refines(k, cons, 2, 300, skip=(skip,))[0] == "failed"


@pytest.mark.parametrize("skip", ["waiting.oc", "pool.oc_after", "pool.rank_after"])
def test_with_prefix_caching_a_view_that_leaves_the_own_run_to_the_one_request_is_not(skip):
    k, cons = knobs(CACHING)
    assert local_vllm.refines(k, cons, 2, 300, skip=(skip,))[0] == "failed"


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_heads_read_the_start_of_their_loops_on_the_core(claim, n):
    k, cons = knobs(claim)
    assert local_vllm.head_env(k, cons, n, 300, claim.invariants) == ("proved", "")


def test_without_the_claims_invariants_a_head_may_see_another_holder():
    """The slot core's own invariants allow an OFFLOADED request holding blocks (vLLM never has one:
    the claim's `vllm-no-suspension`); without it the head's free count and `above` miss its pages."""
    k, cons = knobs(CHUNKED)
    assert local_vllm.head_env(k, cons, 2, 300)[0] == "failed"


def concrete_cases(seed: int, runs: int = 20):
    """Designs and workloads of the two claims' classes with 5-12 or 16 requests: chunked prefill on and off
    by turns, small pools (preemptions), early stops and cancellations."""
    rng = random.Random(seed)
    for run in range(runs):
        chunked = run % 2 == 0
        blocks, budget = rng.randint(3, 8), rng.randint(8, 64)
        cfg = C.vllm(blocks, budget, 16, rng.randint(1, min(17, budget)), chunked_prefill=chunked,
                     enable_prefix_caching=False)
        yield cfg, random_requests(rng, blocks, 60, None if chunked else budget)


def random_requests(rng, blocks: int, most_prompt: int, budget=None) -> Workload:
    """5-12 or 16 requests that fit a pool of `blocks` 16-token blocks alone (and, with `budget`, whose
    prompt plus output fit it), with arrivals, early stops and cancellations."""
    reqs = []
    for _ in range(rng.choice([rng.randint(5, 12), 16])):
        while True:
            prompt, max_new = rng.randint(1, most_prompt), rng.randint(1, 60)
            if -(-(prompt + max_new - 1) // 16) <= blocks - 1 and (budget is None or prompt + max_new <= budget):
                break
        reqs.append(RequestSpec(prompt, max_new, arrival=rng.randint(0, 6),
                                output_len=rng.choice([None, None, rng.randint(1, max_new)]),
                                cancel_at=rng.choice([None] * 4 + [rng.randint(0, 20)])))
    return Workload(tuple(reqs))


def test_the_abstraction_and_the_heads_hold_on_concrete_runs_of_up_to_16_requests():
    """Beyond the n the solver checks: every state of 20 concrete runs of the core, 5-12 or 16 requests."""
    preempting = 0
    for cfg, workload in concrete_cases(5):
        assert local_vllm.concrete_disagreement(cfg, workload) is None, (cfg, workload)
        trace = run_core(CORES["vllm_v1"], Knobs.of(cfg), Params.of(workload), 400)
        preempting += sum(any(r.flags["preempted"]) for r in trace.records)
    assert preempting >= 10


@pytest.mark.parametrize("skip", ["running.free", "running.above", "running.preempted_before", "waiting.free"])
def test_an_unsound_view_shows_on_some_concrete_run(skip):
    assert any(local_vllm.concrete_disagreement(cfg, workload, skip=(skip,)) is not None
               for cfg, workload in concrete_cases(5))


def caching_cases(seed: int, runs: int = 20):
    """The caching claim's class with 5-12 or 16 requests: prefix caching on, no shared prefixes, prompts
    of several blocks (so preempted and finished requests leave cached runs), small pools."""
    rng = random.Random(seed)
    for _ in range(runs):
        blocks, budget = rng.randint(4, 10), rng.randint(8, 64)
        cfg = C.vllm(blocks, budget, 16, rng.randint(1, min(17, budget)), chunked_prefill=True)
        yield cfg, random_requests(rng, blocks, 80)


# The concrete caching runs checked whole in ci (tests/helpers.py `sized`): the first 10 of the 20 (the same seed and
# draws), 5-12 or 16 requests, meet the evictions and hits asked for with room (35 shrunk runs, 36 hits, of 20 each;
# all 20: 52, 55). Each run is checked state by state in Python, 0.1-1.7 s; alone, CPU s (2026-12-07): 16.9 -> 10.0.
CACHING_RUNS = sized(ci=10, nightly=20)


def test_with_prefix_caching_the_abstraction_holds_on_concrete_runs_where_runs_are_evicted_and_hit():
    """Every state of 20 concrete runs (10 in ci), 5-12 or 16 requests: the refinement, the heads, and the promise that
    the others only shrink a request's cached run. The runs evict queued requests' runs (a run shrinks
    between two states in which its request is queued) and hit them back (a preempted request with a
    cached run starts again)."""
    shrunk = hit = 0
    queued = {WAITING, PREEMPTED}
    for cfg, workload in caching_cases(5, CACHING_RUNS):
        assert local_vllm.concrete_disagreement(cfg, workload) is None, (cfg, workload)
        states = run_core(CORES["vllm_v1"], Knobs.of(cfg), Params.of(workload), 400).states
        for a, b in zip(states, states[1:]):
            for ra, rb in zip(a.req, b.req):
                shrunk += ra["phase"] in queued and rb["phase"] in queued and rb["oc"] < ra["oc"]
                hit += ra["phase"] == PREEMPTED and ra["oc"] > 0 and rb["phase"] in (PREFILLING, DECODING)
    assert shrunk >= 20 and hit >= 20, (shrunk, hit)


@pytest.mark.parametrize("skip", ["pool.oc_after", "pool.rank_after"])
def test_with_prefix_caching_an_unsound_view_shows_on_some_concrete_run(skip):
    """("waiting.oc", left to the one slot, fails `refines` at n = 2, which assumes no workload class;
    with the claim's class and invariants added, n = 2 shows no difference (n = 3 does), and these runs never
    do.)"""
    assert any(local_vllm.concrete_disagreement(cfg, workload, skip=(skip,)) is not None
               for cfg, workload in caching_cases(5))


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_every_obligation_of_the_argument_proves(claim):
    k, cons = knobs(claim)
    parts = local_vllm.obligations(claim.design, k, cons, 600, claim.invariants, claim.workload)
    assert not_proved(parts) == []
    assert {action for action, *_ in parts} == {"refines", "heads", "local", "progress"} | \
        ({"applies"} if claim is CACHING else set())


@pytest.mark.parametrize("options", [dict(watermark=0.1), dict(long_prefill_token_threshold=4),
                                     dict(max_num_scheduled_tokens=8), dict(max_num_active_seqs=1)],
                         ids=lambda o: next(iter(o)))
def test_the_argument_holds_under_each_scheduler_knob(options):
    """The knobs test_claims_engines.py varies for two slots (PRIORITY aside, which the argument
    refuses) keep the argument for any n: refinement for n = 1..2 and the heads for n = 1..3 here."""
    design = dataclasses.replace(CHUNKED.design, options=dataclasses.replace(CHUNKED.design.options, **options))
    k, cons = symbolic_knobs(design, CHUNKED.knob_bounds)
    parts = local_vllm.obligations(design, k, cons, 600, CHUNKED.invariants, CHUNKED.workload, refine_up_to=2,
                                   heads_up_to=3)
    assert not_proved(parts) == []


@pytest.mark.parametrize("claim,drop", [(CHUNKED, x) for x in local_vllm.LOCAL_INVARIANTS] +
                         [(CACHING, x) for x in local_vllm.POOL_INVARIANTS],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_each_per_request_invariant_is_needed(claim, drop):
    k, cons = knobs(claim)
    names = tuple(x for x in local_vllm.local_names(k) if x != drop)
    failed = not_proved(local_vllm.local_invariants(k, cons, 120, claim.invariants, claim.workload, names) +
                        local_vllm.progress(k, cons, 120, claim.invariants, claim.workload, names))
    assert failed, drop


def test_chunked_prefill_off_needs_the_budget_class_at_the_head_of_waiting():
    """Chunking off, a queued request (a recompute-preempted one among them) is admitted only whole:
    without `prompt + max_new <= max_num_batched_tokens` its head may never fit the step."""
    k, cons = knobs(WHOLE)
    parts = local_vllm.obligations(WHOLE.design, k, cons, 600, C.vllm_pages_match, C.vllm_class())
    assert not_proved(parts) == [("progress", "head of waiting scheduled")]


def test_the_recompute_wedge_design_fails_at_the_heads():
    """max_num_scheduled_tokens 2 below every replay (the refuted claim's design): no head can run."""
    wedge = next(c for c in C.CLAIMS if c.name == "vllm-whole-prefill-scheduled-tokens-wedge")
    k, cons = symbolic_knobs(wedge.design, C.VLLM_ANY)
    parts = local_vllm.obligations(wedge.design, k, cons, 600, C.vllm_pages_match, C.vllm_class())
    assert not_proved(parts) == [("progress", "head of running scheduled"), ("progress", "head of waiting scheduled")]


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_prove_keeps_the_claims_to_their_slot_proofs(claim):
    """The argument's premise does not hold of the vllm_v1 core (its one-request step takes branches of its
    own: checkers/parametric/sealed.py `mode_blind`), so `prove` reports up to 3 requests and says why, as
    the claims expect (they are not marked `any_n`)."""
    v = R.decide_induction(claim, 600)
    assert v.as_expected and v.status == "proved" and v.scope == 3, v.line
    assert "not for any number of requests: sealed one code with or without an environment: failed" in v.line
    assert "model/symbolic/cores/vllm_v1.py" in v.any_n_open


def test_with_prefix_caching_the_argument_refuses_a_class_with_shared_prefixes():
    """A shared block is held and cached for several requests at once (not one request's state)."""
    k, cons = knobs(CACHING)
    assert not_proved(local_vllm.obligations(CACHING.design, k, cons, 60, CACHING.invariants, C.vllm_class())) == \
        [("applies", "no shared prefix")]


def test_the_argument_refuses_priority():
    priority = dataclasses.replace(CHUNKED.design, options=dataclasses.replace(CHUNKED.design.options,
                                                                                policy="priority"))
    assert "PRIORITY" in local_vllm.covers(priority, "LIVE-NO-PROGRESS")
    assert local_vllm.covers(CHUNKED.design, "SAFE-BUDGET") is not None
    assert local_vllm.covers(C.hf(), "LIVE-NO-PROGRESS") is not None
    k, cons = symbolic_knobs(priority, CHUNKED.knob_bounds)
    assert not_proved(local_vllm.argument(priority, k, cons, 60)) == [("refines", "applies")]
    # a claim with the argument on a design it does not cover is not extended to any n
    with_priority = dataclasses.replace(CHUNKED, design=priority)
    labelled = []
    assert not R.decide_any_n(with_priority, 60, labelled, lambda event: None)[0]
    assert [o.status for _, o in labelled] == ["failed"]
