"""The vllm_v1 core (model/symbolic/cores/vllm_v1.py) held to the engine-checked policy
(model/policies/vllm_v1.py): the scenario files, random differential runs (every field of every
state and step record), the core's Z3 transition relation on every step of random simulator runs,
its decode acceleration, and the bounded model checker finding the smallest recompute wedge of
scenarios/vllm-chunked-off-recompute-wedge.toml."""

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from model.config import ConfigError, EngineConfig
from model.policy import POLICIES
from model.policies.vllm_v1 import Options
from model.simulator import RequestSpec, Workload, simulate
from model.state import Phase
from checkers.bmc import search
from model.symbolic.core import CORES
from checkers import differential
from checkers.differential import RelationChecker, diverges
from checkers.encode import int_var
from checkers.replay import replay
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import Knobs, Params, diff
from checkers.space import Group, Space
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
CORE = CORES["vllm_v1"]
POLICY = POLICIES["vllm_v1"]
SCENARIOS = sorted((ROOT / "scenarios").glob("vllm-*.toml"))
# prefix caching off in the file; vllm-chunked-off-head-of-line leaves it at vLLM's default (on)
IN_SUBSET = ("vllm-chunked-off-recompute-wedge", "vllm-chunked-on-recompute-control")
WATERMARKS = [0.0, 0.0, 0.0, 0.1, 0.2, 0.25, 0.5]


# -- random configurations and workloads inside the subset ------------------------------------

def rand_cfg(rng: random.Random, chunked=None, policy=None, full_isl=None, watermark=None,
             pressure: bool = False) -> EngineConfig:
    """A configuration vLLM accepts (VllmV1.check_config) with prefix caching off; `pressure`
    keeps the pool at its smallest so that decodes preempt."""
    while True:
        bs = rng.choice([1, 2, 4, 8])
        mml = rng.randint(2, 24)
        nb = 1 + -(-mml // bs) + (rng.randint(0, 1) if pressure else rng.randint(0, 3))
        ch = rng.random() < 0.5 if chunked is None else chunked
        mbs = rng.randint(1, 4)
        mnbt = rng.randint(mbs, mml + 6) if ch else rng.randint(max(mml, mbs), mml + 6)
        opts = dict(max_model_len=mml, enable_prefix_caching=False,
                    policy=policy or rng.choice(["fcfs", "priority"]),
                    watermark=rng.choice(WATERMARKS) if watermark is None else watermark)
        if rng.random() < 0.6:
            opts["max_num_scheduled_tokens"] = rng.randint(1, mnbt + 3)
        if rng.random() < 0.3:
            opts["max_num_active_seqs"] = rng.randint(1, mbs)
        if rng.random() < 0.4:
            opts["long_prefill_token_threshold"] = rng.randint(1, mml)
        isl = rng.random() < 0.7 if full_isl is None else full_isl
        opts["scheduler_reserve_full_isl"] = isl
        cfg = EngineConfig("vllm_v1", bs, nb, mnbt, mbs, chunked_prefill=ch, options=Options(**opts))
        try:
            POLICY.check_config(cfg)
        except ConfigError:
            continue
        return cfg


def rand_workload(rng: random.Random, cfg: EngineConfig, most: int = 5, pressure: bool = False) -> Workload:
    """1..most requests; some prompts empty or too long (refused at admission), some early
    stops, some cancellations, priorities 0..2; `pressure`: short prompts, long outputs."""
    mml = cfg.options.max_model_len
    reqs = []
    for _ in range(rng.randint(2 if pressure else 1, most)):
        if pressure:
            prompt, max_new = rng.randint(1, max(1, mml // 3)), rng.randint(mml // 2, 24)
        else:
            prompt = 0 if rng.random() < 0.05 else rng.randint(1, min(20, mml + 1))
            max_new = rng.randint(1, 20)
        output_len = rng.randint(1, max_new) if rng.random() < 0.25 else None
        cancel_at = rng.randint(0, 15) if rng.random() < 0.2 else None
        reqs.append(RequestSpec(prompt, max_new, rng.randint(0, 3 if pressure else 5), output_len, cancel_at,
                                priority=rng.randint(0, 2)))
    return Workload(tuple(reqs))


def rand_case(seed: int, **structure):
    rng = random.Random(seed)
    pressure = rng.random() < 0.4
    cfg = rand_cfg(rng, pressure=pressure, **structure)
    return cfg, rand_workload(rng, cfg, pressure=pressure)


def coverage(trace, seen: Counter) -> None:
    """What a run exercised, read off the simulator's states and records."""
    cfg = trace.cfg
    o = cfg.options
    seen[f"chunked {cfg.chunked_prefill}"] += 1
    for s, rec in zip(trace.states, trace.records):
        running = s.sched.running
        if rec.preempted:
            seen[f"preempt {o.policy}"] += 1
            seen["several victims in one step"] += len(rec.preempted) > 1
            # PRIORITY: a victim ahead (in list order) of a request scheduled in the same step
            # had its turn first; if it was scheduled, its budget comes back (S:813-832)
            last = max((running.index(rid) for rid, _ in rec.scheduled if rid in running), default=-1)
            seen["victim ahead of the current one"] += any(v in running and running.index(v) < last
                                                           for v in rec.preempted)
        seen["rejected"] += bool(rec.rejected)
        seen["cancelled"] += any("cancelled" in n for n in rec.notes)
        seen["prompt over the budget"] += any("chunked prefill off" in n for n in rec.notes)
        for rid, tokens in rec.scheduled:
            r = s.req(rid)
            if r.phase != Phase.DECODING and tokens < r.context_len - r.computed:
                seen["partial chunk"] += 1
                seen["long-prefill cap"] += tokens == o.long_prefill_token_threshold
        seen["active-seqs cap"] += bool(o.max_num_active_seqs and len(running) >= o.max_num_active_seqs
                                        and s.sched.waiting)
    seen[f"end {trace.end}"] += 1
    seen["wedged with a preempted head"] += trace.end == "fixpoint" and bool(trace.final.sched.waiting) and \
        trace.final.req(trace.final.sched.waiting[0]).preemptions > 0


# -- scenarios and the subset -----------------------------------------------------------------

def prefix_caching_off(cfg: EngineConfig) -> EngineConfig:
    return dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, enable_prefix_caching=False))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenarios_agree(path):
    """A scenario with prefix caching off agrees exactly; one with it on (vLLM's default, so also
    a file that does not set it) is refused by name, and its design with prefix caching off
    agrees on the same workload."""
    sc = load(path)
    refused = CORE.unsupported(sc.cfg, Params.of(sc.workload))
    if refused:
        assert path.stem not in IN_SUBSET
        assert refused[0] == "engine.options.enable_prefix_caching" and sc.cfg.options.enable_prefix_caching
        off = prefix_caching_off(sc.cfg)
        assert CORE.unsupported(off, Params.of(sc.workload)) is None
        assert diverges(off, sc.workload) is None
        return
    assert diverges(sc.cfg, sc.workload) is None


def test_scenarios_in_subset():
    assert {p.stem for p in SCENARIOS} >= set(IN_SUBSET)
    for name in IN_SUBSET:
        sc = load(ROOT / "scenarios" / f"{name}.toml")
        assert CORE.unsupported(sc.cfg, Params.of(sc.workload)) is None


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


# -- random differential runs -----------------------------------------------------------------

DIFF_RUNS = 1000


def test_random_differential():
    seen = Counter()
    for seed in range(DIFF_RUNS):
        cfg, workload = rand_case(seed)
        d = diverges(cfg, workload)
        assert d is None, f"seed {seed}: {cfg}\n{workload}\n{d}"
        coverage(simulate(cfg, workload), seen)
    for what in ("chunked True", "chunked False", "preempt fcfs", "preempt priority", "several victims in one step",
                 "victim ahead of the current one", "rejected", "cancelled", "prompt over the budget", "partial chunk",
                 "long-prefill cap", "active-seqs cap", "end done", "end fixpoint", "wedged with a preempted head"):
        assert seen[what] > 0, (what, seen)


# -- the Z3 relation ------------------------------------------------------------------------

# The numeric options are symbolic in the relation too (the core never branches on them); an
# option left unset is fixed to what vLLM uses instead (S:132-141), which is the same step.
NUMERIC_OPTIONS = ("max_model_len", "max_num_scheduled_tokens", "max_num_active_seqs",
                   "long_prefill_token_threshold")


def option_values(cfg: EngineConfig) -> list:
    o = cfg.options
    return [o.max_model_len, o.max_num_scheduled_tokens or cfg.max_num_tokens,
            o.max_num_active_seqs or cfg.max_batch_size, o.long_prefill_token_threshold]


class CompiledRelation(differential.CompiledRelation):
    """The library's compiled relation with vLLM's numeric options symbolic too."""

    def __init__(self, core, template, n):
        self.option_vars = [int_var(f"o.{f}") for f in NUMERIC_OPTIONS]
        symbolic = dataclasses.replace(template.options, **dict(zip(NUMERIC_OPTIONS, self.option_vars)))
        super().__init__(core, dataclasses.replace(template, options=symbolic), n)

    def extra_inputs(self) -> list:
        return self.option_vars

    def extra_values(self, cfg: EngineConfig) -> list:
        return option_values(cfg)


STRUCTURES = [dict(chunked=c, policy=p, full_isl=f, watermark=w)
              for c, p, f, w in [(False, "fcfs", True, 0.0), (False, "priority", True, 0.25),
                                 (False, "fcfs", False, 0.1), (False, "priority", False, 0.0),
                                 (True, "fcfs", True, 0.0), (True, "priority", True, 0.0),
                                 (True, "fcfs", False, 0.5), (True, "priority", True, 0.2)]]
RELATION_RUNS = 130   # per structure
SLOTS = 4


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: "-".join(map(str, s.values())))
def test_relation_accepts_random_runs(structure):
    checker = CompiledRelation(CORE, rand_case(0, **structure)[0], SLOTS)
    for seed in range(RELATION_RUNS):
        rng = random.Random(seed)
        pressure = rng.random() < 0.4
        cfg = rand_cfg(rng, pressure=pressure, **structure)
        workload = rand_workload(rng, cfg, most=SLOTS, pressure=pressure)
        trace = simulate(cfg, workload)
        r = checker.rejects(cfg, workload, trace)
        assert r is None, f"seed {seed}: {cfg}\n{workload}\n{r}"


def test_compiled_relation_matches_the_solver():
    """RelationChecker's own solver check (options concrete, as the kernel builds it) on the wedge
    scenario and on short random runs, and the compiled relation agrees with it, also on a step
    it must refuse."""
    sc = load(ROOT / "scenarios" / "vllm-chunked-off-recompute-wedge.toml")
    solver, compiled = RelationChecker(CORE, sc.cfg, 2), CompiledRelation(CORE, sc.cfg, 2)
    trace = simulate(sc.cfg, sc.workload)
    short = dataclasses.replace(trace, states=trace.states[14:20], records=trace.records[14:19])  # the preemption
    assert solver.rejects(sc.cfg, sc.workload, short) is None
    assert compiled.rejects(sc.cfg, sc.workload, trace) is None
    for seed in range(3):
        rng = random.Random(seed)
        cfg = rand_cfg(rng, chunked=True, policy="priority", full_isl=True, watermark=0.25)
        workload = rand_workload(rng, cfg, most=2)
        trace = simulate(cfg, workload)
        trace = dataclasses.replace(trace, states=trace.states[:5], records=trace.records[:4])
        assert RelationChecker(CORE, cfg, 2).rejects(cfg, workload, trace) is None
        assert CompiledRelation(CORE, cfg, 2).rejects(cfg, workload, trace) is None
    # a wrong post-state (R one token further at the preemption step) is refused by both
    bad = dataclasses.replace(short, states=list(short.states))
    s = bad.states[3]
    bad.states[3] = s.with_request(dataclasses.replace(s.req(0), computed=s.req(0).computed + 1))
    assert solver.rejects(sc.cfg, sc.workload, bad) is not None
    assert compiled.rejects(sc.cfg, sc.workload, bad) is not None


# -- invariants and acceleration -----------------------------------------------------------

def test_invariants_hold_on_random_runs():
    """Core.invariants (the shared ones and the queue invariants of this core) on every state of
    random runs; model/symbolic/induction.py proves them inductive (the BMC test below does,
    for its space)."""
    for seed in range(150):
        cfg, workload = rand_case(seed)
        k, p = Knobs.of(cfg), Params.of(workload)
        for t, s in enumerate(run_core(CORE, k, p).states):
            bad = [name for name, c in CORE.invariants(CONCRETE, k, p, s).items() if not c]
            assert not bad, (seed, t, bad, cfg, workload)


def test_decode_advance_is_m_steps():
    """On states of random runs: where decode_guard(s, m) holds, m single steps reach
    decode_advance(s, m), each a pure decode step (model/symbolic/accel.py proves it for all
    states satisfying the invariants; this ties it to reachable ones, also wedged ones)."""
    held = Counter()
    for seed in range(100):
        cfg, workload = rand_case(seed)
        k, p = Knobs.of(cfg), Params.of(workload)
        trace = run_core(CORE, k, p)
        for s in trace.states[::2]:
            for m in (1, 2, 5):
                if not CORE.decode_guard(CONCRETE, k, p, s, m):
                    continue
                held[m] += 1
                x = s
                for _ in range(m):
                    x, rec = CORE.step(CONCRETE, k, p, x)
                    assert not any(rec.flags["preempted"] + rec.flags["finished"] + rec.flags["rejected"])
                assert diff(x, CORE.decode_advance(CONCRETE, k, p, s, m)) is None, (seed, cfg, workload, m)
    assert min(held.values()) > 50, held


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
