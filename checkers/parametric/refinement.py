"""The array model pinned to the slot core: for a concrete n, one whole pass of micro-steps equals
`Core.step` of model/symbolic/cores/trtllm_v2.py on the same symbolic pre-state (Z3 validity), every
request field, global and record entry, and every ghost equal to the sum (or the or) it stands for.
And concrete traces (the bounded search's counterexamples) replayed step for step in the array model.
"""

from __future__ import annotations

import dataclasses
import time

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.config import EngineConfig
from model.symbolic.core import CORES
from model.symbolic.cores.trtllm_v2_micro import (GHOSTS, PARAMS, RECORD_FLAGS, REQ, STATE_GLOBALS, ArrayState,
                                                  V2ArrayModel, core_step, fresh, sums)
from model.symbolic.ops import MonotonePages, Symbolic, num
from model.symbolic.run import CONCRETE
from model.symbolic.slots import Knobs, Params, SlotState

from .. import clock
from ..encode import fresh_params_slots, fresh_state
from .invariants import Point, per_index, scalars, workload_at
from .obligations import program
from .sealed import MAX_BOUND, structure_bound

OPS = MonotonePages()
SYMBOLIC = Symbolic()
CONCRETE_Z3 = Symbolic()   # replay: concrete values as Z3 constants, folded by z3.simplify


def slot_view(st: ArrayState, n: int) -> tuple[SlotState, Params]:
    """The first n indices of an array state as the core's slots and workload."""
    req = [{f: z3.Select(st.a[f], i) for f in REQ} for i in range(n)]
    g = {f: st.g[f] for f in STATE_GLOBALS}
    slots = [{**{f: z3.Select(st.a[f], i) for f in PARAMS}, "prefix_group": -1, "prefix_len": 0, "priority": 0}
             for i in range(n)]
    return SlotState(req, g), Params(slots)


def defined_pre(m: V2ArrayModel, n: int, tag: str = "pre") -> ArrayState:
    """A symbolic pre-state of n requests whose ghosts are their sums."""
    st = fresh(tag, z3.IntVal(n), with_pass=False)
    for name, fn in m.sums.items():
        st.g[name] = OPS.sum(fn(st.cell(i)) for i in range(n))
    return st


@dataclasses.dataclass
class Refinement:
    n: int
    status: str          # proved | failed | unknown
    seconds: float
    detail: str = ""


def refinement(k: Knobs, n: int, timeout: float = 600.0, mutant=None) -> Refinement:
    """One pass of micro-steps == `Core.step` for n requests, for every pre-state (knobs as in k)."""
    core = CORES["trtllm_v2"]
    m = V2ArrayModel(OPS, k, mutant)
    pre = defined_pre(m, n)
    slots, params = slot_view(pre, n)
    post_core, rec = core.step(OPS, k, params, slots)
    post = m.step(pre, n)
    dead = post.g["dead"]
    eqs = []
    for i in range(n):
        for f in REQ:
            eqs.append((f"r{i}.{f}", z3.Select(post.a[f], i) == post_core.req[i][f]))
        eqs.append((f"r{i}.tokens", z3.If(dead, num(0), z3.Select(post.a["tokens"], i)) == rec.tokens[i]))
        for f in RECORD_FLAGS:
            eqs.append((f"r{i}.{f}", z3.And(z3.Not(dead), z3.Select(post.a[f], i)) == rec.flags[f][i]))
    for f in STATE_GLOBALS:
        eqs.append((f, post.g[f] == post_core.g[f]))
    eqs.append(("charged", z3.If(dead, num(0), post.g["charged"]) == rec.charged))
    eqs.append(("error", z3.And(z3.Not(dead), post.g["perr"]) == rec.error))
    eqs.append(("error_kind", z3.If(z3.And(z3.Not(dead), post.g["perr"]), post.g["perr_kind"], num(0)) == rec.error_kind))
    # the ghosts are what they stand for
    for name, fn in sums(OPS, k).items():
        eq = post.g[name] == OPS.sum(fn(post.cell(i)) for i in range(n))
        # S_chg is a pass scalar: a dead engine's step returns the pre-state, and no pass ran
        eqs.append((name, z3.Implies(z3.Not(dead), eq) if name == "S_chg" else eq))
    eqs.append(("sched_any", z3.Implies(z3.Not(dead), post.g["sched_any"] == z3.Or(*[rec.flags["scheduled"][i] for i in range(n)]))))
    prog = [z3.Select(post.a[f], i) for f in ("gen_s", "ctx_s", "evicted", "paused") for i in range(n)]
    eqs.append(("prog_any", post.g["prog_any"] == z3.Or(*prog)))
    s = z3.Solver()
    clock.limit(s, timeout)
    t0 = time.monotonic()
    r = s.check(z3.Not(z3.And(*[e for _, e in eqs])))
    secs = time.monotonic() - t0
    if r == z3.unsat:
        return Refinement(n, "proved", secs)
    if r == z3.sat:
        mdl = s.model()
        bad = [name for name, e in eqs if z3.is_false(mdl.eval(e, model_completion=True))]
        return Refinement(n, "failed", secs, "differs in " + ", ".join(bad[:8]))
    return Refinement(n, "unknown", secs, s.reason_unknown())


# -- the array model is the core's own step: checked, not assumed -----------------------------
# the micro-steps by the names the proofs' program (obligations.py `chain`) gives them
DRIVEN = {"start": "start", "arrive": "arrive", "snap": "snap", "gen_a": "gen_a", "evict": "evict",
          "rpause": "rpause", "gen_b": "gen_b", "ctx_a": "ctx_a", "pfp": "pfp", "ctx_b": "ctx_b", "det": "det",
          "det_end": "det_end", "fail": "fail", "fail_end": "fail_end", "exec_": "exec", "exec_end": "exec_end"}


def driven(k: Knobs, n: int) -> list[tuple]:
    """The micro-steps `V2ArrayModel.step` runs for n requests, in order, as (name, c, j) (`DRIVEN` names)."""
    m = V2ArrayModel(SYMBOLIC, k, lists=True)
    ran = []

    def noting(name, method):
        def run(st, *cursors):
            c, j = (list(cursors) + [None, None])[:2]
            ran.append((name, c, j))
            return method(st, *cursors)
        return run
    for method, name in DRIVEN.items():
        setattr(m, method, noting(name, getattr(m, method)))
    m.step(core_slots(n), n)
    return ran


def core_slots(n: int) -> ArrayState:
    """An n-request state of every request pending (only its shape matters to the order)."""
    a = {f: [False if t is bool else 0 for _ in range(n)] for f, t in {**REQ, **PARAMS}.items()}
    g = {f: False if t is bool else 0 for f, t in STATE_GLOBALS.items()}
    g.update({name: 0 for name in GHOSTS})
    return ArrayState(a, g, n)


def program_order(k: Knobs, up_to: int) -> tuple[str, str]:
    """The core runs the micro-steps in the order the proofs for every n take them (obligations.py `chain`),
    for n = 0..up_to."""
    for n in range(up_to + 1):
        want, got = program(n), driven(k, n)
        if want != got:
            at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            return "failed", (f"for {n} requests the core's micro-step {at} is {got[at] if at < len(got) else 'none'}, "
                              f"the proofs' program has {want[at] if at < len(want) else 'none'}")
    return "proved", ""


def core_is_the_micro_steps(k: Knobs, up_to: int) -> tuple[str, str]:
    """`TrtllmV2Core.step` on n fresh slots is, term for term, one pass of the micro-steps on those slots
    (`trtllm_v2_micro.core_step`), for n = 1..up_to: every field, global and record entry the same Z3 term."""
    core = CORES["trtllm_v2"]
    for n in range(1, up_to + 1):
        pre, params = fresh_state(core, n, f"tie{n}"), Params(fresh_params_slots(n, f"tie{n}.w"))
        post, rec = core.step(SYMBOLIC, k, params, pre)
        post2, rec2 = core_step(SYMBOLIC, k, params, pre)
        pairs = [(f"r{i}.{f}", post.req[i][f], post2.req[i][f]) for i in range(n) for f in post2.req[i]]
        pairs += [(f, post.g[f], post2.g[f]) for f in post2.g]
        pairs += [(f"r{i}.tokens", rec.tokens[i], rec2.tokens[i]) for i in range(n)]
        pairs += [(f"r{i}.{f}", rec.flags[f][i], rec2.flags[f][i]) for f in rec2.flags for i in range(n)]
        pairs += [(f, getattr(rec, f), getattr(rec2, f)) for f in ("charged", "error", "error_kind")]
        differ = next((name for name, a, b in pairs if not _same(a, b)), None)
        if differ is not None:
            return "failed", f"for {n} requests the core's step differs from the micro-steps in {differ}"
    return "proved", ""


def _same(a, b) -> bool:
    if z3.is_expr(a) and z3.is_expr(b):
        return a.eq(b)
    return not z3.is_expr(a) and not z3.is_expr(b) and a == b and type(a) is type(b)


def tied(k: Knobs) -> list[tuple]:
    """The premises that make the proofs for every n proofs about the core: its step is the micro-steps
    (`core_is_the_micro_steps`), run in the order the proofs take them (`program_order`), at every n up to
    a bound past the constants the step's code uses (sealed.py `structure_bound`); as argument parts."""
    t0 = time.monotonic()
    core = CORES["trtllm_v2"]
    pre, params = fresh_state(core, 2, "bound"), Params(fresh_params_slots(2, "bound.w"))
    bound, by = structure_bound(lambda kk: core.step(SYMBOLIC, kk, params, pre), k)
    if bound > MAX_BOUND:
        return [("refines", "the core's step is the micro-steps", "failed", time.monotonic() - t0,
                 f"the step computes with {bound - 2} ({by}): n up to {MAX_BOUND} cannot reach it")]
    st, why = core_is_the_micro_steps(k, bound)
    out = [("refines", f"the core's step is the micro-steps, n = 1..{bound}", st, time.monotonic() - t0, why)]
    t0 = time.monotonic()
    st, why = program_order(k, bound)
    out.append(("refines", f"the micro-steps run in the proofs' order, n = 0..{bound}", st, time.monotonic() - t0, why))
    return out


# -- concrete replay -----------------------------------------------------------------------
def concrete_state(s: SlotState, p: Params, n: int) -> ArrayState:
    """A concrete slot state (and its workload) as an array state with its ghosts left to `put`'s
    definition: each ghost the concrete sum."""
    a = {}
    for f, t in {**REQ, **PARAMS}.items():
        arr = z3.K(z3.IntSort(), z3.BoolVal(False) if t is bool else num(0))
        for i in range(n):
            v = s.req[i][f] if f in REQ else p.slots[i][f]
            arr = z3.Store(arr, i, z3.BoolVal(bool(v)) if t is bool else num(int(v)))
        a[f] = arr
    st = ArrayState(a, {}, z3.IntVal(n))
    for f in STATE_GLOBALS:
        v = s.g[f]
        st.g[f] = z3.BoolVal(bool(v)) if isinstance(v, bool) else num(int(v))
    st.g.update({f: num(0) for f in GHOSTS})
    return st


def read_back(st: ArrayState, n: int) -> SlotState:
    def val(t):
        v = z3.simplify(t)
        return z3.is_true(v) if z3.is_bool(v) else v.as_long()
    req = [{f: val(z3.Select(st.a[f], i)) for f in REQ} for i in range(n)]
    return SlotState(req, {f: val(st.g[f]) for f in STATE_GLOBALS})


def replay_steps(cfg: EngineConfig, states: list[SlotState], params: Params) -> tuple[bool, str, bool]:
    """Each consecutive pair of concrete core states (one engine step apart) is one array-model pass.
    Returns (all equal, message, whether the last pass scheduled anything)."""
    k = Knobs.of(cfg)
    m = V2ArrayModel(CONCRETE_Z3, k, fold=True)
    n = len(states[0].req)
    scheduled = False
    for t, (a, b) in enumerate(zip(states, states[1:])):
        st = concrete_state(a, params, n)
        for name, fn in m.sums.items():
            if name not in GHOSTS:   # a pass's own ghost (S_chg) starts with the pass
                continue
            st.g[name] = z3.simplify(CONCRETE_Z3.sum(fn(st.cell(i)) for i in range(n)))
        post = m.step(st, n)
        got = read_back(post, n)
        scheduled = z3.is_true(z3.simplify(z3.And(z3.Not(post.g["dead"]), post.g["sched_any"])))
        for i in range(n):
            for f in REQ:
                want = b.req[i][f]
                if got.req[i][f] != (bool(want) if REQ[f] is bool else want):
                    return False, f"step {t + 1}: slot {i}.{f}: array model {got.req[i][f]} != core {want}", scheduled
        for f in STATE_GLOBALS:
            if got.g[f] != b.g[f]:
                return False, f"step {t + 1}: {f}: array model {got.g[f]} != core {b.g[f]}", scheduled
    return True, f"{len(states) - 1} engine steps equal in the array model", scheduled


def replay_counterexample(cex) -> tuple[bool, str]:
    """A bounded search's trace (checkers/bmc.py `Counterexample`, decode runs expanded) run in the
    array model at its n, step for step against the core; a LIVE-NO-PROGRESS trace must end with a
    pass that schedules nothing there too."""
    cfg = cex.cfg
    core = CORES[cfg.policy]
    n = len(cex.states[0])
    k, params = Knobs.of(cfg), Params.of(cex.workload).padded(n)
    state = core.initial(CONCRETE, k, params)
    states = [state]
    for _ in range(cex.steps):
        state, _ = core.step(CONCRETE, k, params, state)
        states.append(state)
    ok, msg, scheduled = replay_steps(cfg, states, params)
    if ok and cex.property == "LIVE-NO-PROGRESS" and scheduled:
        return False, msg + ", but its last pass schedules a request"
    return ok, msg + (f" at n = {n}" if ok else "")


# -- the lifted invariants cover the slot invariants ----------------------------------------
def lifting(k: Knobs, n: int, slot_invariants, per_index_class, timeout: float = 300.0,
            drop: tuple = (), cls: str = "c1") -> Refinement:
    """For n requests, a state satisfying the array invariants between steps (at every index, with
    each ghost its sum) satisfies `slot_invariants` (the core's and the claim's, over slots): what
    the proof for every n proves includes them."""
    m = V2ArrayModel(OPS, k)
    st = defined_pre(m, n)
    slots, params = slot_view(st, n)
    hyps = []
    for i in range(n):
        hyps += [_b(c) for c in per_index(OPS, k, st, i, Point("P0"), drop, cls).values()]
        hyps += workload_at(OPS, k, st, i, per_index_class)
    hyps += [_b(c) for c in scalars(OPS, k, st, Point("P0"), drop, cls).values()]
    goals = [_b(c) for c in slot_invariants(OPS, k, params, slots).values()]
    s = z3.Solver()
    clock.limit(s, timeout)
    s.add(*hyps)
    t0 = time.monotonic()
    if s.check() != z3.sat:   # contradictory array invariants would imply anything
        return Refinement(n, "failed", time.monotonic() - t0, "the array invariants are not satisfiable")
    r = s.check(z3.Not(z3.And(*goals)))
    secs = time.monotonic() - t0
    if r == z3.unsat:
        return Refinement(n, "proved", secs)
    if r == z3.sat:
        mdl = s.model()
        bad = [name for name, c in slot_invariants(OPS, k, params, slots).items()
               if z3.is_false(mdl.eval(_b(c), model_completion=True))]
        return Refinement(n, "failed", secs, "not implied: " + ", ".join(bad[:8]))
    return Refinement(n, "unknown", secs, s.reason_unknown())


def _b(x):
    return z3.BoolVal(x) if isinstance(x, bool) else x
