"""checkers/parametric/local_hf.py: transformers' fatal-error claims (FIFO and prefill-first, block
sharing and shared prefixes on) for any number of requests, one request at a time with the others as
an environment, and what must fail.

- the abstraction: the one-slot step with slot i's recorded reads is the core's step for slot i and
  makes the pass's decisions (the first call's None, the fatal error, the crash) as the core does,
  n = 1..2 (1..3: nightly); a view that leaves a read to the one slot (unsound) is not;
- the distinguished requests' facts and the environment's promises hold on the core (n = 1..3; 1..4:
  nightly), and some state picks out each kind;
- the abstraction and the facts hold on every state of concrete runs with 5-12 or 16 requests that soft-reset,
  match shared prefixes and schedule after a first call that returned None; an unsound view shows;
- every obligation proves; each per-request invariant, and each promise of the environment, dropped,
  fails one; each distinguished fact, dropped, fails its obligation; without the class (a request that
  does not fit alone) the fatal error's obligations fail, where the refuted claim `hf-too-large-fatal` is;
- the argument's premise (one code with or without an environment) fails on the hf_cb core, so `prove`
  keeps both claims to their slot proofs and names it; the obligations at both page sizes: nightly.
"""

import dataclasses
import random

import pytest

from checkers.encode import fresh_state
from checkers.induction import symbolic_knobs
from checkers.parametric import local_hf
from checkers.parametric.local import fresh_params
from model.config import EngineConfig, build_options
from model.policies.hf_cb import Options
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES
from model.symbolic.run import run_core
from model.symbolic.slots import PREEMPTED, WAITING, Knobs, Params
from proofs import claims as C
from proofs import run as R
from helpers import nightly, not_proved, sized

CLAIM = next(c for c in C.CLAIMS if c.name == "hf-fits-alone-no-fatal")
PREFILL_FIRST = next(c for c in C.CLAIMS if c.name == "hf-fits-alone-no-fatal-prefill-first")


def knobs(claim=CLAIM, block_size: int = 4):
    return symbolic_knobs(dataclasses.replace(claim.design, block_size=block_size), claim.knob_bounds)


def test_the_hf_claims_expected_to_hold_use_the_argument():
    holding = [c for c in C.CLAIMS if c.policy == "hf_cb" and c.expected == C.HOLDS]
    assert [c.name for c in holding] == [CLAIM.name, PREFILL_FIRST.name]
    assert all(c.parametric == "local" for c in holding)


# the largest sizes (n = 3 here, 4 below: 52 s and 67 s of one worker in the clean clone of 2845589) run in the
# nightly profile; the argument is not one `prove` uses for these claims (it keeps them to their slot proofs)
@pytest.mark.parametrize("n", sized(ci=[1, 2], nightly=[1, 2, 3]))
def test_one_request_with_its_recorded_reads_is_the_core(n):
    k, cons = knobs()
    assert local_hf.refines(k, cons, n, 600) == ("proved", "")


# each read, left to the one slot, changes some slot's step or decision at n = 2
UNSOUND = ["pass.wait_rank", "after.act_rank", "probe.fails", "probe.E", "batch1.E", "batch1.free", "batch1.stopped",
           "batch1.token_budget", "batch1.scheduled", "batch1.in_margin", "offload1.active_left", "offload1.room",
           "second.fits", "batch1.offload.active_left", "hash.pc"]


@pytest.mark.parametrize("skip", UNSOUND)
def test_a_view_that_leaves_a_read_to_the_one_request_is_not(skip):
    k, cons = knobs()
    assert local_hf.refines(k, cons, 2, 600, skip=(skip,))[0] == "failed"


@pytest.mark.parametrize("n", sized(ci=[1, 2, 3], nightly=[1, 2, 3, 4]))
def test_the_distinguished_requests_facts_hold_on_the_core(n):
    k, cons = knobs()
    assert local_hf.heads(k, cons, n, 600, CLAIM.invariants, CLAIM.workload) == ("proved", "")


def concrete_cases(seed: int, runs: int = 20):
    """The claims' class with 5-12 or 16 requests: every request fits the pool alone; small pools, pages of 4
    and 8, both scheduler types, any margin, block sharing mostly on and most requests in one of two
    prefix groups; arrivals, early stops and cancellations."""
    rng = random.Random(seed)
    for _ in range(runs):
        page, blocks = rng.choice([4, 4, 8]), rng.randint(3, 10)
        o = {"scheduler_type": rng.choice(["fifo", "prefill_first"]), "allow_block_sharing": rng.random() < 0.8}
        if rng.random() < 0.5:
            o["safety_margin"] = rng.choice([0.0, 0.1, 0.25, 0.5])
        cfg = EngineConfig("hf_cb", page, blocks, rng.randint(2, 24), rng.randint(1, 17), chunked_prefill=True,
                           options=build_options(Options, o))
        reqs = []
        for _ in range(rng.choice([rng.randint(5, 12), 16])):
            while True:
                prompt, max_new = rng.randint(1, 24), rng.randint(1, 12)
                if prompt + max_new - 1 <= blocks * page:
                    break
            group = rng.choice([-1, 0, 0, 1])
            reqs.append(RequestSpec(prompt, max_new, rng.randint(0, 6),
                                    rng.choice([None, None, rng.randint(1, max_new)]),
                                    rng.choice([None] * 5 + [rng.randint(0, 20)]), prefix_group=group,
                                    prefix_len=0 if group < 0 else rng.choice([prompt, rng.randint(0, prompt)])))
        yield cfg, Workload(tuple(reqs))


def test_the_abstraction_and_the_facts_hold_on_concrete_runs_of_up_to_16_requests():
    """Every state of 20 concrete runs: the refinement, the decisions and the distinguished requests'
    facts. The runs soft-reset requests, match shared prefixes, schedule after a first call that returned
    None, and pick out kept starved requests (left alone by the offload) and failed ones."""
    seen = {"soft reset": 0, "batch after None": 0, "kept": 0, "kept alone": 0, "failed": 0, "prefix match": 0}
    for cfg, workload in concrete_cases(5):
        assert local_hf.concrete_disagreement(cfg, workload) is None, (cfg, workload)
        k, p = Knobs.of(cfg), Params.of(workload)
        states = run_core(CORES["hf_cb"], k, p, 400).states
        for s, after in zip(states, states[1:]):
            seen["prefix match"] += any(r["phase"] in (WAITING, PREEMPTED) and a["shared_blocks"] > 0
                                        for r, a in zip(s.req, after.req))
            rec = local_hf.Recorder()
            _, record = CORES["hf_cb"].step(local_hf.CONCRETE, k, p, s, env=rec)
            seen["soft reset"] += any(record.flags["preempted"])
            none1 = rec.taps[("probe.none", None)]
            seen["batch after None"] += none1 and any(record.flags["scheduled"])
            for what, cond, _ in local_hf.distinguished(local_hf.CONCRETE, k, rec, len(s)):
                if what in ("kept", "failed"):
                    seen[what] += bool(cond)
            seen["kept alone"] += none1 and any(rec.notes[("probe.starved", i)] and not rec.notes[("offload1.off", i)]
                                                and rec.taps[("offload1.active_left", i)] <= 1 for i in range(len(s)))
    assert all(v >= 10 for v in seen.values()), seen


@pytest.mark.parametrize("skip", ["batch1.free", "batch1.stopped", "hash.pc", "after.act_rank", "offload1.active_left",
                                  "second.fits", "batch1.offload.room"])
def test_an_unsound_view_shows_on_some_concrete_run(skip):
    assert any(local_hf.concrete_disagreement(cfg, workload, skip=(skip,)) is not None
               for cfg, workload in concrete_cases(5))


def test_the_argument_has_every_part():
    k, cons = knobs()
    parts = local_hf.obligations(CLAIM.design, k, cons, 600, CLAIM.invariants, CLAIM.workload, refine_up_to=1,
                                 heads_up_to=2)
    assert not_proved(parts) == []
    assert {action for action, *_ in parts} == {"refines", "heads", "scan", "local", "no-error"}


@pytest.mark.parametrize("name", sorted(local_hf._local(local_hf.SYM, knobs()[0], fresh_params(1),
                                                        fresh_state(CORES["hf_cb"], 1, "x"))))
def test_each_per_request_invariant_is_needed(name, monkeypatch):
    k, cons = knobs()
    kept = lambda k: lambda p, s: {n: c for n, c in local_hf._local(local_hf.SYM, k, p, s).items() if n != name}
    monkeypatch.setattr(local_hf, "_P", kept)
    parts = (local_hf.scan(k, cons, 120, CLAIM.invariants, CLAIM.workload) +
             local_hf.local_invariants(k, cons, 120, CLAIM.invariants, CLAIM.workload) +
             local_hf.no_error(k, cons, 120, CLAIM.invariants, CLAIM.workload))
    assert not_proved(parts) != []


@pytest.mark.parametrize("name", local_hf.COUNTS)
def test_each_promise_of_the_environment_is_needed(name, monkeypatch):
    """A read the environment promises not negative, left unconstrained, fails some obligation."""
    k, cons = knobs()
    monkeypatch.setattr(local_hf.Environment, "counts", tuple(c for c in local_hf.COUNTS if c != name))
    parts = (local_hf.local_invariants(k, cons, 120, CLAIM.invariants, CLAIM.workload) +
             local_hf.no_error(k, cons, 120, CLAIM.invariants, CLAIM.workload))
    assert not_proved(parts) != []


@pytest.mark.parametrize("obligation", ["the kept starved request: no fatal error",
                                        "the failed request, none starved: no fatal error"])
def test_each_distinguished_fact_is_needed(obligation):
    """Dropping the last fact (with one active request left, the pool less its pages; a short pool had
    blocks to evict) fails the obligation."""
    k, cons = knobs()
    parts = local_hf.no_error(k, cons, 120, CLAIM.invariants, CLAIM.workload, drop=(obligation,))
    assert [st for _, name, st, _, _ in parts if name == obligation] == ["failed"]


def test_without_the_class_the_fatal_error_is_not_ruled_out():
    """A request that does not fit alone: the kept request, alone in the pool, still does not fit
    (`hf-too-large-fatal`); a scheduled request still cannot crash its call (every prompt has a token)."""
    k, cons = knobs()
    parts = local_hf.no_error(k, cons, 120, CLAIM.invariants, None)
    assert not_proved(parts) == [("no-error", "the kept starved request: no fatal error"),
                                 ("no-error", "the failed request, none starved: no fatal error")]


def test_the_argument_covers_the_fatal_error_of_hf_cb_only():
    k, cons = knobs()
    assert local_hf.argument(CLAIM.design, k, cons, 60, prop="LIVE-NO-PROGRESS")[0][2] == "failed"
    vllm = next(c for c in C.CLAIMS if c.policy == "vllm_v1")
    assert local_hf.argument(vllm.design, k, cons, 60)[0][2] == "failed"


def test_prove_keeps_both_claims_to_their_slot_proofs():
    """The argument's premise does not hold of the hf_cb core (checkers/parametric/sealed.py `mode_blind`):
    the claims keep the scope of their slot proofs, as they expect, and the reason is named."""
    labelled = []
    any_n, why = R.decide_any_n(CLAIM, 60, labelled, lambda event: None)
    assert not any_n and "model/symbolic/cores/hf_cb.py" in why
    assert {o.invariant for _, o in labelled} == {f"block_size={b} one code with or without an environment"
                                                  for b in (4, 16)}


@nightly
def test_the_obligations_prove_at_both_page_sizes():
    """What the argument would conclude from once its premise holds: every obligation at both page sizes
    of the FIFO claim, and the prefill-first claim's (several minutes: the nightly profile)."""
    for b in (4, 16):
        design = dataclasses.replace(CLAIM.design, block_size=b)
        k, cons = symbolic_knobs(design, CLAIM.knob_bounds)
        assert not_proved(local_hf.obligations(design, k, cons, 1200, CLAIM.invariants, CLAIM.workload)) == [], b
    k, cons = symbolic_knobs(PREFILL_FIRST.design, PREFILL_FIRST.knob_bounds)
    assert not_proved(local_hf.obligations(PREFILL_FIRST.design, k, cons, 900, PREFILL_FIRST.invariants,
                                           PREFILL_FIRST.workload)) == []