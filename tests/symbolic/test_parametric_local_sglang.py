"""checkers/parametric/local_sglang.py: SGLang's no-progress claims (radix cache off, chunked prefill
off, FCFS, ignore_eos; page size 1, and pages of 4, 8 and 16 tokens) for any number of requests, one
request at a time with the others as an environment, and what must fail.

- the abstraction: the one-slot step with slot i's recorded reads (the prefill turn's selected by its
  place in the queue) is the core's step for slot i, n = 1..3; a view that leaves one of them to the
  one slot (unsound) is not;
- the distinguished requests: on the core (n = 1..4) some batch member reads preference rank 0 with
  some kept, with no batch member the head of waiting reads the pass's start, and an admission
  schedules a request;
- both on every state of concrete runs with 5-12 or 16 requests; an unsound view shows on some run;
- every obligation proves; each per-request invariant, dropped, fails one;
- without the class (a request at the arrival clip's own bound) or with 8-token pages, progress fails
  at the head of waiting, where the refuted claims' stalls are;
- the argument's premise (one code with or without an environment) fails on the sglang core, so `prove`
  keeps both claims to their slot proofs and names it, the paged one at each page size.
"""

import dataclasses
import random

import pytest

from checkers.induction import symbolic_knobs
from checkers.parametric import local_sglang
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES
from model.symbolic.run import run_core
from model.symbolic.slots import DECODING, PREEMPTED, WAITING, Knobs, Params
from proofs import claims as C
from proofs import run as R
from helpers import not_proved

CLAIM = next(c for c in C.CLAIMS if c.name == "sglang-ignore-eos-below-clip")
PAGED = next(c for c in C.CLAIMS if c.name == "sglang-ignore-eos-paged")


def knobs():
    return symbolic_knobs(CLAIM.design, CLAIM.knob_bounds)


def test_the_sglang_claims_expected_to_hold_use_the_argument():
    holding = [c for c in C.CLAIMS if c.policy == "sglang" and c.expected == C.HOLDS]
    assert [c.name for c in holding] == [CLAIM.name, PAGED.name]
    assert all(c.parametric == "local" for c in holding)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_one_request_with_its_recorded_reads_is_the_core(n):
    k, cons = knobs()
    assert local_sglang.refines(k, cons, n, 300) == ("proved", "")


# each read, left to the one slot, changes some slot's step at the n given (the others coincide with
# the one slot's own value up to n = 3, or are overwritten before they matter: docs/symbolic.md)
UNSOUND = [("wait.rank_end", 2), ("merge.rank_kept", 2), ("merge.rank_member", 2), ("prefill.n_wait", 2),
           ("prefill.going", 2), ("prefill.count", 2), ("prefill.total_offset", 2), ("prefill.current_offset", 2),
           ("prefill.bs", 2), ("prefill.freed", 2), ("prefill.left_bs", 2), ("prefill.others_bad", 2),
           ("decode.fits_all", 2), ("decode.rank", 2), ("decode.abort", 2),
           ("prefill.n_run", 3), ("decode.n_keep", 3), ("decode.requeue_rank", 3)]


@pytest.mark.parametrize("skip,n", UNSOUND, ids=[s for s, _ in UNSOUND])
def test_a_view_that_leaves_a_read_to_the_one_request_is_not(skip, n):
    k, cons = knobs()
    assert local_sglang.refines(k, cons, n, 300, skip=(skip,))[0] == "failed"


# the six reads docs/symbolic.md says coincide with the one slot's own value up to n = 3 (or never reach its
# fields there): read of the environment all the same, since nothing makes them coincide for larger n
COINCIDING = ["wait.rank_start", "prefill.free", "prefill.rem_input", "prefill.oom", "prefill.prefilled",
              "decode.n_run"]


@pytest.mark.parametrize("skip", COINCIDING)
def test_the_reads_that_coincide_with_the_one_slot_up_to_three_requests(skip):
    k, cons = knobs()
    assert local_sglang.refines(k, cons, 3, 300, skip=(skip,)) == ("proved", "")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_distinguished_requests_read_what_the_argument_assumes_on_the_core(n):
    k, cons = knobs()
    assert local_sglang.head_env(k, cons, n, 300) == ("proved", "")


def concrete_cases(seed: int, runs: int = 20):
    """Designs and workloads of the claim's class with 5-12 or 16 requests: small pools and budgets (queues,
    the latch, refused admissions), cancellations queued and in flight."""
    rng = random.Random(seed)
    for _ in range(runs):
        pool = rng.randint(7, 40)
        cfg = C.sglang(num_blocks=pool, max_num_tokens=rng.randint(4, 48), max_batch_size=rng.randint(1, 17))
        reqs = []
        for _ in range(rng.choice([rng.randint(5, 12), 16])):
            prompt = rng.randint(1, pool - 4)
            reqs.append(RequestSpec(prompt, rng.randint(1, pool - prompt - 3), arrival=rng.randint(0, 6),
                                    cancel_at=rng.choice([None] * 4 + [rng.randint(0, 20)])))
        yield cfg, Workload(tuple(reqs))


def test_the_abstraction_and_the_distinguished_requests_hold_on_concrete_runs_of_up_to_16_requests():
    """Beyond the n the solver checks: every state of 20 concrete runs of the core, 5-12 or 16 requests, and
    the runs reach states where a request waits while a batch runs."""
    contended = 0
    for cfg, workload in concrete_cases(5):
        assert local_sglang.concrete_disagreement(cfg, workload) is None, (cfg, workload)
        trace = run_core(CORES["sglang"], Knobs.of(cfg), Params.of(workload), 400)
        contended += sum(any(r["phase"] in (WAITING, PREEMPTED) for r in s.req) and
                         any(r["phase"] == DECODING for r in s.req) for s in trace.states)
    assert contended >= 200


@pytest.mark.parametrize("skip", ["prefill.count", "prefill.current_offset", "merge.rank_kept", "wait.rank_end"])
def test_an_unsound_view_shows_on_some_concrete_run(skip):
    assert any(local_sglang.concrete_disagreement(cfg, workload, skip=(skip,)) is not None
               for cfg, workload in concrete_cases(5))


def test_every_obligation_of_the_argument_proves():
    k, cons = knobs()
    parts = local_sglang.obligations(CLAIM.design, k, cons, 600, CLAIM.invariants, CLAIM.workload)
    assert not_proved(parts) == []
    assert {action for action, *_ in parts} == {"refines", "heads", "local", "progress"}


@pytest.mark.parametrize("drop", local_sglang.LOCAL_INVARIANTS)
def test_each_per_request_invariant_is_needed(drop):
    k, cons = knobs()
    names = tuple(x for x in local_sglang.LOCAL_INVARIANTS if x != drop)
    assert not_proved(local_sglang.local_invariants(k, cons, 120, CLAIM.workload, names) +
                      local_sglang.progress(k, cons, 120, CLAIM.workload, names)), drop


def test_without_the_class_the_head_of_waiting_stalls_at_the_clip():
    """A request asking for what the arrival clip lets through is refused on an empty engine (the refuted
    claim sglang-ignore-eos-clip-stall): only the head of waiting's obligation fails."""
    k, cons = knobs()
    parts = local_sglang.obligations(CLAIM.design, k, cons, 600, None, None)
    assert not_proved(parts) == [("progress", "the head of waiting is admitted")]


def test_with_pages_of_8_tokens_the_head_of_waiting_may_stall():
    """Pages of 8 round a queued request's context up by more than the class leaves (a retracted request's
    prompt plus outputs, a page more than its prompt): the claim is not extended to that design, and
    sglang-ignore-eos-paged leaves that page."""
    design = C.sglang(block_size=8)
    k, cons = symbolic_knobs(design, CLAIM.knob_bounds)
    parts = local_sglang.obligations(design, k, cons, 600, None, CLAIM.workload)
    assert not_proved(parts) == [("progress", "the head of waiting is admitted")]


def test_the_argument_refuses_what_the_core_does_not_express():
    radix = dataclasses.replace(CLAIM.design, options=dataclasses.replace(CLAIM.design.options,
                                                                          disable_radix_cache=False))
    assert "disable_radix_cache" in local_sglang.covers(radix, "LIVE-NO-PROGRESS")
    assert local_sglang.covers(CLAIM.design, "SAFE-BUDGET") is not None
    assert local_sglang.covers(C.hf(), "LIVE-NO-PROGRESS") is not None


def test_prove_keeps_both_claims_to_their_slot_proofs():
    """The argument's premise does not hold of the sglang core (checkers/parametric/sealed.py `mode_blind`):
    `prove` reports up to 3 requests, names it, once per page size of the paged claim, as the claims expect."""
    v = R.decide_induction(CLAIM, 600)
    assert v.as_expected and v.status == "proved" and v.scope == 3, v.line
    assert "not for any number of requests: sealed one code with or without an environment: failed" in v.line
    v = R.decide_induction(PAGED, 900)
    assert v.as_expected and v.status == "proved" and v.scope == 3, v.line
    premises = {o.invariant for label, o in v.obligations if label == "any n"}
    assert premises == {f"block_size={b} one code with or without an environment" for b in (4, 8, 16)}
