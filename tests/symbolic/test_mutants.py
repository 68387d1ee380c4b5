"""proofs/mutants.py: planted scheduler bugs that need five or seven requests, each in a core and its policy
alike, none of which `prove` may report "for any number of requests".

- the catalogue: at least 12 bugs over the five engines, counts over the slots, positions in a list and
  submission indices among them;
- planting restores everything: the registered cores and policies, the modules' names, the source the
  checks read;
- each bug's witness lies in its claim's class, keeps the claim on the real simulator, and breaks it on the
  mutated simulator and the mutated core (so the bug really breaks the claim, not only the proof);
- with each bug planted, the argument for any number of requests does not go through for any claim it
  lies in, and the part that stops it is named: the layouts (trtllm_v1), the premise that the core runs one
  code with or without an environment (vllm_v1, sglang, hf_cb), the micro-steps' own proof (trtllm_v2: the
  bug is in the micro-steps, which are the core's step);
- `prove` on the trtllm_v1 claim marked `any_n`, with a bug planted: proved only up to 3 requests, not as
  expected, the scope named as lost.
"""

import re

import pytest

import model.symbolic.core
from model.policy import POLICIES
from model.symbolic.core import CORES
from proofs import mutants as M
from proofs import run as R
from proofs.plant import planted
from helpers import in_a_fresh_process

IDS = [m.name for m in M.MUTANTS]
# the part of the argument that each engine's bugs stop at
STOPPED_BY = {"trtllm_v1": "sealed the same step among", "vllm_v1": "sealed one code with or without an environment",
              "sglang": "sealed one code with or without an environment",
              "hf_cb": "sealed one code with or without an environment",
              "trtllm_v2": "any-n ctx_a: failed"}


def test_the_catalogue_covers_every_engine_with_at_least_twelve_bugs():
    assert len(M.MUTANTS) >= 12
    assert {M.claim(m.claims[0]).policy for m in M.MUTANTS} == set(STOPPED_BY)
    assert len(set(IDS)) == len(IDS)


def test_planting_puts_everything_back():
    cores, policies = dict(CORES), dict(POLICIES)
    module = model.symbolic.cores.vllm_v1
    before = module._Pass
    m = next(m for m in M.MUTANTS if m.name == "vllm-backoff-4-running")
    with planted(list(m.patches)):
        assert module._Pass is not before
    assert module._Pass is before and CORES == cores and POLICIES == policies
    import linecache
    assert "backoff" not in "".join(linecache.getlines(module.__file__))


@pytest.mark.parametrize("mutant", M.MUTANTS, ids=IDS)
def test_the_witness_breaks_the_claim_on_the_mutated_simulator_and_core(mutant):
    c, w = M.claim(mutant.claims[0]), mutant.witness
    assert w is not None and len(w.workload.requests) >= 5
    assert M.in_class(c, w.cfg, w.workload)
    assert not M.violates(c, w.cfg, w.workload) and not M.core_violates(c, w.cfg, w.workload)
    with planted(list(mutant.patches)):
        assert M.violates(c, w.cfg, w.workload), "the mutated simulator keeps the claim"
        assert M.core_violates(c, w.cfg, w.workload), "the mutated core keeps the claim"


@pytest.mark.parametrize("mutant", M.MUTANTS, ids=IDS)
def test_no_claim_the_bug_lies_in_is_proved_for_any_number_of_requests(mutant):
    for name in mutant.claims:
        c = M.claim(name)
        with planted(list(mutant.patches)):
            any_n, why = R.decide_any_n(c, 600, [], lambda event: None)
        assert not any_n, name
        part = re.sub(r"^(\w+) block_size=\d+ ", r"\1 ", why)   # a claim run once per page size
        assert part.startswith(STOPPED_BY[c.policy]), (name, why)


# The two decisions below run in a fresh process (tests/helpers.py in_a_fresh_process): after this file's V2 mutants
# in one process they took 33 s and 22 s, alone 15 s and 12 s, and in the suite's worker 87 s and 49 s (clean clone
# of 9723165, 2026-12-06).
def _decide_with_the_fifth_request_uncharged() -> tuple:
    m = next(m for m in M.MUTANTS if m.name == "v1-fifth-uncharged")
    c = M.claim("v1-budget-without-reuse")
    assert c.any_n
    with planted(list(m.patches)):
        v = R.decide_induction(c, 600)
    from schedproof.provereport import as_dict, summary
    return (v.status, v.scope, v.as_expected, bool(v.lost_scope), v.line, bool(as_dict(v)["lost_scope"]),
            summary([v]), R.exit_code([v]))


def test_prove_with_a_bug_planted_loses_the_scope_it_expects_loudly():
    status, scope, as_expected, lost, line, lost_in_json, summary, code = in_a_fresh_process(
        _decide_with_the_fifth_request_uncharged)
    assert status == "proved" and scope == 3 and not as_expected and lost
    assert line.startswith("UNEXPECTED: proved for up to 3 requests") and "reads another request" in line
    assert lost_in_json and "lost 'for any number of requests': v1-budget-without-reuse" in summary
    assert code == R.EXIT_UNEXPECTED


def _decide_with_the_argument_cut_short() -> tuple:
    from checkers.induction import Obligation

    def cut(claim, timeout, labelled, progress):
        labelled.append(("any n", Obligation("sealed", "the same step at every place", "unknown", 0.0, "time-out")))
        return False, "sealed the same step at every place: unknown (time-out)"
    R.decide_any_n = cut     # this process's own module (a fresh interpreter), not the test worker's
    v = R.decide_induction(M.claim("v1-budget-without-reuse"), 600)
    return v.status, v.scope, bool(v.any_n_cut), bool(v.lost_scope), v.line, R.exit_code([v])


def test_an_argument_cut_short_by_the_time_out_is_unknown_not_lost():
    """A claim expected for any number of requests whose argument ran out of time: exit 3 (unknown), not 1."""
    status, scope, cut, lost, line, code = in_a_fresh_process(_decide_with_the_argument_cut_short)
    assert status == "proved" and scope == 3 and cut and not lost
    assert line.startswith("unknown for any number of requests, expected")
    assert code == R.EXIT_UNKNOWN


def test_planting_reaches_a_name_another_module_imported():
    """As an edit of the file would: the proofs for every n import `V2ArrayModel` by name, and see the planted
    one; afterwards every module has the original again."""
    import checkers.parametric.obligations as obligations
    from model.symbolic.cores import trtllm_v2_micro as micro
    original = id(micro.V2ArrayModel)
    m = next(m for m in M.MUTANTS if m.name == "v2-fix-b-first-4")
    with planted(list(m.patches)):
        assert obligations.V2ArrayModel is micro.V2ArrayModel and id(micro.V2ArrayModel) != original
    assert id(micro.V2ArrayModel) == original and obligations.V2ArrayModel is micro.V2ArrayModel
