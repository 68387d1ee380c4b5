"""The vllm_v1 core (model/symbolic/cores/vllm_v1.py): the recompute wedge it expresses, prefix
caching's hits in scenarios/vllm-prefix-caching.toml, what it refuses, acceleration proved with
prefix caching on, and the bounded model checker finding the smallest recompute wedge of
scenarios/vllm-chunked-off-recompute-wedge.toml, with prefix caching off and at vLLM's default (on).
The differential checks against the engine-checked policy are test_core_differential.py's, with
cases/vllm_v1.py."""

import dataclasses
import time
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from cases import vllm_v1 as cases
from checkers.accel import ANY_KNOBS, prove_acceleration
from checkers.bmc import capped, search
from checkers.replay import replay
from checkers.space import Group, Space
from model.config import EngineConfig
from model.policies.vllm_v1 import Options
from model.simulator import RequestSpec, Workload
from model.state import Phase
from model.symbolic.core import CORES
from model.symbolic.cores.vllm_v1 import PREFIX_BLOCKS, VllmV1Core, pool_facts
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import Knobs, Params
from schedproof.checkspec import load_check
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["vllm_v1"]


# -- scenarios and the subset -----------------------------------------------------------------

def test_the_recompute_wedge_is_expressed():
    """The core alone reaches the scenario's end: Running 0 / Waiting 1 (the preempted R) forever."""
    sc = load(ROOT / "scenarios" / "vllm-chunked-off-recompute-wedge.toml")
    t = run_core(CORE, Knobs.of(sc.cfg), Params.of(sc.workload))
    last = t.states[-1]
    assert t.end == "fixpoint"
    assert [r["rpos"] for r in last.req] == [-1, -1] and [r["wpos"] for r in last.req] == [-1, 0]
    assert last.req[1]["preemptions"] == 1 and last.req[0]["phase"] == Phase.FINISHED
    assert any(rec.flags["preempted"][1] for rec in t.records)


def test_prefix_hits_are_expressed():
    """vllm-prefix-caching in the core alone: B hits A's two cached prefix blocks (it holds the
    group's first copies, A's, and schedules its last 4 prompt tokens); preempted, B's own cached
    block is evicted by A's growth, and B resumes hitting the two prefix blocks only (8 of 16
    tokens scheduled)."""
    sc = load(ROOT / "scenarios" / "vllm-prefix-caching.toml")
    t = run_core(CORE, Knobs.of(sc.cfg), Params.of(sc.workload))
    a, b = 0, 1
    assert t.end == "done"
    assert t.records[1].tokens[b] == 4 and [t.states[2].req[b][f"h{j}"] for j in range(2)] == [0, 0]
    assert [t.states[2].req[a][f"q{j}"] for j in range(2)] == [-1, -1]      # the copies, held
    assert t.states[2].req[b]["shared"] == 2 and t.states[2].req[b]["blocks"] == 1
    resumed = next(i for i, rec in enumerate(t.records) if rec.flags["scheduled"][b] and i > 5
                   and t.states[i].req[b]["phase"] == Phase.PREEMPTED)
    assert t.records[resumed].tokens[b] == 8 and t.states[resumed].req[b]["oc"] == 0


def test_unsupported():
    ok = EngineConfig("vllm_v1", 16, 3, 32, 2, options=Options(max_model_len=32, enable_prefix_caching=False,
                                                                  async_scheduling=False))
    assert CORE.unsupported(ok) is None
    # vLLM's default loop (async scheduling) is expressed (tests/symbolic/test_core_vllm_async.py), prefix caching
    # included (vLLM's defaults: both on), with the synchronous loop's refusals
    default_mode = dataclasses.replace(ok, options=dataclasses.replace(ok.options, async_scheduling=True))
    assert CORE.unsupported(default_mode) is None
    default_apc = dataclasses.replace(default_mode, options=dataclasses.replace(default_mode.options,
                                                                                enable_prefix_caching=True))
    assert CORE.unsupported(default_apc) is None
    default_prio = dataclasses.replace(default_apc, options=dataclasses.replace(default_apc.options, policy="priority"))
    assert CORE.unsupported(default_prio)[0] == "engine.options.policy"
    apc = dataclasses.replace(ok, options=dataclasses.replace(ok.options, enable_prefix_caching=True))
    assert CORE.unsupported(apc) is None
    prio = dataclasses.replace(apc, options=dataclasses.replace(apc.options, policy="priority"))
    assert CORE.unsupported(prio)[0] == "engine.options.policy"
    assert CORE.unsupported(dataclasses.replace(prio, options=dataclasses.replace(prio.options, enable_prefix_caching=False))) is None
    # shared prefixes where a prompt (at most max_model_len - 1 tokens) could hold more full blocks
    # than the core keeps copies of; without a group, or without prefix caching, nothing to keep
    grouped = Params.of(Workload((RequestSpec(4, 4), RequestSpec(4, 4, prefix_group=0, prefix_len=4))))
    alone = Params.of(Workload((RequestSpec(4, 4),)))
    fits = dataclasses.replace(apc, block_size=4, num_blocks=9, options=dataclasses.replace(
        apc.options, max_model_len=PREFIX_BLOCKS * 4 + 4))
    beyond = dataclasses.replace(fits, options=dataclasses.replace(fits.options, max_model_len=PREFIX_BLOCKS * 4 + 5))
    assert CORE.unsupported(fits, grouped) is None
    assert CORE.unsupported(beyond, grouped)[0] == "requests[1].prefix_group"
    assert CORE.unsupported(beyond, alone) is None
    off = dataclasses.replace(beyond.options, enable_prefix_caching=False)
    assert CORE.unsupported(dataclasses.replace(beyond, options=off), grouped) is None
    for w in (0.1, 0.2, 0.25, 0.5):
        assert CORE.unsupported(dataclasses.replace(ok, options=dataclasses.replace(ok.options, watermark=w))) is None
    # int(0.29 * 100) == 28 (float rounding), the decimal floor is 29: not expressible symbolically
    odd = dataclasses.replace(ok, options=dataclasses.replace(ok.options, watermark=0.29))
    assert CORE.unsupported(odd)[0] == "engine.options.watermark"


# -- the bounded model checker: the smallest recompute wedge ------------------------------

def wedge_space(max_num_scheduled_tokens: int) -> Space:
    """The design of vllm-chunked-off-recompute-wedge (chunked prefill off, block 16,
    max_model_len 32) with the pool and the budget as ranges and any workload of one or two
    requests whose prompts fit the step's token budget (so a request stuck at the head cannot
    be a prompt too long from the start, vllm-chunked-off-head-of-line's kind: only a replay
    can outgrow the budget)."""
    sc = load(ROOT / "scenarios" / "vllm-chunked-off-recompute-wedge.toml")
    o = dataclasses.replace(sc.cfg.options, max_num_scheduled_tokens=max_num_scheduled_tokens)
    return Space(dataclasses.replace(sc.cfg, options=o),
                 {"block_size": 16, "num_blocks": (3, 6), "max_num_tokens": (32, 48), "max_batch_size": 2,
                  "host_blocks": 0},
                 (Group((1, 2), {"prompt": (1, max_num_scheduled_tokens), "max_new": (1, 32), "arrival": (0, 1)}),),
                 early_stops=False, cancellations=False)


def test_bmc_finds_the_smallest_recompute_wedge():
    """Over the ranges, the checker finds the recompute wedge with the smallest budget, pool
    and batched-token limit the design allows: max_num_scheduled_tokens 2 (with 1 there is none
    within the same depth: one token a step runs one request at a time, so nothing is ever
    preempted), num_blocks 3 (2 usable + the null block), max_num_batched_tokens 32
    (= max_model_len), two requests: both decode side by side until the first needs a second
    block, the FCFS victim is recompute-preempted with a context longer than 2, the other
    finishes, and the victim waits forever. The simulator replays it as a deadlock."""
    assert search(CORE, wedge_space(1), max_depth=4, timeout=120, properties=["LIVE-NO-PROGRESS"]).status == "bounded"
    res = search(CORE, wedge_space(2), max_depth=6, timeout=120, properties=["LIVE-NO-PROGRESS"])
    assert res.status == "violated", (res.status, res.reason)
    assert res.depth == 4 and res.lemmas.proved   # the invariants are inductive over this space
    assert res.minimised == ["num_blocks = 3", "max_num_tokens = 32", "requests = 2"]
    cex = res.cex
    assert max(cex.macro) > 1          # the decode run is one accelerated transition
    r = replay(cex)
    assert r.ok, r.message
    final = r.trace.final
    assert r.trace.end == "fixpoint" and final.sched.running == ()
    assert len(final.sched.waiting) == 1
    head = final.req(final.sched.waiting[0])
    assert head.phase == Phase.PREEMPTED and head.context_len > 2
    assert sum(q.phase == Phase.FINISHED for q in final.requests) == 1


# -- acceleration with prefix caching ---------------------------------------------------------

# The block size and max_model_len fixed (the rest of the knobs and the workload symbolic): with
# both concrete, the shared positions a prompt can reach are (max_model_len - 1) // block_size
# (2 here), the others fold away, and the page arithmetic is linear. With the block size symbolic
# the one-step obligation does not prove within 10 minutes (docs/symbolic.md).
ACCEL = EngineConfig("vllm_v1", 4, 8, 16, 4, options=Options(max_model_len=12, async_scheduling=False))
ACCEL_BOUNDS = {**ANY_KNOBS, "block_size": (4, 4)}


@pytest.mark.parametrize("chunked", [False, True])
def test_acceleration_is_proved_with_prefix_caching(chunked):
    """decode_guard/decode_advance with vLLM's default prefix caching, 2 slots, any workload
    (shared prefixes included): a decode run takes only unhashed free blocks, so it evicts no
    cached block and the waiting head's hits stay what the guard saw."""
    cfg = dataclasses.replace(ACCEL, chunked_prefill=chunked)
    assert cfg.options.enable_prefix_caching
    obligations = prove_acceleration(CORE, cfg, 2, timeout=300, knob_bounds=ACCEL_BOUNDS)
    assert len(obligations) == 7 and all(o.status == "proved" for o in obligations), [o.line() for o in obligations]


def test_a_guard_that_lets_decodes_evict_is_refused():
    """The proof can fail: a guard that lets a decode run take any free block (cached ones
    included) is wrong, since taking a cached block evicts it (BP:729-750), which the closed form
    does not do."""
    class Careless(VllmV1Core):
        def decode_room(self, ops, k, p, s):
            return s.g["free_blocks"] - 1

    obligations = prove_acceleration(Careless(), ACCEL, 2, timeout=300, knob_bounds=ACCEL_BOUNDS)
    assert [o.status for o in obligations if o.invariant == "step == advance(1)"] == ["failed"], \
        [o.line() for o in obligations]


# -- the recompute wedge with vLLM's default prefix caching --------------------------------

DEFAULT_CACHING = ROOT / "scenarios" / "check" / "vllm-chunked-off-wedge-default-caching.toml"


def test_the_wedge_is_found_with_prefix_caching_on():
    """scenarios/check/vllm-chunked-off-wedge-default-caching.toml (the ranges file with
    enable_prefix_caching left at vLLM's default, on), capped at 2 requests to keep the test short
    (the whole file, 3 request slots: docs/symbolic.md): the same wedge as with prefix caching off.
    The preempted request's own full block was cached, but the other one's next block evicts it
    (the unhashed free blocks are gone), so its replay is not shortened and no longer fits the
    budget of 2 tokens."""
    spec = load_check(DEFAULT_CACHING)
    assert spec.space.template.options.enable_prefix_caching
    assert CORE.unsupported(spec.space.template) is None
    t0 = time.monotonic()
    res = search(CORE, capped(spec.space, 2), spec.max_depth, timeout=240, properties=list(spec.properties))
    took = time.monotonic() - t0
    assert res.status == "violated", (res.status, res.reason)
    assert res.depth == 4 and max(res.cex.macro) > 1
    r = replay(res.cex)
    assert r.ok, r.message
    final = r.trace.final
    assert r.trace.end == "fixpoint" and final.sched.running == () and len(final.sched.waiting) == 1
    head = final.req(final.sched.waiting[0])
    assert head.phase == Phase.PREEMPTED and head.context_len > 2
    assert took < 240


# -- what the pool encoding rests on -----------------------------------------------------------

def test_pool_facts_hold_on_random_runs():
    """pool_facts (not inductive alone, so not among the core's invariants) on every state of the
    random cases' core runs with prefix caching: full blocks hashed, copies packed and held by
    their holders, each group's cached positions a prefix, own runs after their group's prefix,
    queue keys ranks. `abstract` checks the simulator side of the same assumptions."""
    states = 0
    for seed in range(0, cases.DIFF_RUNS, 3):
        cfg, workload = cases.random_case(seed)
        if not cfg.options.enable_prefix_caching:
            continue
        k, p = Knobs.of(cfg), Params.of(workload)
        for t, s in enumerate(run_core(CORE, k, p, max_steps=cases.MAX_STEPS).states):
            bad = [name for name, c in pool_facts(CONCRETE, k, p, s).items() if not c]
            assert not bad, (seed, t, bad, cfg, workload)
            states += 1
    assert states > 2000, states
