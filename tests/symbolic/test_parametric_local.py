"""checkers/parametric/local.py: trtllm_v1's token-budget claims for any number of requests, one
request at a time with the others as an environment, and what must fail.

- the abstraction: the one-slot step with slot i's recorded running values is the core's step for
  slot i, n = 1..3, and on every state of concrete runs with 5-12 or 16 requests; a view that leaves one
  running value to the one slot (unsound) is not;
- MAX_UTILIZATION's capacity outcome has the environment's shape on the core (n = 1..5) and on the
  loop over arrays for every n; a loop that may pause a victim outside [cursor, end) does not;
- the argument's obligations all prove for both claims; each per-request invariant, dropped, makes
  some obligation fail (none is decoration);
- `prove` reports the GNE claim for any number of requests (its premises checked, checkers/parametric/
  sealed.py) and the MAX_UTILIZATION one up to 3 (its capacity loop's shape is proved only on a model);
- the argument refuses what it does not cover (block reuse; another property or engine).
"""

import dataclasses
import random

import pytest

from checkers.induction import symbolic_knobs
from checkers.parametric import local
from model.policies.trtllm_v1 import MAX_UTIL as MAX_UTILIZATION
from model.simulator import RequestSpec, Workload
from proofs import claims as C
from proofs import run as R
from helpers import not_proved

CLAIMS = [c for c in C.CLAIMS if c.parametric == "local" and c.policy == "trtllm_v1"]
IDS = [c.name for c in CLAIMS]
MAX_UTIL = next(c for c in CLAIMS if c.name == "v1-budget-without-reuse-max-util")


def knobs(claim):
    return symbolic_knobs(claim.design, claim.knob_bounds)


def test_both_trtllm_v1_budget_claims_use_the_argument():
    assert sorted(IDS) == ["v1-budget-without-reuse", "v1-budget-without-reuse-max-util"]


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_one_request_with_its_recorded_running_values_is_the_core(claim, n):
    k, cons = knobs(claim)
    assert local.refines(k, cons, n, 300) == ("proved", "")


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
@pytest.mark.parametrize("skip", ["micro_batch.batch_tokens", "allocate.going"])
def test_a_view_that_leaves_a_running_value_to_the_one_request_is_not(claim, skip):
    k, cons = knobs(claim)
    assert local.refines(k, cons, 2, 300, skip=(skip,))[0] == "failed"


def concrete_cases(seed: int = 7, runs: int = 20):
    """Designs and workloads of the two claims' classes with 5-12 or 16 requests arriving close together (so
    that they compete for the budget): GNE with chunked prefill and MAX_UTILIZATION without, by turns."""
    rng = random.Random(seed)
    for run in range(runs):
        util = run % 2 == 1
        options = {"draft_len": 1, **({"capacity_scheduler_policy": MAX_UTILIZATION} if util else {})}
        budget = rng.randint(8, 24)
        cfg = C.v1(rng.randint(8, 32), budget, 4, rng.randint(1, 17), chunked_prefill=not util, **options)
        reqs = [RequestSpec(rng.randint(1, 20), rng.randint(1, 20), arrival=rng.randint(0, 2),
                            output_len=rng.choice([None, None, 1]),
                            cancel_at=rng.choice([None] * 4 + [rng.randint(0, 20)]))
                for _ in range(rng.choice([rng.randint(5, 12), 16]))]
        yield cfg, Workload(tuple(reqs))


def test_one_request_is_the_core_on_concrete_runs_of_up_to_16_requests():
    """Beyond the n `refines` checks: every state of 20 concrete runs of the core, 5-12 or 16 requests."""
    for cfg, workload in concrete_cases():
        assert local.concrete_disagreement(cfg, workload) is None, (cfg, workload)


@pytest.mark.parametrize("skip", ["micro_batch.batch_tokens", "chunk_fcfs.left"])
def test_an_unsound_view_shows_on_some_concrete_run(skip):
    assert any(local.concrete_disagreement(cfg, workload, skip=(skip,)) is not None
               for cfg, workload in concrete_cases())


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_max_utilization_outcome_has_the_shape_on_the_core(n):
    k, cons = knobs(MAX_UTIL)
    assert local.capacity_shape(k, cons, n, 300) == ("proved", "")


def test_max_utilization_outcome_has_the_shape_for_any_n():
    assert not_proved(local.capacity_shape_any_n(60)) == []


def test_a_victim_outside_cursor_and_end_breaks_the_shape():
    assert not_proved(local.capacity_shape_any_n(60, mutant="victim-anywhere")) == [("capacity", "any n: turn")]


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_every_obligation_of_the_argument_proves(claim):
    """GNE: all of it. MAX_UTILIZATION: all but the capacity outcome's shape for every n on the core's own loop,
    which only a model of the loop proves (`CAPACITY_OPEN`)."""
    k, cons = knobs(claim)
    parts = local.argument(claim.design, k, cons, 600)
    assert not_proved(parts) == ([] if claim is not MAX_UTIL else [("capacity", "the core's loop for every n")])
    assert {action for action, *_ in parts} >= {"sealed", "refines", "local", "scan", "bound", "sum"}


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
@pytest.mark.parametrize("drop", local.LOCAL_INVARIANTS)
def test_each_per_request_invariant_is_needed_by_some_claim(claim, drop):
    """A dropped invariant fails an obligation for at least one of the two claims; which one is
    recorded here, so a change in what the argument rests on shows."""
    k, cons = knobs(claim)
    names = tuple(x for x in local.LOCAL_INVARIANTS if x != drop)
    failed = not_proved(local.local_invariants(k, cons, 120, names) + local.budget(k, cons, 120, names))
    # "fields" is needed by MAX_UTILIZATION (chunking off charges the whole context), not by GNE
    needed = not (drop == "fields" and claim is not MAX_UTIL)
    assert bool(failed) == needed, failed


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_prove_reports_the_scope_the_checked_premises_give(claim):
    """GNE: for any number of requests, every premise checked (`sealed`); MAX_UTILIZATION: up to 3, naming the
    capacity loop's shape, as the claim expects."""
    v = R.decide_induction(claim, 600)
    assert v.as_expected and v.status == "proved", v.line
    assert any(label == "any n" and o.invariant == "shares <= max_num_tokens" for label, o in v.obligations)
    if claim is MAX_UTIL:
        assert v.scope == 3 and "not for any number of requests: capacity the core's loop for every n: open" in v.line
    else:
        assert v.scope == "any" and "for any number of requests" in v.line and claim.any_n


def test_the_argument_refuses_block_reuse_and_other_properties():
    reuse = next(c for c in C.CLAIMS if c.name == "v1-budget-reuse-untrimmed")
    assert "block reuse" in local.covers(reuse.design, "SAFE-BUDGET")
    assert local.covers(CLAIMS[0].design, "LIVE-NO-PROGRESS") is not None
    assert local.covers(C.v2(), "SAFE-BUDGET") is not None
    k, cons = symbolic_knobs(reuse.design, C.ANY)
    assert not_proved(local.argument(reuse.design, k, cons, 60)) == [("refines", "applies")]
    # a claim with the argument on a design it does not cover is not extended to any n
    with_reuse = dataclasses.replace(CLAIMS[0], design=dataclasses.replace(
        CLAIMS[0].design, options=dataclasses.replace(CLAIMS[0].design.options, enable_block_reuse=True)))
    labelled = []
    assert not R.decide_any_n(with_reuse, 60, labelled, lambda event: None)[0]
    assert [o.status for _, o in labelled] == ["failed"]


def test_the_concrete_comparison_sees_what_each_turn_hands_on(monkeypatch):
    """A bug that leaves every request's own fields alone and changes only a running value a turn hands on (the
    micro-batch leaving its fifth request uncharged: proofs/mutants.py) shows on a concrete run only because
    the comparison includes what each turn hands on; without that part it would pass."""
    from proofs import mutants as M
    from proofs.plant import planted
    m = next(m for m in M.MUTANTS if m.name == "v1-fifth-uncharged")
    with planted(list(m.patches)):
        assert local.concrete_disagreement(m.witness.cfg, m.witness.workload) is not None
        monkeypatch.setattr(local, "handed_on_pairs", lambda rec, one, i: [])
        assert local.concrete_disagreement(m.witness.cfg, m.witness.workload) is None
