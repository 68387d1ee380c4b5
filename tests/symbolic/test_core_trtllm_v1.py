"""The trtllm_v1 core (model/symbolic/cores/trtllm_v1.py): targeted cases the random runs rarely
reach, the evaluators of its relation against the solver, the #13318 overshoot it expresses and the
search that finds it, and the refusals outside the subset. The random differential checks against
the engine-checked policy are test_core_differential.py's, with cases/trtllm_v1.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import z3

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from checkers import bmc
from checkers.differential import CompiledRelation, RelationChecker, diverges
from checkers.replay import replay
from checkers.space import Group, Space
from model.config import EngineConfig
from model.policies.trtllm_v1 import MAX_UTIL, Options
from model.simulator import RequestSpec, Workload, simulate
from model.symbolic.core import CORES
from model.symbolic.run import run_workload
from model.symbolic.slots import Params
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["trtllm_v1"]


def test_a_paused_request_frees_only_its_own_blocks():
    """Step 4, pool full: MAX_UTILIZATION pauses r3 (the last started, holding a shared block)
    for r0's next block. Only r3's two own blocks count as freed (the shared one stays cached):
    r0 and r1 take them and r2, not fitting, pauses itself. Counting the shared block too would
    schedule r2. (Found by a targeted search; the random sets rarely reach it.)"""
    cfg = EngineConfig("trtllm_v1", 1, 19, 7, 4, chunked_prefill=True, chunk_unit=1,
                       options=Options(capacity_scheduler_policy=MAX_UTIL, draft_len=1, enable_block_reuse=True))
    shared = dict(prefix_group=0)
    workload = Workload((RequestSpec(2, 5, 0, prefix_len=1, **shared), RequestSpec(3, 8, 0, prefix_len=3, **shared),
                         RequestSpec(2, 5, 1, prefix_len=1, **shared), RequestSpec(3, 5, 2, prefix_len=1, **shared),
                         RequestSpec(10, 2, 2, prefix_len=9, **shared)))
    trace = simulate(cfg, workload)
    assert trace.records[4].preempted == (3, 2)
    assert diverges(cfg, workload) is None


# -- the relation test ---------------------------------------------------------------------------

def test_the_evaluators_agree_with_the_solver():
    """On a small case the solver (RelationChecker.rejects), the compiled relation and Z3's
    simplifier accept the simulator's steps; the last two refuse a step with one field changed."""
    cfg = EngineConfig("trtllm_v1", 2, 12, 16, 3, chunked_prefill=True,
                       options=Options(capacity_scheduler_policy=MAX_UTIL, draft_len=1, enable_block_reuse=True))
    workload = Workload((RequestSpec(7, 5, 0, prefix_group=0, prefix_len=6),
                         RequestSpec(7, 4, 2, prefix_group=0, prefix_len=6)))
    checker = CompiledRelation(CORE, cfg, 2)
    trace = simulate(cfg, workload)
    assert trace.end == "done"
    head = dataclasses.replace(trace, records=trace.records[:6], states=trace.states[:7])
    assert RelationChecker.rejects(checker, cfg, workload, head) is None
    assert checker.rejects(cfg, workload, trace) is None
    assert checker.agrees_with_z3_simplifier(cfg, workload, trace)
    t = 2   # r1 reuses r0's prefix: charged 4, runs 10
    bad = trace.states[t + 1]
    bad = bad.with_request(dataclasses.replace(bad.req(1), shared_blocks=bad.req(1).shared_blocks + 1))
    broken = dataclasses.replace(trace, states=trace.states[:t + 1] + [bad], records=trace.records[:t + 1])
    assert "shared_blocks" in checker.rejects(cfg, workload, broken)
    assert not checker.agrees_with_z3_simplifier(cfg, workload, broken)
    # (the solver's refusal of `broken` is an unsat proof through 32-bit dividers: minutes)


# -- scenarios -----------------------------------------------------------------------------------

def test_reuse_overshoot_crashes_in_the_core():
    """#13318: the core itself charges the reused chunks less than it runs and raises."""
    s = load(ROOT / "scenarios" / "trtllm-v1-reuse-budget-overshoot.toml")
    trace = run_workload(s.cfg, s.workload)
    assert trace.end == "error"
    last = trace.records[-1]
    assert sum(last.tokens) > s.cfg.max_num_tokens >= last.charged


def test_bmc_finds_the_reuse_overshoot_from_ranges(monkeypatch):
    """NVIDIA/TensorRT-LLM #13318 from ranges (the scenario's design, prompts, prefixes, budget
    and arrivals as ranges): the shortest counterexample is the engine's token assert at the
    second step, and it replays on the engine-checked simulator. The invariant proof is skipped
    here for time (its blocks-conserved obligation takes about a minute in bit-vectors)."""
    monkeypatch.setattr(bmc, "prove_lemmas", lambda core, space, deadline: bmc.Lemmas(False, [], 0.0))
    s = load(ROOT / "scenarios" / "trtllm-v1-reuse-budget-overshoot.toml")
    knobs = dict(block_size=32, num_blocks=256, max_num_tokens=(512, 2048), max_batch_size=8, host_blocks=0)
    groups = (Group(1, {"prompt": (100, 1000), "max_new": 8, "arrival": 0, "prefix_len": (0, 1000)}, 1),
              Group((1, 2), {"prompt": (100, 1000), "max_new": 8, "arrival": (1, 3), "prefix_len": (0, 1000)}, 1))
    space = Space(s.cfg, knobs, groups, early_stops=False, cancellations=False)
    result = bmc.search(CORE, space, max_depth=4, timeout=120)
    assert result.status == "violated" and result.cex.property == "ENGINE-ERROR" and result.depth == 2
    last = result.cex.records[-1]
    assert sum(last.tokens) > result.cex.cfg.max_num_tokens >= last.charged
    assert replay(result.cex).ok
    # the same space without block reuse: no crash within the same depth
    off = dataclasses.replace(space, template=dataclasses.replace(
        s.cfg, options=dataclasses.replace(s.cfg.options, enable_block_reuse=False)))
    within = bmc.search(CORE, off, max_depth=3, timeout=120, properties=["ENGINE-ERROR", "SAFE-BUDGET"])
    assert within.status == "bounded"


# -- refusals ------------------------------------------------------------------------------------

def test_refuses_what_it_does_not_model():
    eq = EngineConfig("trtllm_v1", 4, 8, 16, 4, chunked_prefill=True,
                      options=Options(chunking_policy="equal_progress"))
    assert CORE.unsupported(eq)[0] == "engine.options.chunking_policy"
    ok = EngineConfig("trtllm_v1", 4, 8, 16, 4, options=Options(enable_block_reuse=True))
    assert CORE.unsupported(ok) is None
    # any group id, concrete or symbolic: a group's cache entry lives in the group's first slot
    one = Params.of(Workload((RequestSpec(8, 4, prefix_group=9, prefix_len=4),)))
    assert CORE.unsupported(ok, one) is None
    symbolic = Params([dict(one.slots[0], prefix_group=z3.Int("g"), prefix_len=z3.Int("p"))])
    assert CORE.unsupported(ok, symbolic) is None
    assert CORE.unsupported(ok, Params([dict(one.slots[0], prompt=0)]))[0] == "requests[0].prompt"
