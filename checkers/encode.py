"""Z3 variables for slot states, workload parameters and knobs, and equalities between states."""

from __future__ import annotations

import z3

from model.symbolic.core import Core
from model.symbolic.ops import as_int, int_var  # noqa: F401  (re-exported)
from model.symbolic.slots import PARAM_FIELDS, SlotState


def var(name: str, typ: type):
    return z3.Bool(name) if typ is bool else int_var(name)


def fresh_state(core: Core, n: int, tag: str) -> SlotState:
    req = [{f: var(f"{tag}.r{i}.{f}", t) for f, t in core.req_fields().items()} for i in range(n)]
    g = {f: var(f"{tag}.{f}", t) for f, t in core.global_fields().items()}
    return SlotState(req, g)


PARAM_TYPES = {f: (bool if f == "present" else int) for f in PARAM_FIELDS}


def fresh_params_slots(n: int, tag: str = "w") -> list[dict]:
    return [{f: var(f"{tag}.r{i}.{f}", t) for f, t in PARAM_TYPES.items()} for i in range(n)]


def state_eq(a: SlotState, b: SlotState, skip: tuple[str, ...] = ()) -> list:
    """Equalities field by field (Python values are turned into Z3 constants by `==`)."""
    out = []
    for ra, rb in zip(a.req, b.req):
        out += [_eq(ra[f], rb[f]) for f in ra if f not in skip]
    out += [_eq(a.g[f], b.g[f]) for f in a.g if f not in skip]
    return [e for e in out if e is not True]


def _eq(x, y):
    if isinstance(x, (bool, int)) and isinstance(y, (bool, int)):
        return True if x == y else False
    if isinstance(x, (bool, int)):
        x, y = y, x
    return x == y


def evaluate(model: z3.ModelRef, value):
    """A term's value in a model, as a Python int/bool."""
    if isinstance(value, (bool, int)):
        return value
    v = model.eval(value, model_completion=True)
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    return as_int(v)


def evaluate_state(model: z3.ModelRef, s: SlotState) -> SlotState:
    return SlotState([{f: evaluate(model, v) for f, v in r.items()} for r in s.req],
                     {f: evaluate(model, v) for f, v in s.g.items()})
