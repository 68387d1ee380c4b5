"""Scenario files for `schedproof check`: any number may be a closed range `[low, high]`.

The file is the `run` format (schedproof/scenario.py) plus ranges and an optional [check]
table. The file is validated by the `run` loader twice, once with every range at its low end and
once at its high end, so each field keeps its one-line error; the per-request relations between
ranged fields (arrival <= cancel_at, output_len <= max_new, prefix_len <= prompt) are constraints
of the search, and at each end the pair takes the nearest values that satisfy them (arrival
[0, 64] with cancel_at [0, 10] is checked as 0/0 and 10/10), so a file is refused only when no
request in its ranges satisfies them. The engine knobs are validated at every corner of their
ranges as well: the policies' rules between knobs (vLLM's max_num_batched_tokens >= max_num_seqs,
say) are monotone in each knob, so a box whose corners pass holds no design the engine refuses.
A range's ends are held to model/limits.py here and a fixed value by the `run` loader, to the same
limit; the request slots (the high ends of the counts) at most MAX_SLOTS.

    [check]
    early_stops = true      # a request without output_len may stop at any length (default true)
    cancellations = true    # a request without cancel_at may be cancelled at any step (default true)
    max_depth = 24          # transitions to unroll at most (default 24)
    properties = ["LIVE-NO-PROGRESS"]   # property IDs to search for (default: all)
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import Optional

from checkers.space import MAX_SLOTS, Group, Space
from model import limits
from model.config import ConfigError
from model.policy import POLICIES
from model.symbolic.slots import Knobs
from properties.symbolic import PRIORITY

from .scenario import ScenarioError, _parse, read_toml

RANGED_ENGINE = set(Knobs.NUMERIC)
RANGED_REQUEST = {"count", "prompt", "max_new", "arrival", "output_len", "cancel_at", "prefix_len", "priority"}
CHECK_KEYS = {"early_stops", "cancellations", "max_depth", "properties"}
DEFAULT_MAX_DEPTH = 24


@dataclasses.dataclass(frozen=True)
class CheckSpec:
    path: str
    name: str
    space: Space
    max_depth: int
    properties: Optional[tuple[str, ...]]
    description: str = ""


def load_check(path: str) -> CheckSpec:
    raw = read_toml(path)
    try:
        return _parse_check(path, raw)
    except ConfigError as exc:
        raise ScenarioError(path, exc.field, exc.reason) from None


def check_from_table(path: str, raw: dict) -> CheckSpec:
    """A design with ranges from its TOML table (a file's, changed by `sweep`); bad input as for a file."""
    try:
        return _parse_check(path, raw)
    except ConfigError as exc:
        raise ScenarioError(path, exc.field, exc.reason) from None


def _parse_check(path: str, raw: dict) -> CheckSpec:
    raw = copy.deepcopy(raw)
    check = raw.pop("check", {})
    if not isinstance(check, dict):
        raise ConfigError("check", "must be a table")
    for key in check:
        if key not in CHECK_KEYS:
            raise ConfigError(f"check.{key}", f"unknown field (known: {', '.join(sorted(CHECK_KEYS))})")
    ranges = _collect_ranges(raw)
    low = _parse(path, _at(raw, ranges, 0))
    _parse(path, _at(raw, ranges, 1))      # the high ends, validated as a run file
    _corners(path, raw, ranges)
    pool = POLICIES[low.cfg.policy].pool_option
    if pool and getattr(low.cfg.options, pool) is not None:
        if ("engine", "block_size") in ranges:
            raise ConfigError("engine.block_size", f"a range needs the pool as num_blocks: engine.options.{pool} "
                                                   "converts to a number of pages that depends on the page size")
    knobs = {}
    for name in Knobs.NUMERIC:
        key = ("engine", name)
        knobs[name] = ranges.get(key, getattr(low.cfg, name))
    if ("engine", "num_blocks") in ranges and low.cfg.num_blocks != ranges[("engine", "num_blocks")][0]:
        raise ConfigError("engine.num_blocks", "a range needs the pool as num_blocks, not an engine option")
    groups = []
    for k, g in enumerate(raw["requests"]):
        fields = {}
        for f in ("prompt", "max_new", "arrival", "output_len", "cancel_at", "prefix_len", "priority"):
            if ("requests", k, f) in ranges:
                fields[f] = ranges[("requests", k, f)]
            elif f in g:
                fields[f] = g[f]
        count = ranges.get(("requests", k, "count"), g.get("count", 1))
        groups.append(Group(count, fields, g.get("prefix_group", -1)))
        slots = sum(c[1] if isinstance(c, tuple) else c for c in (grp.count for grp in groups))
        if slots > MAX_SLOTS:
            raise ConfigError(f"requests[{k}].count", f"the groups up to this one have {slots} requests at most; "
                                                      f"a check unrolls at most {MAX_SLOTS} request slots")
    early = _flag(check, "early_stops")
    cancels = _flag(check, "cancellations")
    max_depth = check.get("max_depth", DEFAULT_MAX_DEPTH)
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth <= 0:
        raise ConfigError("check.max_depth", f"must be a positive integer (got {max_depth!r})")
    if refused := limits.DEPTH.refusal(max_depth):
        raise ConfigError("check.max_depth", refused)
    props = check.get("properties")
    if props is not None:
        if not isinstance(props, list) or not props or not all(isinstance(p, str) for p in props):
            raise ConfigError("check.properties", "must be a non-empty list of property IDs")
        for p in props:
            if p not in PRIORITY:
                raise ConfigError("check.properties", f"{p!r} is not a property the checker searches "
                                                      f"(known: {', '.join(PRIORITY)})")
        props = tuple(props)
    return CheckSpec(path, low.name, Space(low.cfg, knobs, tuple(groups), early, cancels), max_depth, props,
                     low.description)


def _flag(check: dict, key: str) -> bool:
    value = check.get(key, True)
    if not isinstance(value, bool):
        raise ConfigError(f"check.{key}", f"must be true or false (got {value!r})")
    return value


def has_ranges(raw: dict) -> bool:
    """Whether a file's table has a [low, high] range (ConfigError where one cannot be a range)."""
    return bool(_collect_ranges(raw))


def _collect_ranges(raw: dict) -> dict:
    """Every [low, high] in the engine table and the request groups, checked and keyed by place."""
    out = {}
    engine = raw.get("engine")
    if isinstance(engine, dict):
        for key, value in engine.items():
            if isinstance(value, list):
                if key not in RANGED_ENGINE:
                    raise ConfigError(f"engine.{key}", "cannot be a range")
                out[("engine", key)] = _range(f"engine.{key}", value)
    groups = raw.get("requests")
    if isinstance(groups, list):
        for k, g in enumerate(groups):
            if not isinstance(g, dict):
                continue
            for key, value in g.items():
                if isinstance(value, list):
                    if key not in RANGED_REQUEST:
                        raise ConfigError(f"requests[{k}].{key}", "cannot be a range")
                    out[("requests", k, key)] = _range(f"requests[{k}].{key}", value)
    return out


def _range(field: str, value: list) -> tuple[int, int]:
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(field, f"a range must be two integers [low, high] (got {value!r})")
    lo, hi = value
    if lo > hi:
        raise ConfigError(field, f"a range must have low <= high (got [{lo}, {hi}])")
    if refused := limits.VALUE.refusal(lo) or limits.VALUE.refusal(hi):
        raise ConfigError(field, refused)
    return lo, hi


# (smaller, larger) fields of one request: the run loader requires smaller <= larger.
ORDERED_FIELDS = (("arrival", "cancel_at"), ("output_len", "max_new"), ("prefix_len", "prompt"))


def _at(raw: dict, ranges: dict, end: int) -> dict:
    """The file with every range replaced by one of its ends (0 low, 1 high), where an ordered
    pair with a range takes the values nearest that end which keep smaller <= larger."""
    out = copy.deepcopy(raw)
    for place, value in ranges.items():
        if place[0] == "engine":
            out["engine"][place[1]] = value[end]
        else:
            out["requests"][place[1]][place[2]] = value[end]
    groups = out.get("requests")
    for k, g in enumerate(groups if isinstance(groups, list) else []):
        if not isinstance(g, dict):
            continue      # the loader says what is wrong with it
        for small, large in ORDERED_FIELDS:
            if ("requests", k, small) not in ranges and ("requests", k, large) not in ranges:
                continue
            s_lo, s_hi = _bounds(raw["requests"][k].get(small), ranges.get(("requests", k, small)))
            l_lo, l_hi = _bounds(raw["requests"][k].get(large), ranges.get(("requests", k, large)))
            if s_lo is None or l_lo is None:
                continue      # absent or mistyped: the loader's own check reports it
            if s_lo > l_hi:
                raise ConfigError(f"requests[{k}].{small}", f"no value in [{s_lo}, {s_hi}] is <= {large}, "
                                                             f"which is at most {l_hi}")
            if end == 0:
                g[small], g[large] = s_lo, max(l_lo, s_lo)
            else:
                g[small], g[large] = min(s_hi, l_hi), l_hi
    return out


def _corners(path: str, raw: dict, ranges: dict) -> None:
    """The file with the engine knobs at every corner of their ranges (the requests at their low
    ends; no rule relates them to the knobs), beyond the two ends `_parse_check` already loaded."""
    ranged = [place[1] for place in ranges if place[0] == "engine" and ranges[place][0] != ranges[place][1]]
    base = _at(raw, ranges, 0)
    for ends in itertools.product((0, 1), repeat=len(ranged)):
        if len(set(ends)) < 2:
            continue
        doc = copy.deepcopy(base)
        corner = {name: ranges[("engine", name)][end] for name, end in zip(ranged, ends)}
        doc["engine"].update(corner)
        try:
            _parse(path, doc)
        except ConfigError as exc:
            at = ", ".join(f"{name} = {v}" for name, v in corner.items())
            raise ConfigError(exc.field, f"{exc.reason} (at {at}, a corner of the ranges)") from None


def _bounds(value, ranged) -> tuple:
    if ranged is not None:
        return ranged
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    return None, None

