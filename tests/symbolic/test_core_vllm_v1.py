"""The vllm_v1 core (model/symbolic/cores/vllm_v1.py): the recompute wedge it expresses, what it
refuses, and the bounded model checker finding the smallest recompute wedge of
scenarios/vllm-chunked-off-recompute-wedge.toml. The differential checks against the engine-checked
policy are test_core_differential.py's, with cases/vllm_v1.py."""

import dataclasses
from pathlib import Path

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from checkers.bmc import search
from checkers.replay import replay
from checkers.space import Group, Space
from model.config import EngineConfig
from model.policies.vllm_v1 import Options
from model.state import Phase
from model.symbolic.core import CORES
from model.symbolic.run import run_core
from model.symbolic.slots import Knobs, Params
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


def test_unsupported():
    ok = EngineConfig("vllm_v1", 16, 3, 32, 2, options=Options(max_model_len=32, enable_prefix_caching=False))
    assert CORE.unsupported(ok) is None
    apc = dataclasses.replace(ok, options=dataclasses.replace(ok.options, enable_prefix_caching=True))
    assert CORE.unsupported(apc)[0] == "engine.options.enable_prefix_caching"
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
