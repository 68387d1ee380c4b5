"""checkers/parametric/sealed.py: the premises that make a one-request step the step of any request among
any number, checked on the core as written, each with a control that must fail it.

- phantoms: a term that reads another request names a phantom constant, and only such a term does;
- layouts: outputs that are the same terms everywhere pass; one that reads a phantom, or that changes with
  the request's place among the others, fails, named;
- the structure bound: the constants the step's code computes with, read off the functions that ran;
- mode-blindness: the trtllm_v1 and trtllm_v2 cores run one code with or without an environment; the vllm_v1,
  sglang and hf_cb cores do not (their one-request branches), and a branch planted on the environment fails it;
- on the trtllm_v1 GNE claim: the request's step is the same at every layout; a count over the slots and a
  slot index, each planted, fail it (tests/symbolic/test_mutants.py plants the catalogue's bugs).
"""

import z3

from checkers.induction import symbolic_knobs
from checkers.parametric import local, sealed
from model.symbolic.core import CORES
from proofs import claims as C
from proofs.plant import Patch, planted

GNE = next(c for c in C.CLAIMS if c.name == "v1-budget-without-reuse")
V1_CORE = "model.symbolic.cores.trtllm_v1"


def knobs():
    return symbolic_knobs(GNE.design, GNE.knob_bounds)[0]


def test_a_phantom_constant_is_found_and_only_one():
    x, ph = z3.Int("one.r0.blocks"), z3.Int(f"{sealed.PHANTOM}3.blocks")
    assert sealed.phantom_in([x + 1, z3.If(x > 0, x, 2)]) is None
    assert sealed.phantom_in([x + z3.If(ph > 0, 1, 0)]) == f"{sealed.PHANTOM}3.blocks"
    assert sealed.phantom_in([True, 3]) is None


def test_a_layout_puts_the_request_among_phantoms_and_names_it_as_alone():
    core = CORES["trtllm_v1"]
    alone, among = sealed.layout(core, 0, 0, "t"), sealed.layout(core, 2, 1, "t")
    assert among.own == 2 and len(among.state.req) == 4
    assert all(a.eq(b) for a, b in zip(alone.state.req[0].values(), among.state.req[2].values()))
    assert sealed.phantom_in(among.state.req[0].values()) and sealed.phantom_in(among.params.slots[3].values())
    assert sealed.phantom_in(among.state.req[2].values()) is None


def test_uniform_passes_the_same_terms_and_names_what_differs():
    x = z3.Int("x")
    assert sealed.uniform(lambda b, a: {"post.blocks": x + 1}, 3) == ("proved", "")
    st, why = sealed.uniform(lambda b, a: {"post.blocks": x + (z3.Int(f"{sealed.PHANTOM}0.blocks") if b else 0)}, 3)
    assert st == "failed" and "post.blocks reads another request (phantom!0.blocks)" in why
    st, why = sealed.uniform(lambda b, a: {"post.blocks": x + (1 if b + a >= 3 else 0)}, 3)
    assert st == "failed" and "post.blocks depends on its place among the others" in why
    # a request's handoff exists only where a read follows it: compared where it exists
    assert sealed.uniform(lambda b, a: {"handoff.x.0": x} if a else {}, 2) == ("proved", "")


def test_the_structure_bound_is_past_the_constants_the_step_runs_with():
    k = knobs()
    build = lambda kk: local._Step(kk, "b", (), 1, 1).outputs()   # noqa: E731
    assert sealed.structure_bound(build, k)[0] == sealed.MIN_BOUND
    bug = Patch(V1_CORE, "            batch_tokens = ops.ite(take_dec, batch_tokens + t, batch_tokens)\n",
                "            batch_tokens = ops.ite(take_dec, batch_tokens + ops.ite(count >= 9, 0, t), batch_tokens)\n")
    with planted([bug]):
        bound, by = sealed.structure_bound(build, k)
    assert bound == 11 and by.startswith("model/symbolic/cores/trtllm_v1.py:")


def test_which_cores_run_one_code_with_or_without_an_environment():
    for policy in ("trtllm_v1", "trtllm_v2"):
        assert sealed.mode_blind(["model/symbolic/core.py", f"model/symbolic/cores/{policy}.py"]) == ("proved", "")
    for policy in ("vllm_v1", "sglang", "hf_cb"):
        st, why = sealed.mode_blind(["model/symbolic/core.py", f"model/symbolic/cores/{policy}.py"])
        assert st == "failed" and f"model/symbolic/cores/{policy}.py" in why


def test_a_branch_on_the_environment_fails_mode_blindness():
    bug = Patch(V1_CORE, "    def chunk_fcfs(self, to_chunk: list, capacity) -> list:\n",
                "    def chunk_fcfs(self, to_chunk: list, capacity) -> list:\n        alone = self.env is not None\n")
    with planted([bug]):
        st, why = sealed.mode_blind(local.MODULES)
    assert st == "failed" and "_Pass.chunk_fcfs" in why
    assert sealed.mode_blind(local.MODULES) == ("proved", "")


def test_the_gne_request_step_is_the_same_at_every_layout():
    parts = local.sealed_parts(knobs())
    assert [(a, st) for a, _, st, _, _ in parts] == [("sealed", "proved"), ("sealed", "proved")]


def test_an_undeclared_count_and_a_slot_index_each_fail_the_layouts():
    count = Patch(V1_CORE, "            batch_tokens = ops.ite(take_dec, batch_tokens + t, batch_tokens)\n",
                  "            batch_tokens = ops.ite(take_dec, batch_tokens + t + ops.count(self.batched), batch_tokens)\n")
    index = Patch(V1_CORE, "            batch_tokens = ops.ite(take_dec, batch_tokens + t, batch_tokens)\n",
                  "            batch_tokens = ops.ite(take_dec, batch_tokens + (t if i < 2 else 0), batch_tokens)\n")
    for bug, says in ((count, "reads another request"), (index, "depends on its place among the others")):
        with planted([bug]):
            (_, _, st0, _, _), (_, _, st, _, why) = local.sealed_parts(knobs())
        assert st0 == "proved" and st == "failed" and "micro_batch.batch_tokens" in why and says in why, why
