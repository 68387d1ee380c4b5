"""checkers/parametric: v2-ab-within-budget (class C2) and v2-ab-outgrowing-first (class C3) for any
number of requests, and what must fail.

In C2 and C3 allocations fail and the eviction, pause and preemption loops run, so the progress
argument is about the "calm" pass (nothing scheduled, nothing changed yet): checkers/parametric/
invariants.py, "class C2" (C3 adds fix B's reservation and fix A's invariant). For C2:
- the model with the change count `S_chg` is still the core (C2's design, V2 as released), and a
  change count blind to suspensions is not;
- every micro-step keeps C2's invariants for every n, for A+B and for V2 as released, and the array
  invariants imply the core's slot invariants for n = 1..5;
- negative controls, each must fail where it should: the class without its resume-gate bound (the
  wedge `v2-ab-resume-gate-within-budget` refutes), the pause loop's scan invariant dropped, and an
  instantiation set without the witness of a page holder other than the cursor.
For C3 the same, and: the per-request form of the class (a queue position below the workload's count
of outgrowing requests) covers the slot form for n = 1..5; negative controls: A+B without the order
(v2-ab-mixed's class), the resume gate at 0.95 (v2-ab-resume-gate), fix A's invariant dropped, and
fix B off.
"""

import dataclasses

import pytest
import z3

from checkers.induction import any_params, symbolic_knobs, workload_constraints
from checkers.parametric import Setup, lifting, prove_all_n, refinement
from checkers.parametric.obligations import chain
from checkers.parametric.invariants import outgrowing
from model.symbolic.ops import Symbolic
from model.symbolic.slots import Params
from proofs import claims as C
from proofs import run as R

C2 = next(c for c in C.CLAIMS if c.name == "v2-ab-within-budget")
GATE_WEDGE = next(c for c in C.CLAIMS if c.name == "v2-ab-resume-gate-within-budget")


def c2_class(ops, k, r):
    return C.none_outgrow_within_gate(ops, k, Params([r]))


def without_gate_bound(ops, k, r):
    """C2 less `worst <= 0.95 N`: what the wedge v2-ab-resume-gate-within-budget lives in."""
    return [ops.implies(r["present"], ops.and_(C.fits_alone(ops, k, r), ops.not_(C.outgrows(k, r))))]


def setup(design=None, per_index=c2_class, **kw):
    k, cons = symbolic_knobs(design or C2.design, C.ANY)
    return Setup(k, cons, per_index, cls="c2", **kw)


def not_proved(results):
    return {r.step: r.failed for r in results if r.status != "proved"}


# -- the model is the core -----------------------------------------------------------------
@pytest.mark.parametrize("design", [C2.design, C.v2()], ids=["A+B", "V2 as released"])
def test_one_pass_with_the_change_count_equals_core_step(design):
    assert refinement(symbolic_knobs(design, C.ANY)[0], 2, 600).status == "proved"


def test_a_change_count_blind_to_suspensions_is_not_the_core():
    r = refinement(symbolic_knobs(C2.design, C.ANY)[0], 2, 600, mutant="chg-phase-only")
    assert r.status == "failed" and "S_chg" in r.detail


# -- the proof for every n --------------------------------------------------------------------
def test_c2_is_proved_for_every_n():
    results = prove_all_n(setup(), 600)
    assert not_proved(results) == {}
    assert [r.step for r in results] == ["init"] + [s.name for s in chain()]


def test_v2_as_released_is_proved_for_every_n_in_c2():
    """Fixes A and B never act in C2 (nothing outgrows, every replay fits), so the claim is V2's."""
    assert not_proved(prove_all_n(setup(C.v2()), 600)) == {}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_c2_array_invariants_imply_the_slot_invariants(n):
    k, _ = symbolic_knobs(C2.design, C.ANY)
    assert lifting(k, n, R.invariant_set(C2), c2_class, cls="c2").status == "proved"


def test_prove_says_any_number_for_c2():
    v = R.decide_induction(dataclasses.replace(C2, slots=(2,)), 600)
    assert v.status == "proved" and v.scope == "any", v.line
    assert v.line.startswith("proved for any number of requests (class: C2")


# -- negative controls ----------------------------------------------------------------------
def test_without_the_gate_bound_the_calm_pass_can_stall():
    """A lone suspended request holding more than 0.95 N pages is refused resumption with nothing
    else to evict or pause: the generation body ends without progress (the claim's own wedge)."""
    bad = not_proved(prove_all_n(setup(per_index=without_gate_bound), 600))
    assert set(bad) == {"gen_b"} and "gen-progress" in bad["gen_b"], bad


def test_without_the_pause_scan_the_argument_breaks_where_it_is_used():
    bad = not_proved(prove_all_n(setup(drop=("pause-scan",)), 600, only=("gen_b",)))
    assert "gen_b" in bad and "calm-flags" in bad["gen_b"], bad


def test_without_a_page_holder_other_than_the_cursor_the_argument_breaks():
    """gen_b needs "the pool holds only c's pages" from "no index other than c holds any"."""
    bad = not_proved(prove_all_n(setup(omit=("others",)), 600, only=("gen_b",)))
    assert "gen_b" in bad, bad


# -- class C3: outgrowing requests first, resume gate off ------------------------------------------
C3 = next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing-first")


def c3_setup(design=None, per_index=C.outgrowing_first_at, **kw):
    k, cons = symbolic_knobs(design or C3.design, C.ANY)
    return Setup(k, cons, per_index, cls="c3", **kw)


def fits_alone_only(ops, k, r):
    return [ops.implies(r["present"], C.fits_alone(ops, k, r))]


def test_c3_design_is_the_core_too():
    assert refinement(symbolic_knobs(C3.design, C.ANY)[0], 2, 600).status == "proved"


def test_c3_is_proved_for_every_n():
    assert not_proved(prove_all_n(c3_setup(), 600)) == {}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_c3_array_invariants_imply_the_slot_invariants(n):
    k, _ = symbolic_knobs(C3.design, C.ANY)
    assert lifting(k, n, R.invariant_set(C3), C.outgrowing_first_at, cls="c3").status == "proved"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_c3_per_request_form_covers_the_slot_class(n):
    """Slots in C3 (`outgrowing_first`, present slots first) satisfy the per-request form at every
    slot with `outgrowing` = how many present slots can outgrow."""
    ops = Symbolic()
    k, cons = symbolic_knobs(C3.design, C.ANY)
    p = any_params(n)
    hyps = cons + workload_constraints(p) + [c for c in C.outgrowing_first(ops, k, p) if c is not True]
    hyps.append(outgrowing() == z3.Sum([z3.If(z3.And(w["present"], C.outgrows(k, w)), 1, 0) for w in p.slots]))
    goal = z3.And(*[c for i, w in enumerate(p.slots)
                    for c in C.outgrowing_first_at(ops, k, {**w, "index": i, "outgrowing": outgrowing()})])
    s = z3.Solver()
    s.add(*hyps)
    assert s.check() == z3.sat
    assert s.check(z3.Not(goal)) == z3.unsat


def test_prove_says_any_number_for_c3():
    v = R.decide_induction(dataclasses.replace(C3, slots=(2,)), 600)
    assert v.status == "proved" and v.scope == "any", v.line


def test_without_the_order_the_argument_breaks_where_v2_ab_mixed_wedges():
    """A request that cannot outgrow runs ahead of one that can: the one behind is not pausable (fix A
    protects it) and holds the pages the one in front needs (v2-ab-mixed's wedge)."""
    bad = not_proved(prove_all_n(c3_setup(per_index=fits_alone_only), 600))
    assert set(bad) == {"gen_b"} and "gen-progress" in bad["gen_b"], bad


def test_c3_with_the_resume_gate_on_does_not_prove():
    """max_util_for_resume 0.95: the wedge of v2-ab-resume-gate (a suspended request refused resumption)."""
    bad = not_proved(prove_all_n(c3_setup(C.v2(**C.AB)), 600))
    assert set(bad) == {"gen_b"}, bad


def test_c3_needs_fix_a_invariant():
    """Without `paused-replay-fits` a paused request's replay may exceed the budget: the first
    context of a calm pass is then not scheduled."""
    bad = not_proved(prove_all_n(c3_setup(drop=("paused-replay-fits",)), 600, only=("ctx_a",)))
    assert "ctx_a" in bad and "ctx-progress" in bad["ctx_a"], bad


def test_c3_without_fix_b_breaks_the_reservation_at_admission():
    design = C.v2(max_util_for_resume=1.0, fix_replay_fit=True)
    bad = not_proved(prove_all_n(c3_setup(design), 600, only=("ctx_a",)))
    assert "ctx_a" in bad and "reservation" in bad["ctx_a"], bad
