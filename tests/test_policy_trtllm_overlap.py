"""trtllm_v1 and trtllm_v2 in TensorRT-LLM's default loop, the overlap executor (model/policies/trtllm_overlap.py;
the reading is docs/engine-notes/trtllm_overlap.md): one test per rule that differs from `_executor_loop`, each
beside the same workload in that loop, and the safety properties on random workloads in the overlap loop. There is
no TensorRT-LLM engine to run here: these pin the model's reading of the executor."""

from __future__ import annotations

import random

import pytest

import model.policies  # noqa: F401
from model.config import EngineConfig
from model.policies.trtllm_overlap import to_complete
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload, simulate
from properties import evaluate

SYNC, OVERLAP = True, False   # disable_overlap_scheduler
POLICY_NAMES = ("trtllm_v1", "trtllm_v2")


def cfg_of(policy, overlap_off, block_size=1, num_blocks=64, max_num_tokens=64, max_batch_size=4, chunked=False,
           **options):
    return EngineConfig(policy, block_size, num_blocks, max_num_tokens, max_batch_size, chunked_prefill=chunked,
                        options=POLICIES[policy].Options(disable_overlap_scheduler=overlap_off, **options))


def run(cfg, *specs, max_steps=200):
    return simulate(cfg, Workload(tuple(RequestSpec(*s) if isinstance(s, tuple) else s for s in specs)), max_steps)


def steps(trace):
    return [(dict(r.scheduled), set(r.finished)) for r in trace.records]


def safety_violations(cfg, trace) -> list:
    start = trace.states[0].requests
    policy = POLICIES[cfg.policy]
    return [v for v in evaluate(trace, lambda rid: policy.fits_alone(cfg, start[rid]), 100).violations
            if v.property.startswith("SAFE")]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_overlap_is_the_default_and_names_its_loop(policy):
    p = POLICIES[policy]
    assert p.Options().disable_overlap_scheduler is False                  # TorchLlmArgs' default
    assert p.loop(p.Options()).startswith("PyExecutor._executor_loop_overlap (TensorRT-LLM's default")
    assert p.loop(p.Options(disable_overlap_scheduler=True)).startswith("PyExecutor._executor_loop (not ")


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_batch_is_applied_the_iteration_after_its_launch_and_a_length_finish_is_not_scheduled_again(policy):
    """Rules 2, 4, 5: the KV of a batch is written at launch, its token appended the next iteration; the request
    whose token in flight is its last by length (GENERATION_TO_COMPLETE) is not scheduled again, so it costs the
    same forward passes as in _executor_loop plus one iteration that only retires it."""
    sync, overlap = (run(cfg_of(policy, m), (4, 3)) for m in (SYNC, OVERLAP))
    assert steps(sync) == [({0: 4}, set()), ({0: 1}, set()), ({0: 1}, {0})]
    assert steps(overlap) == [({0: 4}, set()), ({0: 1}, set()), ({0: 1}, set()), ({}, {0})]
    launched = overlap.states[1].req(0)
    assert launched.computed == 4 and launched.generated == 0 and launched.phase.name == "DECODING"
    assert overlap.states[1].sched.in_flight == (0,)
    assert to_complete(overlap.states[3], overlap.states[3].req(0))           # generated 2, its 3rd in flight
    assert overlap.final.free_blocks == 64 and overlap.final.sched.in_flight == ()


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_stop_token_costs_one_decode_more(policy):
    """Rule 5: a stop token is seen one iteration late, so the request is scheduled once more (its token there is
    discarded) and freed after that schedule."""
    sync, overlap = (run(cfg_of(policy, m), RequestSpec(4, 5, output_len=2)) for m in (SYNC, OVERLAP))
    assert steps(sync) == [({0: 4}, set()), ({0: 1}, {0})]
    assert steps(overlap) == [({0: 4}, set()), ({0: 1}, set()), ({0: 1}, {0})]
    assert overlap.final.req(0).generated == 2 and overlap.final.free_blocks == 64


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_finished_request_frees_its_seat_one_schedule_later(policy):
    """Rules 2 and 5: with one batch seat the second request waits for the first one's frees, which come after the
    next schedule: an iteration in which nothing runs (GENERATION_TO_COMPLETE gets no seat in the batch)."""
    sync, overlap = (run(cfg_of(policy, m, max_batch_size=1), (4, 1), (4, 1)) for m in (SYNC, OVERLAP))
    assert steps(sync) == [({0: 4}, {0}), ({1: 4}, {1})]
    if policy == "trtllm_v1":
        # V1: the capacity pass seats the GENERATION_TO_COMPLETE request (its range ends at GENERATION_COMPLETE), so
        # r1 has no capacity seat until r0 is freed; the micro-batch pass gives r0 no batch seat
        assert steps(overlap) == [({0: 4}, set()), ({}, {0}), ({1: 4}, set()), ({}, {1})]
    else:
        # V2: the request is skipped before it takes a seat (S phase 1), so r1 is scheduled beside it
        assert steps(overlap) == [({0: 4}, set()), ({1: 4}, {0}), ({}, {1})]


def test_v1_counts_a_completing_request_in_its_capacity_and_v2_does_not():
    """Rule 2 in the pool: at step 3 r0 (6 of its 7 blocks held, its last token in flight) is GENERATION_TO_COMPLETE.
    V1's GUARANTEED_NO_EVICT still reserves its block to completion (the capacity range ends at
    GENERATION_COMPLETE): 8 - 6 - 1 = 1 block left, r1's worst case needs 2, so r1 waits for r0's free; V2 reads
    only the pages held now (2 free) and schedules r1 beside r0's retirement."""
    v1 = run(cfg_of("trtllm_v1", OVERLAP, num_blocks=8), (4, 3), RequestSpec(1, 1, arrival=3))
    assert steps(v1)[3:5] == [({}, {0}), ({1: 1}, set())]
    v2 = run(cfg_of("trtllm_v2", OVERLAP, num_blocks=8), (4, 3), RequestSpec(1, 1, arrival=3))
    assert steps(v2)[3] == ({1: 1}, {0})


def test_v1_pauses_a_completing_request_and_revives_it_past_max_new():
    """Rule 5, V1 MAX_UTILIZATION: r1's 3rd and last token is in flight (GENERATION_TO_COMPLETE) when r0 needs a
    block; the capacity pass pauses the last started request, r1 (S `is_started_request`: the generation-in-progress
    states include GENERATION_TO_COMPLETE), its blocks are freed before the launch; its token then lands and
    finishes it, and E `_pause_requests` pauses it anyway (no `is_finished` guard): back to CONTEXT_INIT with its
    3 tokens in the prompt, it replays and samples a 4th token, past max_new. A hazard read from the sources, not
    seen on an engine (none runs here). _executor_loop finishes r1 in step 2 and never pauses it."""
    sync, overlap = (run(cfg_of("trtllm_v1", m, num_blocks=10, max_num_tokens=12, max_batch_size=3, chunked=True,
                                capacity_scheduler_policy="max_utilization"), (4, 4), (2, 3)) for m in (SYNC, OVERLAP))
    assert [(r.phase.name, r.generated) for r in sync.final.requests] == [("FINISHED", 4), ("FINISHED", 3)]
    assert not safety_violations(sync.cfg, sync)
    assert overlap.records[3].preempted == (1,) and to_complete(overlap.states[3], overlap.states[3].req(1))
    assert overlap.states[4].req(1).phase.name == "PREEMPTED" and overlap.states[4].req(1).generated == 3
    assert [(r.phase.name, r.generated) for r in overlap.final.requests] == [("FINISHED", 4), ("FINISHED", 4)]
    [bad] = safety_violations(overlap.cfg, overlap)
    assert bad.property == "SAFE-REQUESTS" and "r1 generated 4 tokens, more than its max_new 3" in bad.message


def test_v2_lets_a_recompute_victim_finished_by_its_token_in_flight_end():
    """Rule 5, V2: a recompute-pause victim whose token in flight is its last ends (E
    `_pause_recompute_paused_requests` skips the reset of a finished request); one that is not finished replays
    prompt + every generated token, the one in flight included."""
    from model.policies.trtllm_overlap import land
    from model.state import Phase
    from helpers import decoding, replace, state

    cfg = cfg_of("trtllm_v2", OVERLAP, block_size=4, num_blocks=8)
    p = POLICIES["trtllm_v2"]
    victim = replace(decoding(0, 4, 3, 2, 4), phase=Phase.PREEMPTED, computed=0, blocks=0)
    other = replace(decoding(1, 4, 9, 2, 4), phase=Phase.PREEMPTED, computed=0, blocks=0)
    s, finished = land(p, cfg, state(cfg, victim, other), (0, 1), frozenset())
    assert finished == [0] and s.req(0).phase == Phase.FINISHED and s.req(0).generated == 3
    assert s.req(1).phase == Phase.PREEMPTED and s.req(1).generated == 3 and s.req(1).context_len == 7


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_an_empty_schedule_drains_the_pipeline(policy):
    """Rule 6: an iteration that schedules nothing leaves nothing in flight (PE1 `previous_batch = None`)."""
    overlap = run(cfg_of(policy, OVERLAP), (4, 1))
    assert steps(overlap) == [({0: 4}, set()), ({}, {0})]
    assert overlap.states[2].sched.in_flight == ()


def random_design(rng: random.Random, policy: str):
    """A small design of `policy` in the overlap loop, away from the two model behaviours both loops share and
    their tests pin (V1's pause dropping tokens past max_input_len: a large max_input_len; V2's last chunk carrying
    its drafts past the budget: no drafts with chunked prefill)."""
    chunked = rng.random() < 0.5
    opts = dict(disable_overlap_scheduler=OVERLAP)
    if policy == "trtllm_v1":
        opts.update(capacity_scheduler_policy=rng.choice(["guaranteed_no_evict", "max_utilization"]),
                    enable_block_reuse=rng.random() < 0.4, max_input_len=1000, draft_len=rng.choice([0, 0, 1]))
    else:
        opts.update(stall_limit=rng.choice([2, 5, 1000]), fix_replay_fit=rng.random() < 0.3,
                    draft_len=0 if chunked else rng.choice([0, 0, 1]))
    cfg = EngineConfig(policy, block_size=rng.choice([1, 2, 4]), num_blocks=rng.randint(2, 16),
                       max_num_tokens=rng.randint(4, 24), max_batch_size=rng.randint(1, 4),
                       host_blocks=rng.choice([0, 0, 4]) if policy == "trtllm_v2" else 0, chunked_prefill=chunked,
                       options=POLICIES[policy].Options(**opts))
    specs = tuple(RequestSpec(rng.randint(1, 12), rng.randint(1, 8), arrival=rng.randint(0, 4),
                              output_len=rng.choice([None, None, rng.randint(1, 8)]),
                              cancel_at=rng.choice([None] * 5 + [rng.randint(0, 8)]),
                              prefix_group=rng.choice([-1, -1, 0]), prefix_len=4)
                  for _ in range(rng.randint(1, 4)))
    return cfg, specs


def revived_past_max_new(cfg, trace, v) -> bool:
    """The V1 MAX_UTILIZATION hazard of test_v1_pauses_a_completing_request_and_revives_it_past_max_new, one token
    past max_new, and nothing else."""
    if cfg.policy != "trtllm_v1" or cfg.options.capacity_scheduler_policy != "max_utilization":
        return False
    return v.property == "SAFE-REQUESTS" and any(
        f"generated {r.max_new + 1} tokens, more than its max_new {r.max_new}" in v.message
        for r in trace.final.requests)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_random_workloads_keep_the_safety_properties_in_the_overlap_loop(policy):
    rng = random.Random(39)
    for _ in range(300):
        cfg, specs = random_design(rng, policy)
        t = simulate(cfg, Workload(specs), 3000)
        bad = [v for v in safety_violations(cfg, t) if not revived_past_max_new(cfg, t, v)]
        assert not bad, (cfg, specs, bad)
        if t.end == "done":
            held = sum(e.blocks for e in t.final.prefix_cache)
            assert t.final.free_blocks + held == cfg.num_blocks, (cfg, specs)   # nothing leaked in flight
            # a request finished by a stop token may still be in the last batch, its token there discarded
            assert all(t.final.req(rid).phase.terminal for rid in t.final.sched.in_flight)


def test_every_bundled_design_for_the_symbolic_side_states_the_loop_the_cores_encode():
    """The check files, bench files and claim designs of both TensorRT-LLM policies state disable_overlap_scheduler =
    true, whose expectations came from _executor_loop, the loop the symbolic cores encode (they refuse the
    default); the scenario files: tests/test_scenarios_on_engines.py::test_trtllm_scenario_in_the_default_mode."""
    from pathlib import Path

    from proofs.claims import CLAIMS
    from schedproof.checkspec import load_check

    root = Path(__file__).resolve().parents[1]
    toml = sorted((root / "scenarios" / "check").rglob("*.toml")) + sorted((root / "bench").rglob("*.toml"))
    files = [p for p in toml if 'policy = "trtllm_v' in p.read_text()]
    assert len(files) >= 15
    for path in files:
        # the cores also encode the overlap loop: a file checking it says so in its name
        overlap = path.stem.endswith("-overlap")
        assert load_check(path).space.template.options.disable_overlap_scheduler is not overlap, path
    designs = [c.design for c in CLAIMS if c.policy in POLICY_NAMES]
    assert designs and all(d.options.disable_overlap_scheduler is True for d in designs)


def test_fixes_a_and_b_star_keep_random_workloads_moving_in_the_overlap_loop():
    """proofs/claims.py `v2-ab-reserve-all` (A+B*: no no-progress state for any number of requests that each fit
    alone) is proved in _executor_loop only (the claims' designs run it). Evidence, not a proof, that it
    survives the default loop: random small designs with A+B* and requests that fit alone end without a stall or
    the engine's error in the overlap loop. (A 120 s search of 78,997 designs, A+B and A+B*, each run in both loops,
    found 5 that differ, all with B alone stalling in _executor_loop and not in the overlap loop; none the other
    way.)"""
    rng = random.Random(21)
    p, checked = POLICIES["trtllm_v2"], 0
    while checked < 1000:
        options = p.Options(disable_overlap_scheduler=OVERLAP, fix_replay_fit=True, fix_worst_case_admission=True,
                            reserve_every_worst_case=True, max_util_for_resume=rng.choice([0.95, 1.0]), stall_limit=50)
        cfg = EngineConfig("trtllm_v2", rng.choice([1, 2, 4]), rng.randint(3, 16), rng.randint(4, 24),
                           rng.randint(1, 4), options=options)
        specs = tuple(RequestSpec(rng.randint(1, cfg.max_num_tokens), rng.randint(1, 12), arrival=rng.randint(0, 3),
                                  output_len=rng.choice([None, None, rng.randint(1, 6)]))
                      for _ in range(rng.randint(1, 4)))
        # the claim's class: each request's worst case fits the pool (claims.py `fits_alone`) and its prompt the budget
        if not all(cfg.blocks_for(s.prompt + s.max_new) <= cfg.num_blocks for s in specs):
            continue
        checked += 1
        t = simulate(cfg, Workload(specs), 2000)
        start = t.states[0].requests
        ev = evaluate(t, lambda rid: p.fits_alone(cfg, start[rid]), 100)
        assert ev.verdict == "ok", (cfg, specs, ev.verdict)
