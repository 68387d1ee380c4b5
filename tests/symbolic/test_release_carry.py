"""proofs/release_carry.py: a claim's verdict carries to another release of its policy only where Z3 finds no state,
knobs and workload of its class on which the core behaves differently at the two releases.

- every vLLM claim of proofs/claims.py (all FCFS, decided at 0.34) carries to 0.32 and 0.33;
- negative controls, one per release change of model/releases.py: a PRIORITY design with chunked prefill differs
  between 0.32 and 0.33 (self-preemption goes on), a chunked-off design with a positive long_prefill_token_threshold
  differs between 0.33 and 0.34 (the cap needs chunking); each difference's model is re-run on the core concretely
  at both releases, and the outputs differ there too;
- where the terms differ but the behaviour cannot (one slot: the long-prefill cap needs two eligible requests), the
  solver decides it: carries; with no time left the answer is unknown, never carried.
"""

import dataclasses

from model.symbolic.core import CORES
from model.symbolic.ops import Concrete
from model.symbolic.slots import diff, diff_record
from proofs import claims as C
from proofs.release_carry import CARRIES, DIFFERS, UNKNOWN, carries

TIMEOUT = 120.0


def control(name, design, slots=(2,), **kw) -> C.Claim:
    """A claim of the vLLM claims' class (knobs, workload, invariants) on another design, for the controls."""
    return C.Claim("vllm_v1", name, "a negative control", design, "the vLLM claims' class", C.HOLDS, "induction",
                   knob_bounds=C.VLLM_ANY, invariants=C.vllm_pages_match, workload=C.vllm_class(), slots=slots,
                   **kw)


def at(design, version):
    return dataclasses.replace(design, version=version)


def differs_concretely(claim, result, other) -> str:
    """The witness of a difference re-run on the core with concrete ops at the claim's release and at `other`:
    the first field that differs (the solver's model is a real difference of the core, not of the encoding)."""
    w = result.get(other).witness
    core = CORES[claim.policy]
    post_a, rec_a = core.step(Concrete(), w.knobs, w.params, w.pre)
    post_r, rec_r = core.step(Concrete(), dataclasses.replace(w.knobs, release=other), w.params, w.pre)
    return diff(post_a, post_r) or diff_record(rec_a, rec_r) or ""


def test_every_vllm_claim_carries_to_the_older_releases():
    vllm_claims = C.claims_for("vllm_v1")
    assert {c.method for c in vllm_claims} == {"induction", "bmc"}
    for claim in vllm_claims:
        r = carries(claim, TIMEOUT)
        assert r.at == "0.34", claim.name
        assert [x.release for x in r.releases] == ["0.32", "0.33"], claim.name
        assert r.carried() == ("0.32", "0.33"), (claim.name, [x.line() for x in r.releases])
        assert r.line() == "releases: 0.32 (carried), 0.33 (carried), 0.34 (decided)"
        # one case per proof case: every slot count of the claim (the bounded search's: its space)
        assert r.scope == ("space" if claim.method == "bmc" else ", ".join(f"n={n}" for n in claim.slots))


def test_priority_self_preemption_differs_between_032_and_033():
    claim = control("priority-chunked", at(C.vllm(policy="priority", enable_prefix_caching=False), "0.33"))
    assert claim.design.chunked_prefill
    r = carries(claim, TIMEOUT)
    assert r.at == "0.33"
    older = r.get("0.32")
    assert older.status == DIFFERS, older.line()
    assert older.field.startswith("n=2: step: "), older.field
    assert differs_concretely(claim, r, "0.32")
    # 0.34 changes only the chunked-off long-prefill cap: nothing of this design
    assert r.get("0.34").status == CARRIES
    assert r.line().startswith("releases: 0.32 (differs: n=2: step: ")


def test_long_prefill_cap_differs_between_033_and_034():
    off = C.vllm(chunked_prefill=False, enable_prefix_caching=False, long_prefill_token_threshold=4)
    claim = control("lpt-chunked-off", off)
    r = carries(claim, TIMEOUT)
    assert r.at == "0.34"
    for older in ("0.33", "0.32"):
        assert r.get(older).status == DIFFERS, r.get(older).line()
        assert differs_concretely(claim, r, older)
    # the same threshold with chunked prefill on caps at every release
    on = carries(control("lpt-chunked-on", dataclasses.replace(off, chunked_prefill=True)), TIMEOUT)
    assert on.carried() == ("0.32", "0.33")
    # and a zero threshold (the claims' default) caps nothing at any release
    zero = carries(control("lpt-zero", dataclasses.replace(
        off, options=dataclasses.replace(off.options, long_prefill_token_threshold=0))), TIMEOUT)
    assert zero.carried() == ("0.32", "0.33")


def test_the_solver_decides_where_the_terms_differ():
    """With one slot the long-prefill cap never acts (it needs two eligible requests), but at 0.33 its term is built
    (an ite on the count): the outputs are different terms, and the query proves them equal on the class."""
    claim = control("lpt-one-slot", at(C.vllm(chunked_prefill=False, enable_prefix_caching=False,
                                              long_prefill_token_threshold=4), "0.33"), slots=(1,))
    r = carries(claim, TIMEOUT)
    newer = r.get("0.34")
    assert newer.status == CARRIES
    [(label, status, _, terms_differ)] = newer.cases
    assert (label, status) == ("n=1", CARRIES) and terms_differ > 0


def test_no_time_is_unknown_never_carried():
    claim = control("lpt-chunked-off", C.vllm(chunked_prefill=False, enable_prefix_caching=False,
                                              long_prefill_token_threshold=4))
    r = carries(claim, 0.0)
    assert [x.status for x in r.releases] == [UNKNOWN, UNKNOWN]
    assert r.get("0.33").field == "n=2: time-out"
    assert "0.33 (unknown)" in r.line()


def test_a_policy_with_one_release_has_nothing_to_carry():
    claim = next(c for c in C.claims_for("trtllm_v2") if c.method == "induction")
    r = carries(claim, TIMEOUT)
    assert r.releases == [] and r.line() == f"releases: {r.at} (decided)"
