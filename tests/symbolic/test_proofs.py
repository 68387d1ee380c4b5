"""proofs/: the claims come out as expected, and a proof that must fail does fail.

- the A+B claim (v2-ab-outgrowing) proves for 2 slots: every invariant obligation, the class is
  inhabited, and the progress obligation;
- the fix-A-alone claim is refuted by the bounded search, and the trace replays;
- the same A+B claim with a broken invariant set fails: without the reservation invariant the
  never-suspended invariant is no longer inductive (a counterexample to induction), and with none
  of the claim's invariants the progress obligation itself fails with a pre/post pair;
- `schedproof prove` exits 1 on a claim expected to hold that does not, 2 on an unknown policy.
"""

import dataclasses
import json

import pytest

from proofs import claims as C
from proofs import run as R
from schedproof.cli import main

AB = next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing")
FIX_A = next(c for c in C.CLAIMS if c.name == "v2-fix-a-alone")
CORE = R.CORES["trtllm_v2"]


def without_reservation(ops, k, p, s):
    inv = CORE.invariants(ops, k, p, s)
    extra = C.c1_invariants(ops, k, p, s)
    del extra["reservation"]
    inv.update(extra)
    return inv


def test_ab_claim_proves_for_two_slots():
    obligations, progress = R.prove(AB, 2, None, 120)
    assert [o.line() for o in obligations if o.status != "proved"] == []
    assert {o.action for o in obligations} == {"class", "init", "step", "decode-run"}
    assert "reservation" in {o.invariant for o in obligations}
    assert progress.status == "proved", progress.line()


def test_fix_a_alone_is_refuted_and_replayed():
    v = R.decide_bmc(FIX_A, 120)
    assert v.status == "refuted" and v.as_expected, v.line
    assert v.detail["replayed"] is True
    assert v.line.startswith("refuted as expected: LIVE-NO-PROGRESS at depth")


def test_dropping_the_reservation_breaks_the_proof():
    obligations, progress = R.prove(AB, 2, None, 120, invariants=without_reservation)
    failed = [o for o in obligations if o.status == "failed"]
    assert failed, "the proof without the reservation must fail"
    assert any(o.action == "step" and o.invariant.endswith("never-suspended") for o in failed)
    pre, post = next(o for o in failed if o.cti is not None).cti
    assert any(r["suspended"] for r in post.req) and not any(r["suspended"] for r in pre.req)
    assert progress.status != "proved"


def test_progress_fails_with_a_cti_without_the_claims_invariants():
    """Only the core's invariants: they are inductive, but they admit a wedged state."""
    obligations, progress = R.prove(AB, 2, None, 120, invariants=CORE.invariants)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations if o.status != "proved"]
    assert progress.status == "failed" and progress.cti is not None
    pre, post = progress.cti
    assert [r for r in pre.req] == [r for r in post.req]   # a no-progress step: no request changes


def test_cli_exit_1_and_cti_when_a_claim_expected_to_hold_fails(monkeypatch, capsys):
    broken = dataclasses.replace(AB, name="broken", slots=(2,),
                                 invariants=lambda ops, k, p, s: {
                                     key: v for key, v in C.c1_invariants(ops, k, p, s).items()
                                     if key != "reservation"})
    monkeypatch.setattr(C, "claims_for", lambda policy: [broken])
    assert main(["prove", "trtllm_v2", "--budget", "120", "--workers", "1", "--loop", "design"]) == 1
    out = capsys.readouterr().out
    assert "broken: UNEXPECTED: not proved: counterexample to induction" in out
    assert "pre :" in out and "post:" in out


def test_cli_json_and_bad_policy(monkeypatch, capsys):
    monkeypatch.setattr(C, "claims_for", lambda policy: [FIX_A])
    assert main(["prove", "trtllm_v2", "--json", "--budget", "120", "--workers", "1", "--loop", "design"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["claim"] == "v2-fix-a-alone" and data[0]["status"] == "refuted"
    assert set(data[0]) >= {"claim", "policy", "expected", "status", "obligations", "seconds", "class"}
    assert main(["prove", "no_such_policy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_policy" in err


@pytest.mark.parametrize("claim", [c for c in C.CLAIMS], ids=lambda c: c.name)
def test_claims_are_well_formed(claim):
    assert claim.expected in (C.HOLDS, C.FAILS) and claim.method in ("induction", "bmc")
    assert (claim.method == "bmc") == (claim.space is not None)
    assert "\n" not in claim.statement and claim.class_text
