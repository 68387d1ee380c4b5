"""checkers/parametric: v2-ab-outgrowing (class C1) for any number of requests, and what must fail.

- the array model equals `Core.step` for n = 1..3 (C1's design, and the designs refuted inside C1,
  whose negative controls run in the same model); a model whose ghost sum is never decremented
  does not;
- every micro-step keeps C1's invariants for every n, and the array invariants imply the core's
  and the claim's slot invariants for n = 1..5;
- negative controls, each must fail where it should: v2-original and fix A alone (fix B's
  reservation breaks at admission), the reservation dropped (an allocation can fail), the ghost
  mutant (the pool equation breaks where pages are released), an instantiation set without the
  cursor, without the sum witness, or without the unfinished witness u;
- a bounded search's counterexample (fix A alone) replays step for step in the array model;
- `prove` says "for any number of requests" and `scope: {"requests": "any"}` only with the argument.
"""

import dataclasses
import time

import pytest
import z3

from checkers.induction import symbolic_knobs
from checkers.parametric import Setup, argument, lifting, prove_all_n, refinement, replay_counterexample, tied
from checkers.parametric.obligations import chain
from checkers.parametric.refinement import program_order
from model.symbolic.slots import Params
from proofs import claims as C
from proofs import run as R
from proofs.plant import Patch, planted
from schedproof.provereport import as_dict

AB = next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing")
ORIGINAL = next(c for c in C.CLAIMS if c.name == "v2-original")
FIX_A = next(c for c in C.CLAIMS if c.name == "v2-fix-a-alone")


def knobs(claim):
    return symbolic_knobs(claim.design, C.ANY)


def c1_class(ops, k, r):
    return C.all_outgrow(ops, k, Params([r]))


def setup(claim=AB, **kw):
    k, cons = knobs(claim)
    return Setup(k, cons, c1_class, **kw)


def not_proved(results):
    return {r.step: r.failed for r in results if r.status != "proved"}


# -- the model is the core -----------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3])
def test_one_pass_equals_core_step(n):
    r = refinement(knobs(AB)[0], n, 600)
    assert r.status == "proved", r


@pytest.mark.parametrize("claim", [ORIGINAL, FIX_A], ids=lambda c: c.name)
def test_refuted_designs_are_the_core_too(claim):
    assert refinement(knobs(claim)[0], 2, 600).status == "proved"


def test_other_options_are_the_core_too():
    """Recompute pause off and a draft token: the branches C1 never takes are the core's as well."""
    design = dataclasses.replace(AB.design, options=dataclasses.replace(
        AB.design.options, enable_recompute_pause=False, draft_len=1, max_util_for_resume=0.5))
    assert refinement(symbolic_knobs(design, C.ANY)[0], 2, 600).status == "proved"


def test_a_ghost_not_decremented_is_not_the_core():
    r = refinement(knobs(AB)[0], 2, 600, mutant="ghost-no-release")
    assert r.status == "failed" and "S_blocks" in r.detail


# -- the proof for every n --------------------------------------------------------------------
def test_c1_is_proved_for_every_n():
    t0 = time.monotonic()
    results = prove_all_n(setup(), 600)
    assert not_proved(results) == {}
    assert [r.step for r in results] == ["init"] + [s.name for s in chain()]
    assert time.monotonic() - t0 < 300


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_array_invariants_imply_the_slot_invariants(n):
    k, _ = knobs(AB)
    assert lifting(k, n, R.invariant_set(AB), c1_class).status == "proved"


def test_without_the_reservation_the_slot_reservation_is_not_implied():
    k, _ = knobs(AB)
    r = lifting(k, 3, R.invariant_set(AB), c1_class, drop=("reservation",))
    assert r.status == "failed" and "reservation" in r.detail


# -- negative controls ----------------------------------------------------------------------
@pytest.mark.parametrize("claim", [ORIGINAL, FIX_A], ids=lambda c: c.name)
def test_designs_refuted_in_c1_do_not_prove(claim):
    """Without fix B nothing checks the worst cases at admission: `reservation` breaks in ctx_a."""
    bad = not_proved(prove_all_n(setup(claim), 600))
    assert set(bad) == {"ctx_a"} and "reservation" in bad["ctx_a"]


def test_dropping_the_reservation_breaks_the_proof():
    """An allocation may then fail: the evict/pause loops become reachable (`pass`) in gen_a."""
    bad = not_proved(prove_all_n(setup(drop=("reservation",)), 600))
    assert "gen_a" in bad and "pass" in bad["gen_a"]


def test_a_ghost_not_decremented_on_release_breaks_the_pool_equation():
    bad = not_proved(prove_all_n(setup(mutant="ghost-no-release"), 600))
    assert set(bad) == {"arrive", "exec"}            # cancellation and completion release pages
    assert all("blocks-conserved" in failed for failed in bad.values())


@pytest.mark.parametrize("omit,step,goal", [
    ("witness", "ctx_a", "ctx-progress"),   # the gate at the first context needs S_B = 0 from "no part is > 0"
    ("u", "ctx-exit", "progress"),          # the unfinished request is what contradicts "nothing scheduled"
    ("c", "gen_a", "reservation"),          # the cursor's own index
])
def test_an_instantiation_set_without_a_needed_index_fails(omit, step, goal):
    bad = not_proved(prove_all_n(setup(omit=(omit,)), 600))
    assert step in bad and goal in bad[step], bad


def test_contradictory_hypotheses_are_refused():
    """A class that no request satisfies would prove everything: every query checks its hypotheses."""
    k, cons = knobs(AB)
    results = prove_all_n(Setup(k, cons + [k.num_blocks < 1], c1_class), 60, only=("init", "gen_a"))
    assert [r.status for r in results] == ["failed", "failed"]
    assert results[1].failed == ["hypotheses not satisfiable (vacuous)"]


def test_cdiv_is_at_least_one_page_for_a_token():
    """The page fact the queries add beyond ops.page_facts, proved of cdiv for every block size."""
    t, b = z3.Ints("t b")
    s = z3.Solver()
    s.add(t >= 1, b >= 1, (t + b - 1) / b < 1)
    assert s.check() == z3.unsat


# -- traces -----------------------------------------------------------------------------------
def test_fix_a_alone_counterexample_replays_in_the_array_model():
    v = R.decide_bmc(FIX_A, 300)
    assert v.status == "refuted", v.line
    ok, msg = replay_counterexample(v.cex)
    assert ok, msg


# -- prove ------------------------------------------------------------------------------------
def test_prove_says_any_number_only_with_the_argument_and_its_premises():
    """The argument's first parts are its premises (refinement.py `tied`): the core's step is the micro-steps and
    runs them in the proofs' order. Without an argument the claim keeps its slot proofs' scope."""
    two = dataclasses.replace(AB, slots=(2,))
    v = R.decide_induction(two, 600)
    assert v.status == "proved" and v.scope == "any" and v.as_expected, v.line
    assert v.line.startswith("proved for any number of requests (class: C1")
    assert as_dict(v)["scope"] == {"requests": "any"} and as_dict(v)["any_n_open"] is None
    assert {label for label, _ in v.obligations} == {"n=2", "any n"}
    premises = [o.invariant for label, o in v.obligations if label == "any n"][:2]
    assert premises[0].startswith("the core's step is the micro-steps") and premises[1].startswith("the micro-steps run")
    bounded = R.decide_induction(dataclasses.replace(two, parametric=None, any_n=False), 600)
    assert bounded.scope == 2 and bounded.line.startswith("proved for up to 2 requests")
    assert as_dict(bounded)["scope"] == {"requests": 2} and as_dict(bounded)["any_n_open"] is None


def test_the_core_is_the_micro_steps_and_runs_them_in_the_proofs_order():
    """`tied`'s two checks, and each with a control that fails it: a core that runs its own pass instead of the
    micro-steps (as before 2026-12-05), and a driver that runs the eviction loop upwards."""
    k, _ = knobs(AB)
    assert tied(k)[0][2] == "proved" and tied(k)[1][2] == "proved"
    own_pass = Patch("model.symbolic.cores.trtllm_v2", "        if micro.unsupported(k) is None:\n",
                     "        if False:\n")
    with planted([own_pass]):
        (_, name, st, _, why), _ = tied(k)
    assert st == "failed" and "differs from the micro-steps" in why
    upwards = Patch("model.symbolic.cores.trtllm_v2_micro", "                for j in range(n - 1, c, -1):\n"
                    "                    st = run(self.evict, st, c, j)\n",
                    "                for j in range(c + 1, n):\n                    st = run(self.evict, st, c, j)\n")
    with planted([upwards]):
        st, why = program_order(k, 4)
    assert st == "failed" and "evict" in why


def test_argument_reports_each_part():
    k, cons = knobs(AB)
    parts = argument(k, cons, c1_class, R.invariant_set(AB), 600, refine_up_to=1, lift_up_to=1)
    assert {a for a, *_ in parts} == {"refines", "lifts", "any-n"}
    assert all(status == "proved" for _, _, status, _, _ in parts)


# -- the repair B* (v2-ab-reserve-all): every request reserved, class C0 ----------------------------

RESERVE_ALL = next(c for c in C.CLAIMS if c.name == "v2-ab-reserve-all")


def c0_class(ops, k, r):
    return C.every_request_fits_alone(ops, k, Params([r]))


def test_reserve_all_is_the_core_too():
    assert refinement(knobs(RESERVE_ALL)[0], 2, 600).status == "proved"


def test_reserve_all_is_proved_for_every_n_in_c0():
    k, cons = knobs(RESERVE_ALL)
    assert not_proved(prove_all_n(Setup(k, cons, c0_class), 600)) == {}
    for n in (1, 2, 3):
        assert lifting(k, n, R.invariant_set(RESERVE_ALL), c0_class).status == "proved"


def test_fix_b_without_the_repair_does_not_prove_in_c0():
    """The design refuted by v2-ab-mixed (B reserves only the requests that can outgrow): in C0 an
    allocation of an unreserved request can fail, so the argument breaks where growth is allocated."""
    ab = dataclasses.replace(RESERVE_ALL, design=dataclasses.replace(
        RESERVE_ALL.design, options=dataclasses.replace(RESERVE_ALL.design.options, reserve_every_worst_case=False)))
    k, cons = knobs(ab)
    bad = not_proved(prove_all_n(Setup(k, cons, c0_class), 600))
    assert "gen_a" in bad, bad
