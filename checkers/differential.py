"""The two checks that hold a core to the engine-checked policy it re-expresses.

- `diverges(cfg, workload)`: run the simulator (model/policies/) and the core (`run_core`) on one
  workload; the first step where any field of the state, or the step record, differs.
- `RelationChecker`: the core's Z3 transition relation, built once with symbolic knobs, workload
  and pre-state; `rejects(cfg, workload, trace)` asks the solver whether each simulator step
  (pre-state, post-state, record) satisfies it, and names the first it refuses.
- `CompiledRelation`: the same relation's terms evaluated by Z3's own operator semantics in Python
  (about 0.3 ms a step where a solver call takes about 1 s), for thousands of runs; the tests tie
  it to `RelationChecker` on short runs, including a step both must refuse.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import z3

from model.config import EngineConfig
from model.simulator import Trace, Workload, simulate
from model.symbolic.core import CORES, Core
from model.symbolic.ops import WIDTH, Symbolic
from model.symbolic.run import run_core
from model.symbolic.slots import RECORD_FLAGS, Knobs, Params, diff, diff_record, record_of

from .encode import fresh_params_slots, fresh_state, int_var, state_eq


def diverges(cfg: EngineConfig, workload: Workload, max_steps: int = 2000) -> Optional[str]:
    core = CORES[cfg.policy]
    n = len(workload.requests)
    sim = simulate(cfg, workload, max_steps=max_steps)
    ct = run_core(core, Knobs.of(cfg), Params.of(workload), max_steps=max_steps)
    for t, (s_sim, s_core) in enumerate(zip(sim.states, ct.states)):
        d = diff(core.abstract(cfg, s_sim, n), s_core)
        if d:
            return f"state {t}: simulator vs core: {d}"
        if t < len(sim.records) and t < len(ct.records):
            d = diff_record(record_of(sim.records[t], n), ct.records[t])
            if d:
                return f"record {t}: simulator vs core: {d}"
    if len(sim.states) != len(ct.states) or sim.end != ct.end:
        return f"the runs end differently: simulator {sim.end} after {len(sim.records)} steps, " \
               f"core {ct.end} after {len(ct.records)}"
    return None


class RelationChecker:
    """One symbolic step of `core` over n slots, for the structure (chunked prefill, chunk unit,
    options) of `template`; the numeric knobs are symbolic."""

    def __init__(self, core: Core, template: EngineConfig, n: int):
        ops = Symbolic()
        self.core, self.n = core, n
        base = Knobs.of(template)
        self.knob_vars = {f: int_var(f"k.{f}") for f in Knobs.NUMERIC}
        self.knobs = Knobs(**{**base.__dict__, **self.knob_vars})
        self.param_slots = fresh_params_slots(n)
        self.pre = fresh_state(core, n, "pre")
        self.post, self.rec = core.step(ops, self.knobs, Params(self.param_slots), self.pre)
        self.solver = z3.Solver()

    def rejects(self, cfg: EngineConfig, workload: Workload, trace: Trace) -> Optional[str]:
        n = self.n
        params = Params.of(workload).padded(n)
        fixed = [self.knob_vars[f] == getattr(cfg, f) for f in Knobs.NUMERIC]
        for slot_vars, slot in zip(self.param_slots, params.slots):
            fixed += [slot_vars[f] == slot[f] for f in slot_vars]
        for t, rec in enumerate(trace.records):
            pre = self.core.abstract(cfg, trace.states[t], n)
            post = self.core.abstract(cfg, trace.states[t + 1], n)
            want = record_of(rec, n)
            eqs = state_eq(self.pre, pre) + state_eq(self.post, post) + self._record_eq(want)
            if False in eqs:
                return f"step {t}: the relation's constant part differs from the simulator"
            if self.solver.check(*fixed, *eqs) != z3.sat:
                return f"step {t}: the solver's relation refuses the simulator's step"
        return None

    def _record_eq(self, want) -> list:
        out = []
        for a, b in zip(self.rec.tokens, want.tokens):
            out.append(_eq(a, b))
        for f in RECORD_FLAGS:
            out += [_eq(a, b) for a, b in zip(self.rec.flags[f], want.flags[f])]
        out += [_eq(self.rec.charged, want.charged), _eq(self.rec.error, want.error),
                _eq(self.rec.error_kind, want.error_kind)]
        return [e for e in out if e is not True]


def _eq(x, y):
    return x == y


def _value(x, like):
    """A Python value as a Z3 value of the sort of `like`."""
    if z3.is_bool(like):
        return z3.BoolVal(bool(x))
    return z3.IntVal(x) if z3.is_int(like) else z3.BitVecVal(x, like.size())


# -- the relation without a solver call per step ------------------------------------------------

def _flat_state(s):
    return [v for r in s.req for v in r.values()] + list(s.g.values())


def _flat_rec(rec):
    return list(rec.tokens) + [f for k in RECORD_FLAGS for f in rec.flags[k]] + \
        [rec.charged, rec.error, rec.error_kind]


def _idiv(a, b):
    """SMT-LIB integer division: a = b * q + r with 0 <= r < |b|."""
    if b == 0:
        raise ZeroDivisionError("Z3 leaves integer division by zero unspecified")
    r = a % abs(b)
    return (a - r) // b


def _imod(a, b):
    """SMT-LIB integer remainder: 0 <= r < |b|."""
    if b == 0:
        raise ZeroDivisionError("Z3 leaves integer remainder by zero unspecified")
    return a % abs(b)


def _wrap(a):
    """A bit-vector value as a signed integer of the kernel's width."""
    half = 1 << (WIDTH - 1)
    return (a + half) % (2 * half) - half


def _unsigned(a):
    """The unsigned view of a (signed) bit-vector value."""
    return a % (1 << WIDTH)


def _sdiv(a, b):
    """SMT-LIB bvsdiv: truncating; by zero, -1 for a >= 0 and 1 otherwise."""
    if b == 0:
        return -1 if a >= 0 else 1
    q = abs(a) // abs(b)
    return _wrap(q if (a >= 0) == (b >= 0) else -q)


_NARY = {z3.Z3_OP_AND: " and ", z3.Z3_OP_OR: " or ", z3.Z3_OP_ADD: " + ", z3.Z3_OP_MUL: " * ",
         z3.Z3_OP_SUB: " - "}
_BV_NARY = {z3.Z3_OP_BADD: " + ", z3.Z3_OP_BMUL: " * ", z3.Z3_OP_BSUB: " - "}
_BIN = {z3.Z3_OP_LE: "<=", z3.Z3_OP_LT: "<", z3.Z3_OP_GE: ">=", z3.Z3_OP_GT: ">", z3.Z3_OP_EQ: "==",
        z3.Z3_OP_XOR: "!=", z3.Z3_OP_SLEQ: "<=", z3.Z3_OP_SLT: "<", z3.Z3_OP_SGEQ: ">=", z3.Z3_OP_SGT: ">"}
_UNSIGNED_BIN = {z3.Z3_OP_ULEQ: "<=", z3.Z3_OP_ULT: "<", z3.Z3_OP_UGEQ: ">=", z3.Z3_OP_UGT: ">"}
_CALL = {z3.Z3_OP_IDIV: "_idiv", z3.Z3_OP_MOD: "_imod", z3.Z3_OP_BSDIV: "_sdiv"}


def compile_terms(terms, inputs):
    """The Z3 terms as one Python function of the inputs' values, one line per DAG node (Z3's own
    semantics for each operator; anything else is refused). The DAG is walked through Z3's C API:
    the object wrappers cost seconds on the few thousand nodes of a 5-slot relation."""
    ctx = next((t.ctx for t in terms if isinstance(t, z3.ExprRef)), z3.main_ctx()).ref()
    index = {v.get_id(): i for i, v in enumerate(inputs)}
    names, lines = {}, []
    stack = [(t.as_ast(), False) for t in terms]
    while stack:
        node, ready = stack.pop()
        tid = z3.Z3_get_ast_id(ctx, node)
        if tid in names:
            continue
        if z3.Z3_get_ast_kind(ctx, node) == z3.Z3_NUMERAL_AST:
            value = int(z3.Z3_get_numeral_string(ctx, node))
            if z3.Z3_get_sort_kind(ctx, z3.Z3_get_sort(ctx, node)) == z3.Z3_BV_SORT:
                value = _wrap(value)         # bit-vector numerals are unsigned; the values are signed
            names[tid] = f"({value})"
            continue
        kids = [z3.Z3_get_app_arg(ctx, node, i) for i in range(z3.Z3_get_app_num_args(ctx, node))]
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in kids)
            continue
        k = z3.Z3_get_decl_kind(ctx, z3.Z3_get_app_decl(ctx, node))
        a = [names[z3.Z3_get_ast_id(ctx, c)] for c in kids]
        if k in (z3.Z3_OP_TRUE, z3.Z3_OP_FALSE):
            expr = str(k == z3.Z3_OP_TRUE)
        elif tid in index:
            expr = f"x[{index[tid]}]"
        elif k == z3.Z3_OP_ITE:
            expr = f"({a[1]} if {a[0]} else {a[2]})"
        elif k in _NARY:
            expr = "(" + _NARY[k].join(a) + ")"
        elif k in _BV_NARY:
            expr = "_wrap(" + _BV_NARY[k].join(a) + ")"
        elif k == z3.Z3_OP_UMINUS:
            expr = f"(-{a[0]})"
        elif k == z3.Z3_OP_BNEG:
            expr = f"_wrap(-{a[0]})"
        elif k in _CALL:
            expr = f"{_CALL[k]}({a[0]}, {a[1]})"
        elif k == z3.Z3_OP_NOT:
            expr = f"(not {a[0]})"
        elif k == z3.Z3_OP_IMPLIES:
            expr = f"((not {a[0]}) or {a[1]})"
        elif k == z3.Z3_OP_DISTINCT:
            expr = "(len({" + ", ".join(a) + "}) == " + str(len(a)) + ")"
        elif k in _BIN and len(a) == 2:
            expr = f"({a[0]} {_BIN[k]} {a[1]})"
        elif k in _UNSIGNED_BIN:
            expr = f"(_unsigned({a[0]}) {_UNSIGNED_BIN[k]} _unsigned({a[1]}))"
        else:
            raise NotImplementedError(f"Z3 operator {z3.Z3_ast_to_string(ctx, node)[:80]} in the relation")
        names[tid] = f"v{tid}"
        lines.append(f"    v{tid} = {expr}")
    outs = ", ".join(names[t.get_id()] for t in terms)
    env = {"_idiv": _idiv, "_imod": _imod, "_wrap": _wrap, "_unsigned": _unsigned, "_sdiv": _sdiv}
    exec(compile("def relation(x):\n" + "\n".join(lines) + f"\n    return [{outs}]\n", "<relation>", "exec"), env)
    return env["relation"]


class CompiledRelation(RelationChecker):
    """The relation RelationChecker builds (symbolic knobs, workload and pre-state), checked on each
    simulator step by evaluating its terms on the step's inputs instead of a solver call. The
    relation is a function of those inputs (post-state and record are terms over them), so the
    solver accepts a step iff the evaluated outputs equal the simulator's; evaluation takes about
    0.3 ms a step where the solver call takes about 1 s (test_compiled_relation_matches_the_solver
    ties the two)."""

    def __init__(self, core, template, n):
        super().__init__(core, template, n)
        outs = _flat_state(self.post) + _flat_rec(self.rec)
        self.const = {i: o for i, o in enumerate(outs) if isinstance(o, (bool, int))}
        self.sym = [i for i in range(len(outs)) if i not in self.const]
        inputs = self.extra_inputs() + [self.knob_vars[f] for f in Knobs.NUMERIC] + \
            [v for s in self.param_slots for v in s.values()] + _flat_state(self.pre)
        self.fn = compile_terms([outs[i] for i in self.sym], inputs)

    def extra_inputs(self) -> list:
        """Further symbolic inputs of the relation (a core's numeric options, say), in order."""
        return []

    def extra_values(self, cfg: EngineConfig) -> list:
        """Their values for one configuration."""
        return []

    def agrees_with_z3_simplifier(self, cfg: EngineConfig, workload: Workload, trace: Trace) -> bool:
        """The same evaluation done by Z3 itself: substitute every input and the simulator's
        outputs into `AND(term_i == out_i)`, simplify, expect true. The cross-check of the compiled
        evaluator (`compile_terms`), far cheaper than a solver call."""
        n = self.n
        outputs = _flat_state(self.post) + _flat_rec(self.rec)
        symbolic = [i for i, o in enumerate(outputs) if isinstance(o, z3.ExprRef)]
        outs = [z3.Const(f"out{i}", outputs[i].sort()) for i in symbolic]
        target = z3.And(*[outputs[i] == o for i, o in zip(symbolic, outs)])
        inputs = self.extra_inputs() + [self.knob_vars[f] for f in Knobs.NUMERIC] + \
            [v for s in self.param_slots for v in s.values()] + _flat_state(self.pre)
        params = Params.of(workload).padded(n)
        head = self.extra_values(cfg) + [getattr(cfg, f) for f in Knobs.NUMERIC] + \
            [slot[f] for s, slot in zip(self.param_slots, params.slots) for f in s]
        for t, rec in enumerate(trace.records):
            pre = self.core.abstract(cfg, trace.states[t], n)
            want = _flat_state(self.core.abstract(cfg, trace.states[t + 1], n)) + _flat_rec(record_of(rec, n))
            if any(not isinstance(o, z3.ExprRef) and o != w for o, w in zip(outputs, want)):
                return False
            values = head + _flat_state(pre) + [want[i] for i in symbolic]
            pairs = [(v, _value(x, v)) for v, x in zip(inputs + outs, values)]
            if not z3.is_true(z3.simplify(z3.substitute(target, *pairs))):
                return False
        return True

    def rejects(self, cfg, workload, trace):
        n = self.n
        params = Params.of(workload).padded(n)
        fixed = self.extra_values(cfg) + [getattr(cfg, f) for f in Knobs.NUMERIC] + \
            [slot[f] for s, slot in zip(self.param_slots, params.slots) for f in s]
        names = [f"slot {i}.{f}" for i, r in enumerate(self.post.req) for f in r] + list(self.post.g)
        for t, rec in enumerate(trace.records):
            pre = self.core.abstract(cfg, trace.states[t], n)
            post = self.core.abstract(cfg, trace.states[t + 1], n)
            want = _flat_state(post) + _flat_rec(record_of(rec, n))
            try:
                values = self.fn(fixed + _flat_state(pre))
            except ZeroDivisionError:
                # Z3 leaves division by zero unspecified, so evaluation cannot decide this step:
                # the solver does
                one = dataclasses.replace(trace, records=trace.records[t:t + 1], states=trace.states[t:t + 2])
                why = super().rejects(cfg, workload, one)
                if why is not None:
                    return why.replace("step 0:", f"step {t}:", 1)
                continue
            got = dict(self.const)
            got.update(zip(self.sym, values))
            for i in range(len(want)):
                if got[i] != want[i]:
                    what = names[i] if i < len(names) else f"record output {i - len(names)}"
                    return f"step {t}: {what}: relation {got[i]} != simulator {want[i]}"
        return None
