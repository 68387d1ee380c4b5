"""The claims of proofs/claims.py for transformers (hf_cb), vLLM V1 and TensorRT-LLM V1.

Each claim expected to hold proves for 2 request slots (`schedproof prove` adds 3); each is shown
not to be vacuous by a neighbouring design or class where the same proof fails, at a state that
says why. The refutations that `prove` runs are replayed here for vLLM's wedge (the others take
about a minute each and run in `prove`).
"""

import dataclasses

import pytest

from model.symbolic.slots import WAITING
from proofs import claims as C
from proofs import run as R

CLAIM = {c.name: c for c in C.CLAIMS}
HOLDING = [c.name for c in C.CLAIMS if c.policy != "trtllm_v2" and c.method == "induction"]


def _prove(claim, n=2):
    obligations, prop = R.prove(claim, n, claim.block_sizes[0] if claim.block_sizes else None, 600)
    return obligations, prop


@pytest.mark.parametrize("name", HOLDING)
def test_claim_proves_for_two_slots(name):
    claim = CLAIM[name]
    obligations, prop = _prove(claim)
    assert [o.line() for o in obligations if o.status != "proved"] == []
    assert prop.status == "proved" and prop.invariant == claim.property, prop.line()
    assert {o.action for o in obligations} >= {"class", "init", "step"}


def test_every_engine_has_claims_both_ways():
    for policy in ("hf_cb", "vllm_v1", "trtllm_v1", "trtllm_v2", "sglang"):
        kinds = {c.expected for c in C.claims_for(policy)}
        assert kinds == {C.HOLDS, C.FAILS}, policy


def test_hf_fatal_error_needs_every_request_to_fit():
    """Without `fits alone` in the class the fatal error is reachable from the invariants: a state
    where the offload loop is left with one request it cannot make room for."""
    claim = dataclasses.replace(CLAIM["hf-fits-alone-no-fatal"], workload=None)
    obligations, prop = _prove(claim)
    assert prop.status == "failed" and prop.invariant == "ENGINE-ERROR", prop.line()
    pre, post = prop.cti
    assert post.g["error"] and not pre.g["error"]


def test_sglang_stalls_at_the_clip_bound():
    """Without the class (max_new one token below the arrival clip), the progress obligation fails at a queued
    request on an empty engine: the clip's own bound, which admission refuses."""
    claim = dataclasses.replace(CLAIM["sglang-ignore-eos-below-clip"], workload=None)
    obligations, prop = _prove(claim)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations if o.status != "proved"]
    assert prop.status == "failed" and prop.invariant == "LIVE-NO-PROGRESS", prop.line()
    pre, _ = prop.cti
    assert all(r["rpos"] < 0 for r in pre.req) and any(r["wpos"] == 0 for r in pre.req), pre


def test_vllm_whole_prefill_wedges_without_the_budget_bound():
    """Chunked prefill off, every prompt within the budget but a replay (prompt + generated) that may
    exceed it: the proof of the chunked claim fails at a queued request with generated tokens, a replay
    that can never run (the recompute wedge). The counterexample to induction need not be reachable
    (Z3 may return one queued as WAITING rather than PREEMPTED), so the test asks only for the replay."""
    chunked = CLAIM["vllm-chunked-fits-alone"]

    def prompts_fit(ops, k, p):
        return chunked.workload(ops, k, p) + [ops.implies(w["present"], w["prompt"] <= k.max_num_tokens)
                                               for w in p.slots]
    claim = dataclasses.replace(chunked, design=dataclasses.replace(chunked.design, chunked_prefill=False),
                                workload=prompts_fit)
    obligations, prop = _prove(claim)
    assert all(o.status == "proved" for o in obligations), [o.line() for o in obligations if o.status != "proved"]
    assert prop.status == "failed" and prop.invariant == "LIVE-NO-PROGRESS"
    pre, _ = prop.cti
    assert any(r["phase"] in (WAITING, C.PREEMPTED) and r["generated"] > 0 for r in pre.req), pre


def test_v1_budget_proof_fails_with_reuse_and_whole_contexts():
    """The budget claim's proof with block reuse on and chunked prefill off (the trim cannot shrink a
    whole context) fails: a step forwards more than max_num_tokens and the assert fires."""
    base = CLAIM["v1-budget-without-reuse"]
    opts = dataclasses.replace(base.design.options, enable_block_reuse=True, draft_len=0)
    claim = dataclasses.replace(base, design=dataclasses.replace(base.design, chunked_prefill=False, options=opts))
    obligations, prop = _prove(claim)
    assert prop.status == "failed" and prop.invariant == "SAFE-BUDGET", prop.line()
    assert prop.cti[1].g["error"]


def test_vllm_scheduled_tokens_wedge_is_refuted_and_replayed():
    v = R.decide_bmc(CLAIM["vllm-whole-prefill-scheduled-tokens-wedge"], 300)
    assert v.status == "refuted" and v.as_expected, v.line
    assert v.detail["replayed"] is True


@pytest.mark.parametrize("options", [dict(watermark=0.1), dict(long_prefill_token_threshold=4),
                                     dict(max_num_scheduled_tokens=8), dict(policy="priority"),
                                     dict(max_num_active_seqs=1)], ids=lambda o: next(iter(o)))
def test_vllm_chunked_claim_holds_under_each_scheduler_knob(options):
    """The knobs the claim fixes at vLLM's defaults do not break it (2 slots, one value each): the
    watermark applies only while requests run (KM:509-516), a long-prefill cap or a smaller
    scheduled-token budget only shortens chunks, and priority or an admission cap only reorder."""
    base = CLAIM["vllm-chunked-fits-alone"]
    claim = dataclasses.replace(base, design=dataclasses.replace(
        base.design, options=dataclasses.replace(base.design.options, **options)))
    obligations, prop = _prove(claim)
    assert [o.line() for o in obligations if o.status != "proved"] == []
    assert prop.status == "proved", prop.line()


def test_a_group_field_the_encoding_does_not_read_is_refused():
    """prefix_group is a Group attribute; given as a field it used to be dropped without a word, and
    a refutation space built that way searched workloads without the prefix it was written for."""
    from checkers.space import Group
    with pytest.raises(ValueError, match="prefix_group"):
        Group(1, {"prompt": 4, "prefix_group": 1})
