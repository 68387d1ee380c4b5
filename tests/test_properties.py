"""Each property on hand-made traces: one that violates it, one that keeps it."""

import dataclasses

import pytest

from helpers import Phase, config, req, state
from model.simulator import Trace, Workload
from model.state import PrefixEntry, StepRecord
from properties import REGISTRY, evaluate

CFG = config("trtllm_v2", block_size=4, num_blocks=10, max_num_tokens=8, max_batch_size=2)
replace = dataclasses.replace


def trace(states, records, end="done", cycle_start=None):
    return Trace(CFG, Workload(()), list(states), list(records), end, cycle_start)


def ids(t, fits=lambda rid: True, overtakes=100):
    return {v.property for v in evaluate(t, fits, overtakes).violations}


def s0(*requests, **kw):
    return state(CFG, *requests, **kw)


def rec(step, **kw):
    return StepRecord(step=step, **kw)


def test_every_property_has_id_kind_statement_and_evidence():
    assert len(REGISTRY) >= 12
    for p in REGISTRY.values():
        assert p.kind in ("always", "sometimes", "progress")
        assert p.statement and p.evidence
        assert (p.step_check, p.trace_check, p.witness).count(None) == 2


# -- always ---------------------------------------------------------------------------------

def test_budget_counts_drafts_and_flags_an_overshoot():
    a = s0(req(0, 4, 2))
    ok = trace([a, a], [rec(0, scheduled=((0, 8),), charged=8)])
    bad = trace([a, a], [rec(0, scheduled=((0, 6), (1, 3)), charged=6)])
    assert "SAFE-BUDGET" not in ids(ok)
    assert "SAFE-BUDGET" in ids(bad)


def test_batch_cap():
    a = s0(req(0, 1, 1))
    assert "SAFE-BATCH" in ids(trace([a, a], [rec(0, scheduled=((0, 1), (1, 1), (2, 1)))]))
    assert "SAFE-BATCH" not in ids(trace([a, a], [rec(0, scheduled=((0, 1), (1, 1)))]))


def test_block_conservation_on_each_tier_and_with_the_prefix_cache():
    a = s0(req(0, 4, 2, Phase.DECODING, blocks=3))
    assert "SAFE-BLOCKS" not in ids(trace([a, a], [rec(0)]))
    leaked = replace(a, free_blocks=a.free_blocks - 1)           # a block vanished
    assert "SAFE-BLOCKS" in ids(trace([a, leaked], [rec(0)]))
    cached = replace(a, free_blocks=a.free_blocks - 2, prefix_cache=(PrefixEntry(0, 2, 1),))
    assert "SAFE-BLOCKS" not in ids(trace([a, cached], [rec(0)]))
    host = replace(a, free_host_blocks=-1)
    assert "SAFE-BLOCKS" in ids(trace([a, host], [rec(0)]))


def test_no_leak_after_completion():
    a = s0(req(0, 4, 2, Phase.DECODING, blocks=2))
    done_holding = replace(a, requests=(replace(a.req(0), phase=Phase.FINISHED),))
    assert "SAFE-NO-LEAK" in ids(trace([a, done_holding], [rec(0, finished=(0,))]))
    done = replace(a, requests=(replace(a.req(0), phase=Phase.FINISHED, blocks=0),), free_blocks=10)
    assert "SAFE-NO-LEAK" not in ids(trace([a, done], [rec(0, finished=(0,))]))


@pytest.mark.parametrize("change, bad", [
    (dict(phase=Phase.PENDING), True),                    # lost
    (dict(generated=3), True),                            # more than max_new
    (dict(phase=Phase.DECODING, generated=1), False),
])
def test_request_conservation(change, bad):
    a = s0(req(0, 4, 2, Phase.WAITING))
    b = replace(a, requests=(replace(a.req(0), **change),))
    assert ("SAFE-REQUESTS" in ids(trace([a, b], [rec(0)]))) == bad


def test_a_request_answered_twice_or_revived_is_flagged():
    done = s0(req(0, 4, 2, Phase.FINISHED))
    again = replace(done, requests=(replace(done.req(0), phase=Phase.FINISHED),))
    assert "SAFE-REQUESTS" in ids(trace([done, again], [rec(0, finished=(0,))]))
    revived = replace(done, requests=(replace(done.req(0), phase=Phase.DECODING),))
    assert "SAFE-REQUESTS" in ids(trace([done, revived], [rec(0)]))


def test_engine_error_is_a_violation_and_its_kind_sets_the_verdict():
    a = s0(req(0, 4, 2))
    crash = trace([a, a], [rec(0, error="AssertionError", error_kind="crash")], end="error")
    assert "ENGINE-ERROR" in ids(crash)
    assert evaluate(crash, lambda r: False, 100).verdict == "crash"
    stall = trace([a, a], [rec(0, error="stalled", error_kind="deadlock")], end="error")
    assert evaluate(stall, lambda r: False, 100).verdict == "deadlock"


# -- progress -------------------------------------------------------------------------------

def test_no_progress_needs_unfinished_work_and_an_unchanged_step():
    a = s0(req(0, 4, 2, Phase.WAITING))
    stuck = trace([a, a], [rec(0)], end="fixpoint", cycle_start=0)
    assert "LIVE-NO-PROGRESS" in ids(stuck)
    assert evaluate(stuck, lambda r: True, 100).verdict == "deadlock"
    idle = s0(req(0, 4, 2, Phase.PENDING))                       # nothing arrived yet: not a stall
    assert "LIVE-NO-PROGRESS" not in ids(trace([idle, idle], [rec(0)]))
    moved = replace(a, requests=(replace(a.req(0), phase=Phase.DECODING, computed=4, generated=1, blocks=1),))
    assert "LIVE-NO-PROGRESS" not in ids(trace([a, moved], [rec(0, scheduled=((0, 4),))]))


def test_no_progress_message_tells_an_offload_undone_in_the_step_from_nothing_offloaded():
    """A request suspended and resumed in one pass (the V2 host tier's self-eviction loop) is in the
    record's `offloaded` while the step changes nothing: the message says so (issue 16)."""
    a = s0(req(0, 4, 2, Phase.DECODING))
    for record, says in ((rec(0, offloaded=(0,)), "requests [0] are offloaded or preempted and end the step as they"),
                         (rec(0), "nothing is scheduled, preempted or offloaded")):
        t = trace([a, a], [record], end="fixpoint", cycle_start=0)
        (v,) = [v for v in evaluate(t, lambda r: True, 100).violations if v.property == "LIVE-NO-PROGRESS"]
        assert says in v.message, v.message


def test_livelock_is_a_cycle_without_completion():
    a = s0(req(0, 4, 2, Phase.WAITING))
    b = replace(a, requests=(replace(a.req(0), phase=Phase.PREEMPTED),))
    cyc = trace([a, b, a], [rec(0, scheduled=((0, 1),)), rec(1, scheduled=((0, 1),))], end="cycle", cycle_start=0)
    assert "LIVE-LIVELOCK" in ids(cyc)
    assert evaluate(cyc, lambda r: True, 100).verdict == "livelock"
    assert "LIVE-LIVELOCK" not in ids(trace([a, b], [rec(0, scheduled=((0, 1),))], end="done"))


def test_fits_alone_completes_unless_the_run_is_incomplete():
    a = s0(req(0, 4, 2, Phase.WAITING))
    failed = replace(a, requests=(replace(a.req(0), phase=Phase.FAILED, reason="boom"),))
    t = trace([a, failed], [rec(0, failed=(0,), error="boom", error_kind="crash")], end="error")
    assert "LIVE-FITS-ALONE-COMPLETES" in ids(t, fits=lambda r: True)
    assert "LIVE-FITS-ALONE-COMPLETES" not in ids(t, fits=lambda r: False)
    rejected = replace(a, requests=(replace(a.req(0), phase=Phase.REJECTED, reason="too long"),))
    assert "LIVE-FITS-ALONE-COMPLETES" not in ids(trace([a, rejected], [rec(0, rejected=(0,))]))
    limit = trace([a, a], [rec(0, scheduled=((0, 1),))], end="limit")
    assert "LIVE-FITS-ALONE-COMPLETES" not in ids(limit)
    assert evaluate(limit, lambda r: True, 100).verdict == "unknown"


def test_no_interference_flags_only_requests_that_fit_alone():
    a = s0(req(0, 4, 2, Phase.WAITING), req(1, 400, 2, Phase.WAITING))
    t = trace([a, a], [rec(0, failed=(0, 1), error="x", error_kind="deadlock")], end="error")
    v = [x for x in evaluate(t, lambda rid: rid == 0, 100).violations if x.property == "LIVE-NO-INTERFERENCE"]
    assert len(v) == 1 and "[0]" in v[0].message


def test_bounded_wait_counts_later_arrivals_completing_first():
    reqs = [req(0, 4, 2, Phase.WAITING, arrival=0)] + [req(k, 4, 1, Phase.WAITING, arrival=k) for k in (1, 2, 3)]
    a = s0(*reqs)
    records = [rec(k - 1, finished=(k,)) for k in (1, 2, 3)]
    t = trace([a] * 4, records, end="done")
    assert "LIVE-BOUNDED-WAIT" in ids(t, overtakes=2)
    assert "LIVE-BOUNDED-WAIT" not in ids(t, overtakes=3)


# -- sometimes ----------------------------------------------------------------------------------

def test_sometimes_properties_are_witnessed_not_violated():
    a = s0(req(0, 4, 2))
    t = trace([a, a, a], [rec(0, preempted=(0,)), rec(1, finished=(0,))])
    e = evaluate(t, lambda r: True, 100)
    assert e.witnessed == {"SOME-PREEMPTION": 0, "SOME-COMPLETION": 1}
    assert not any(v.property.startswith("SOME-") for v in e.violations)
