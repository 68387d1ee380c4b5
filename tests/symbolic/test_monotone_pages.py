"""The page-count abstraction of acceleration proofs (model/symbolic/ops.py `MonotonePages`).

A proof over it is a proof over the division only if what it assumes of PAGES holds of
cdiv(., b) for every b >= 1; and an obligation that needs the division itself must still be
proved (accel.py asks it again over `Symbolic`)."""

import z3

import model.symbolic.cores  # noqa: F401
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options as V2Options
from checkers.accel import prove_acceleration
from model.symbolic.core import CORES
from model.symbolic.ops import MonotonePages, page_facts
from model.symbolic.slots import DECODING, unfinished


def Options(**options) -> V2Options:
    """_executor_loop (disable_overlap_scheduler): the loop whose decode runs the core accelerates (it accelerates
    none in TensorRT-LLM's default overlap executor, model/symbolic/overlap.py)."""
    return V2Options(**{"disable_overlap_scheduler": True, **options})


MONOTONE = MonotonePages()


def test_the_facts_assumed_of_pages_hold_of_cdiv_for_every_block_size():
    x, y, b = z3.Ints("x y b")
    terms = [MONOTONE.pages(x, b), MONOTONE.pages(y + 3, b), MONOTONE.pages(x - y, b)]
    facts = z3.And(page_facts(terms))
    cdiv = z3.substitute_funs(facts, (MonotonePages.PAGES, (z3.Var(0, z3.IntSort()) + b - 1) / b))
    solver = z3.Solver()
    solver.add(b >= 1, z3.Not(cdiv))
    assert solver.check() == z3.unsat


def test_the_facts_do_not_pin_pages_to_the_division():
    """Only order is assumed: pages(t) * b >= t (true of cdiv) does not follow."""
    t, b = z3.Ints("t b")
    p = MONOTONE.pages(t, b)
    solver = z3.Solver()
    solver.add(b >= 1, t >= 0, *page_facts([p]), z3.Not(p * b >= t))
    assert solver.check() == z3.sat


def test_an_obligation_that_needs_the_division_is_proved_with_it():
    """A closed form that divides where the step counts pages is equal to it only by the division:
    over MonotonePages `step == advance(1)` (and what builds on the closed form) fails, and the
    proof must fall back and succeed."""
    core = CORES["trtllm_v2"]

    class Dividing(type(core)):
        def decode_advance(self, ops, k, p, s, n):
            x = super().decode_advance(ops, k, p, s, n)
            for r0, r, w in zip(s.req, x.req, p.slots):
                dec = ops.and_(w["present"], unfinished(ops, r0["phase"]), r0["phase"] == DECODING)
                divided = ops.max((r0["computed"] + n + k.options.draft_len + k.block_size - 1) / k.block_size,
                                  r0["blocks"])
                r["blocks"] = ops.ite(dec, divided, r0["blocks"])
            return x

    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options())
    bounds = {"block_size": (32, 32), "num_blocks": (272, 272), "max_num_tokens": (2048, 2048),
              "max_batch_size": (64, 64), "host_blocks": (0, 0)}
    abstract = prove_acceleration(Dividing(), cfg, 2, timeout=240, knob_bounds=bounds, pages="monotone")
    assert "step == advance(1)" in [o.invariant for o in abstract if o.status != "proved"]
    obligations = prove_acceleration(Dividing(), cfg, 2, timeout=240, knob_bounds=bounds)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations]
