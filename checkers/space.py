"""What a check searches: a design whose numbers may be ranges, as Z3 terms and constraints.

A `Space` is the engine configuration with numeric knobs given as a value or a closed range,
and request groups whose fields are values or ranges. `Encoding` turns it into knob terms,
per-slot workload terms and the constraints that tie them to the space:
- slots are requests in submission order: present slots come first, and (arrival, group) never
  decreases along the slots (the simulator's stable sort by arrival, file order within a step);
- each group contributes between its `count` bounds of slots, each within its field ranges;
- a field the file leaves out is the environment's free choice where the issue asks for it:
  an early stop anywhere before max_new (`output_len`), a cancellation at any step from arrival
  (`cancel_at`); both can be switched off.
"""

from __future__ import annotations

import dataclasses
from typing import Union

import z3

from model import limits
from model.config import EngineConfig
from model.simulator import RequestSpec, Workload
from model.symbolic.slots import Knobs, Params

from .encode import as_int, int_var

Range = tuple[int, int]
Value = Union[int, Range]

# Every number a space may hold, and the horizon of a free cancellation: keeps the 32-bit
# unrolling free of overflow (values a core computes stay below 2^31; see ops.SORT).
MAX_VALUE = limits.MAX_VALUE
# Request slots a check file may ask for (the sum of its groups' largest counts). The search
# reaches a large space only through capped subsets (bmc.CAP_TIERS, up to 32 requests per group),
# and building one step of a space costs time in its slots beyond any time-out.
MAX_SLOTS = 64

GROUP_FIELDS = ("prompt", "max_new", "arrival", "output_len", "cancel_at", "prefix_len", "priority")


@dataclasses.dataclass(frozen=True)
class Group:
    count: Value
    fields: dict            # GROUP_FIELDS name -> Value, or absent (None) for the free choice
    prefix_group: int = -1

    def __post_init__(self):
        # a field the encoding does not read would be dropped without a word (prefix_group is
        # the attribute above, not a field)
        unknown = set(self.fields) - set(GROUP_FIELDS)
        if unknown:
            raise ValueError(f"Group fields {sorted(unknown)} are not among {GROUP_FIELDS}")


@dataclasses.dataclass(frozen=True)
class Space:
    template: EngineConfig          # structure and options; numeric knobs at their low ends
    knobs: dict                     # Knobs.NUMERIC name -> Value
    groups: tuple[Group, ...]
    early_stops: bool = True
    cancellations: bool = True

    @property
    def slots(self) -> int:
        return sum(hi(g.count) for g in self.groups)

    @property
    def symbolic_knobs(self) -> list[str]:
        return [name for name, v in self.knobs.items() if isinstance(v, tuple) and v[0] != v[1]]


def lo(v: Value) -> int:
    return v[0] if isinstance(v, tuple) else v


def hi(v: Value) -> int:
    return v[1] if isinstance(v, tuple) else v


@dataclasses.dataclass
class Encoding:
    space: Space
    knobs: Knobs
    knob_terms: dict          # name -> int or z3 term
    params: Params
    group_of: list            # per slot: int or z3 term
    constraints: list

    @property
    def count(self):
        return z3.Sum([z3.If(s["present"], 1, 0) for s in self.params.slots])


def _ranged(name: str, v: Value, cons: list):
    if not isinstance(v, tuple):
        return v
    if v[0] == v[1]:
        return v[0]
    t = int_var(name)
    cons += [t >= v[0], t <= v[1]]
    return t


def encode(space: Space) -> Encoding:
    cons: list = []
    knob_terms = {name: _ranged(f"knob.{name}", v, cons) for name, v in space.knobs.items()}
    base = Knobs.of(space.template)
    knobs = Knobs(**{**base.__dict__, **knob_terms})
    n = space.slots
    ng = len(space.groups)
    slots, group_of = [], []
    # A shared-prefix field every group gives the same fixed value (-1 / 0: none) is that constant
    # in every slot, so that a core's prefix bookkeeping folds away; a value other than an absent
    # slot's only where every slot is present.
    shared_prefix = {}
    every_slot = all(lo(grp.count) == hi(grp.count) for grp in space.groups)
    for f, absent in (("prefix_group", -1), ("prefix_len", 0)):
        values = {grp.prefix_group if f == "prefix_group" else grp.fields.get(f, 0) for grp in space.groups}
        if len(values) == 1:
            v = values.pop()
            v = v[0] if isinstance(v, tuple) and v[0] == v[1] else v
            if isinstance(v, int) and (v == absent or every_slot):
                shared_prefix[f] = v
    for i in range(n):
        w = {f: int_var(f"r{i}.{f}") for f in ("prompt", "max_new", "arrival", "output_len", "cancel_at",
                                                "prefix_group", "prefix_len", "priority")}
        w["present"] = z3.Bool(f"r{i}.present")
        w.update(shared_prefix)
        g = int_var(f"r{i}.group") if ng > 1 else 0
        if ng > 1:
            cons += [g >= 0, g < ng]
        slots.append(w)
        group_of.append(g)
    for i, (w, g) in enumerate(zip(slots, group_of)):
        if i > 0:
            prev, pg = slots[i - 1], group_of[i - 1]
            cons.append(z3.Implies(w["present"], prev["present"]))
            order = prev["arrival"] < w["arrival"]
            if ng > 1:
                order = z3.Or(order, z3.And(prev["arrival"] == w["arrival"], pg <= g))
            else:
                order = z3.Or(order, prev["arrival"] == w["arrival"])
            cons.append(z3.Implies(w["present"], order))
        cons.append(z3.Implies(z3.Not(w["present"]), z3.And(
            w["prompt"] == 1, w["max_new"] == 1, w["arrival"] == 0, w["output_len"] == 0, w["cancel_at"] == -1,
            w["prefix_group"] == -1, w["prefix_len"] == 0, w["priority"] == 0)))
        per_group = [_group_constraints(space, grp, w) for grp in space.groups]
        if ng > 1:
            cons.append(z3.Implies(w["present"], z3.And([z3.Implies(g == k, c) for k, c in enumerate(per_group)])))
        else:
            cons.append(z3.Implies(w["present"], per_group[0]))
    for k, grp in enumerate(space.groups):
        members = z3.Sum([z3.If(z3.And(w["present"], g == k) if ng > 1 else w["present"], 1, 0)
                          for w, g in zip(slots, group_of)])
        cons += [members >= lo(grp.count), members <= hi(grp.count)]
    return Encoding(space, knobs, knob_terms, Params(slots), group_of, cons)


def _group_constraints(space: Space, grp: Group, w: dict):
    out = []
    for f in ("prompt", "max_new", "arrival", "prefix_len", "priority"):
        v = grp.fields.get(f)
        if v is None:
            v = {"arrival": 0, "prefix_len": 0, "priority": 0}[f]
        out += [w[f] >= lo(v), w[f] <= hi(v)]
    out.append(w["prefix_group"] == grp.prefix_group)
    out.append(w["prompt"] >= w["prefix_len"])
    stop = grp.fields.get("output_len")
    if stop is not None:
        out += [w["output_len"] >= lo(stop), w["output_len"] <= hi(stop), w["output_len"] <= w["max_new"]]
    elif space.early_stops:
        out.append(z3.Or(w["output_len"] == 0, z3.And(w["output_len"] >= 1, w["output_len"] <= w["max_new"])))
    else:
        out.append(w["output_len"] == 0)
    cancel = grp.fields.get("cancel_at")
    if cancel is not None:
        out += [w["cancel_at"] >= lo(cancel), w["cancel_at"] <= hi(cancel), w["cancel_at"] >= w["arrival"]]
    elif space.cancellations:
        out.append(z3.Or(w["cancel_at"] == -1, z3.And(w["cancel_at"] >= w["arrival"], w["cancel_at"] <= MAX_VALUE)))
    else:
        out.append(w["cancel_at"] == -1)
    return z3.And(out)


def concrete_config(space: Space, model: z3.ModelRef, enc: Encoding) -> EngineConfig:
    values = {name: (as_int(model.eval(t, model_completion=True)) if not isinstance(t, int) else t)
              for name, t in enc.knob_terms.items()}
    return dataclasses.replace(space.template, **values)


def concrete_workload(model: z3.ModelRef, enc: Encoding):
    specs = []
    for w in enc.params.slots:
        val = {f: (model.eval(t, model_completion=True) if not isinstance(t, (int, bool)) else t)
               for f, t in w.items()}
        if not z3.is_true(val["present"]):
            continue
        get = {f: v if isinstance(v, int) else as_int(v) for f, v in val.items() if f != "present"}
        specs.append(RequestSpec(
            prompt=get["prompt"], max_new=get["max_new"], arrival=get["arrival"],
            output_len=get["output_len"] or None,
            cancel_at=None if get["cancel_at"] < 0 else get["cancel_at"],
            prefix_group=get["prefix_group"], prefix_len=get["prefix_len"], priority=get["priority"]))
    return Workload(tuple(specs))


def fixed_space(cfg: EngineConfig, workload, early_stops: bool = False, cancellations: bool = False) -> Space:
    """One concrete design and workload as a space (for tests and no-range checks)."""
    knobs = {name: getattr(cfg, name) for name in Knobs.NUMERIC}
    groups = tuple(Group(1, {"prompt": s.prompt, "max_new": s.max_new, "arrival": s.arrival,
                             **({"output_len": s.output_len} if s.output_len else {}),
                             **({"cancel_at": s.cancel_at} if s.cancel_at is not None else {}),
                             "prefix_len": s.prefix_len, "priority": s.priority}, s.prefix_group)
                   for s in workload.requests)
    return Space(cfg, knobs, groups, early_stops, cancellations)
