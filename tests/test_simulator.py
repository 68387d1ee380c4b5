"""The simulator and the environment: arrivals, early stops, cancellations, determinism, how runs end,
and the safety properties on random workloads of every policy."""

from hypothesis import given
from hypothesis import strategies as st

from helpers import Phase, RequestSpec, config, run
from model.policy import POLICIES
from properties import evaluate

SAFETY = ("SAFE-BUDGET", "SAFE-BATCH", "SAFE-BLOCKS", "SAFE-NO-LEAK", "SAFE-REQUESTS")


def v2(**kw):
    base = dict(block_size=4, num_blocks=32, max_num_tokens=32, max_batch_size=4)
    base.update(kw)
    return config("trtllm_v2", **base)


def test_requests_arrive_at_their_step_and_ids_follow_submission_order():
    t = run(v2(), RequestSpec(4, 2, arrival=3), RequestSpec(4, 2, arrival=0))
    assert [r.arrival for r in t.states[0].requests] == [0, 3]
    assert t.states[3].requests[1].phase == Phase.PENDING
    assert t.states[4].requests[1].phase != Phase.PENDING


def test_an_early_stop_ends_a_request_before_max_new_and_frees_its_blocks():
    t = run(v2(), RequestSpec(4, 10, output_len=3))
    r = t.final.requests[0]
    assert (r.phase, r.generated, r.blocks) == (Phase.FINISHED, 3, 0)
    assert t.final.free_blocks == 32


def test_a_cancellation_frees_blocks_and_is_final():
    t = run(v2(), RequestSpec(4, 50, cancel_at=5), RequestSpec(4, 3))
    r = t.final.requests[0]
    assert r.phase == Phase.CANCELLED and r.blocks == 0
    assert t.final.requests[1].phase == Phase.FINISHED
    assert t.final.free_blocks == 32


def test_runs_are_deterministic():
    specs = [RequestSpec(30, 40, arrival=k % 3) for k in range(6)]
    a, b = run(v2(num_blocks=20), *specs), run(v2(num_blocks=20), *specs)
    assert a.states == b.states and a.records == b.records


def test_the_step_limit_ends_a_run_honestly():
    t = run(v2(), RequestSpec(4, 500), max_steps=10)
    assert t.end == "limit" and len(t.records) == 10


# -- safety on random workloads ------------------------------------------------------------

workloads = st.lists(
    st.builds(RequestSpec,
              prompt=st.integers(1, 40), max_new=st.integers(1, 30), arrival=st.integers(0, 6),
              output_len=st.none() | st.integers(1, 30), cancel_at=st.none() | st.integers(0, 40)),
    min_size=1, max_size=6,
).map(lambda specs: [s if (s.output_len or 0) <= s.max_new and (s.cancel_at is None or s.cancel_at >= s.arrival)
                     else RequestSpec(s.prompt, s.max_new, s.arrival) for s in specs])


@given(workloads, st.integers(8, 40), st.integers(8, 48), st.booleans(), st.integers(0, 16))
def test_trtllm_v2_keeps_every_safety_property(specs, blocks, budget, chunked, host):
    cfg = v2(num_blocks=blocks, max_num_tokens=budget, chunked_prefill=chunked, host_blocks=host,
             options={"stall_limit": 20})
    t = run(cfg, *specs, max_steps=3000)
    reqs = t.states[0].requests
    ev = evaluate(t, lambda rid: POLICIES["trtllm_v2"].fits_alone(cfg, reqs[rid]), 100)
    broken = [v for v in ev.violations if v.property in SAFETY]
    assert not broken, broken
