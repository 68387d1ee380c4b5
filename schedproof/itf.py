"""A model trace in the Informal Trace Format (ITF), and back.

Why ITF: it is the trace format of Apalache (ADR-015, https://apalache-mc.org/docs/adr/015adr-trace.html)
and Quint, so a schedproof trace can be read by their tools (the Quint REPL and test runner, the ITF trace
viewers, the ITF readers for Rust and Python) and compared with a trace one of them wrote.

The document: `#meta` (free-form JSON, which ITF leaves alone) carries what a state cannot: the engine
configuration (`targets.checking.config_to_dict`), the workload if given, and the caller's meta. Each state
has the model `State`'s fields plus `action` (a label for the step into it) and `record` (the `StepRecord`
of that step: the variant `Init` for the initial state, `Step` after). `loop`, when given, is the index of
the state the last one repeats (a lasso).

Encoding choices, all forced by ITF having only integers, strings, booleans, records, variants, tuples,
sequences, sets and maps:
- None -> the variant {"tag": "Nothing", "value": "U_OF_UNIT"} (ITF has no null; "U_OF_UNIT" is Apalache's
  unit value). Not the tag "None": itf-py turns a variant into a namedtuple named after its tag, and None is
  a keyword.
- a Python tuple -> {"#tup": [...]}, except the tuples of records (`requests`, `prefix_cache`), which are
  ITF sequences (JSON lists) of records;
- a dataclass-typed field (sglang's radix `Tree` in its Sched) -> an ITF record;
- an int -> a JSON number, or {"#bigint": "..."} from 2**53 on (where JSON readers stop being exact);
- `Phase` -> its name ("DECODING"), so a trace reads without the enum at hand;
- the policy's `Sched` -> a variant tagged with its class name; a policy without one (None) -> Nothing;
- a float -> refused: ITF has none, and the model keeps none in a state (floats are configuration knobs,
  and those live in `#meta` as plain JSON).

Both directions are driven by the dataclasses' type hints, so what is written is exactly what reading
accepts, and reading gives back an identical trace (states and records `==`, the same `EngineConfig`).
Reading validates everything: bad input is an `ItfError` naming the file, the field and the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Optional

from model.config import ConfigError, EngineConfig
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload
from model.state import Phase, State, StepRecord
from targets.checking import config_from_dict, config_to_dict

from .tracetable import describe

FORMAT_DESCRIPTION = "https://apalache-mc.org/docs/adr/015adr-trace.html"
UNIT = "U_OF_UNIT"
NOTHING = {"tag": "Nothing", "value": UNIT}
INIT = {"tag": "Init", "value": UNIT}
BIGINT_FROM = 2 ** 53
# The State fields, plus the label of the step into the state and its record.
VARS = ("step", "action", *(f.name for f in dataclasses.fields(State) if f.name != "step"), "record")
# #meta keys this module owns; everything else in #meta is the caller's.
OWN_META = ("format", "format-description", "config", "workload")


class ItfError(ValueError):
    """A trace that cannot be read (or written): which file, which field, why, on one line."""

    def __init__(self, source: str, field: str, reason: str):
        reason = " ".join(str(reason).split())   # one line, whatever the input held
        super().__init__(f"{source}: {field}: {reason}")
        self.source, self.field, self.reason = source, field, reason


class _Invalid(Exception):
    """Raised deep in the codec; the entry points add the source and turn it into an ItfError."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason


@dataclasses.dataclass
class ItfTrace:
    cfg: EngineConfig
    states: list[State]
    records: list[StepRecord]
    workload: Optional[Workload] = None
    actions: list[str] = dataclasses.field(default_factory=list)   # the label of each step (not "init")
    meta: dict = dataclasses.field(default_factory=dict)   # #meta less OWN_META (source, description included)
    loop: Optional[int] = None


# -- writing ------------------------------------------------------------------------------------

def trace_to_itf(cfg: EngineConfig, states: list[State], records: list[StepRecord], *,
                 workload: Optional[Workload] = None, actions: Optional[list[str]] = None,
                 meta: Optional[dict] = None, loop: Optional[int] = None) -> dict:
    """The ITF document (a JSON-ready dict) of a run: states[0] is the initial state and records[i] took
    states[i] to states[i+1]. Raises ItfError for a trace ITF cannot hold (a float, a wrong shape)."""
    try:
        return _document(cfg, states, records, workload, actions, meta or {}, loop)
    except _Invalid as exc:
        raise ItfError("<trace>", exc.field, exc.reason) from None


def write_itf(path, cfg: EngineConfig, states: list[State], records: list[StepRecord], *,
              workload: Optional[Workload] = None, actions: Optional[list[str]] = None,
              meta: Optional[dict] = None, loop: Optional[int] = None) -> None:
    """Write `trace_to_itf(...)` to `path`: the same trace always gives the same bytes, with one state
    per line so that two traces diff line by line."""
    doc = trace_to_itf(cfg, states, records, workload=workload, actions=actions, meta=meta, loop=loop)
    Path(path).write_text(_dumps(doc), encoding="utf-8")


def _document(cfg, states, records, workload, actions, meta, loop) -> dict:
    if not states or len(states) != len(records) + 1:
        raise _Invalid("states", f"need one state more than records (got {len(states)} states, "
                                 f"{len(records)} records)")
    if actions is None:
        actions = [f"step {rec.step}: {describe(states[k], states[k + 1], rec)}" for k, rec in enumerate(records)]
    elif len(actions) != len(records) or not all(isinstance(a, str) for a in actions):
        raise _Invalid("actions", f"need one string per record ({len(records)}), got {len(actions)} items")
    if clash := [k for k in meta if k in OWN_META]:
        raise _Invalid(f"meta.{clash[0]}", "is written by this module; choose another key")
    if loop is not None and not (type(loop) is int and 0 <= loop < len(states)):
        raise _Invalid("loop", f"must be the index of a state, 0..{len(states) - 1} (got {loop!r})")
    head = {"format": "ITF", "format-description": FORMAT_DESCRIPTION, "source": "schedproof",
            "description": f"a run of the {cfg.policy} scheduler model"}
    head.update(meta)
    head["config"] = config_to_dict(cfg)
    if workload is not None:
        head["workload"] = [dataclasses.asdict(s) for s in workload.requests]
    try:   # #meta is plain JSON: refuse what json cannot write exactly (NaN, objects) now, not mid-file
        json.dumps(head, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _Invalid("#meta", f"not plain JSON: {exc}") from None
    doc = {"#meta": head, "vars": list(VARS), "states": []}
    for i, state in enumerate(states):
        out = {"#meta": {"index": i}, "step": _encode(state.step, int, f"states[{i}].step"),
               "action": "init" if i == 0 else actions[i - 1]}
        for f in dataclasses.fields(State):
            if f.name != "step":   # written first, as in VARS
                out[f.name] = _encode_sched(state.sched, f"states[{i}].sched") if f.name == "sched" else \
                    _encode(getattr(state, f.name), _hints(State)[f.name], f"states[{i}].{f.name}")
        out["record"] = INIT if i == 0 else \
            {"tag": "Step", "value": _encode_record(records[i - 1], StepRecord, f"states[{i}].record")}
        doc["states"].append(out)
    if loop is not None:
        doc["loop"] = loop
    return doc


def _encode(value: Any, hint: Any, field: str) -> Any:
    """`value`, of type `hint`, as ITF JSON."""
    if type(value) is hint and (hint is bool or hint is str or hint is int and abs(value) < BIGINT_FROM):
        return value   # the common case first (most values are): it skips the type inspection below
    if _untyped(hint):
        return _encode_any(value, field)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return NOTHING
        (inner,) = [a for a in args if a is not type(None)]   # only Optional[X] occurs in the model
        return _encode(value, inner, field)
    if hint is Phase and isinstance(value, Phase):
        return value.name
    if hint is bool and isinstance(value, bool) or hint is str and isinstance(value, str):
        return value
    if hint is int and type(value) is int:
        return _encode_int(value)
    if origin is tuple and isinstance(value, tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            if dataclasses.is_dataclass(args[0]):   # a collection of records: an ITF sequence
                return [_encode_record(v, args[0], f"{field}[{k}]") for k, v in enumerate(value)]
            return {"#tup": [_encode(v, args[0], f"{field}[{k}]") for k, v in enumerate(value)]}
        if len(args) == len(value):
            return {"#tup": [_encode(v, a, f"{field}[{k}]") for k, (v, a) in enumerate(zip(value, args))]}
    if dataclasses.is_dataclass(hint) and type(value) is hint:   # a record inside a record (sglang's radix tree)
        return _encode_record(value, hint, field)
    if isinstance(value, float):
        raise _Invalid(field, f"is the float {value!r}: ITF has no floats, and states must not hold any")
    raise _Invalid(field, f"is {value!r}, not a {_name(hint)}")


def _encode_any(value: Any, field: str) -> Any:
    """A value without a precise type hint (the untyped tuples of a Sched): None, bool, int, str, tuple."""
    if value is None:
        return NOTHING
    if type(value) in (bool, str):   # not a subclass (an enum): it would read back as a plain value
        return value
    if type(value) is int:
        return _encode_int(value)
    if type(value) is tuple:
        return {"#tup": [_encode_any(v, f"{field}[{k}]") for k, v in enumerate(value)]}
    if isinstance(value, float):
        raise _Invalid(field, f"is the float {value!r}: ITF has no floats, and states must not hold any")
    raise _Invalid(field, f"is a {type(value).__name__} ({value!r}): only None, booleans, integers, strings "
                          f"and tuples of them can be written without a type hint")


def _encode_int(n: int) -> Any:
    return {"#bigint": str(n)} if abs(n) >= BIGINT_FROM else n


def _encode_record(obj: Any, cls: type, field: str) -> dict:
    if type(obj) is not cls:
        raise _Invalid(field, f"is {obj!r}, not a {cls.__name__}")
    hints = _hints(cls)
    return {name: _encode(getattr(obj, name), hints[name], f"{field}.{name}") for name in _names(cls)}


def _encode_sched(sched: Any, field: str) -> dict:
    if sched is None:
        return NOTHING
    if not dataclasses.is_dataclass(sched):
        raise _Invalid(field, f"is {sched!r}, not a policy's Sched dataclass")
    return {"tag": type(sched).__name__, "value": _encode_record(sched, type(sched), field)}


def _dumps(doc: dict) -> str:
    """JSON with #meta indented (it is read by people) and one state per line."""
    def compact(value):
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    parts = []
    for key, value in doc.items():
        if key == "states":
            parts.append(' "states": [\n  ' + ",\n  ".join(compact(s) for s in value) + "\n ]")
        elif key == "#meta":
            parts.append(' "#meta": ' + json.dumps(value, ensure_ascii=False, indent=1).replace("\n", "\n "))
        else:
            parts.append(f" {compact(key)}: {compact(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


# -- reading ------------------------------------------------------------------------------------

def read_itf(path) -> ItfTrace:
    """The trace in an ITF file; ItfError for a file that cannot be read or is not such a trace."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ItfError(source, "-", "not UTF-8 text") from None
    except OSError as exc:
        raise ItfError(source, "-", f"cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ItfError(source, "-", f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:   # NaN / Infinity, an integer too long to convert, deep nesting
        raise ItfError(source, "-", f"not JSON this reader accepts: {exc or type(exc).__name__}") from None
    return itf_to_trace(data, source)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (and ITF has no floats)")


def itf_to_trace(data: dict, source: str = "trace.itf.json") -> ItfTrace:
    """The trace in a parsed ITF document; ItfError(source, field, reason) for anything wrong in it."""
    try:
        return _trace(data)
    except _Invalid as exc:
        raise ItfError(source, exc.field, exc.reason) from None
    except RecursionError:
        raise ItfError(source, "-", "values nested too deeply") from None


def _trace(data: Any) -> ItfTrace:
    if not isinstance(data, dict):
        raise _Invalid("-", f"not an ITF trace: the document is {_show(data)}, not a JSON object")
    head = data.get("#meta", {})
    if not isinstance(head, dict):
        raise _Invalid("#meta", f"must be an object, got {_show(head)}")
    if head.get("format", "ITF") != "ITF":
        raise _Invalid("#meta.format", f"is {_show(head['format'])}, not \"ITF\"")
    if "config" not in head:
        raise _Invalid("#meta.config", "missing: this reader needs the engine configuration schedproof writes there")
    cfg = _config(head["config"])
    workload = _workload(head["workload"]) if "workload" in head else None
    for key in ("vars", "states"):
        if key not in data:
            raise _Invalid(key, "missing: every ITF trace has it")
        if not isinstance(data[key], list):
            raise _Invalid(key, f"must be a list, got {_show(data[key])}")
    if missing := [v for v in VARS if v not in data["vars"]]:
        raise _Invalid("vars", f"lacks {', '.join(missing)}")
    raw_states = data["states"]
    if not raw_states:
        raise _Invalid("states", "is empty: a trace has at least its initial state")
    loop = data.get("loop")   # itf-py writes "loop": null for no loop
    if loop is not None and not (type(loop) is int and 0 <= loop < len(raw_states)):
        raise _Invalid("loop", f"must be the index of a state, 0..{len(raw_states) - 1} (got {_show(loop)})")
    sched_cls = type(POLICIES[cfg.policy].initial_sched(cfg))
    states, records, actions = [], [], []
    for i, raw in enumerate(raw_states):
        state, record, action = _state(raw, i, sched_cls)
        states.append(state)
        if i:
            records.append(record)
            actions.append(action)
    meta = {k: v for k, v in head.items() if k not in OWN_META}
    return ItfTrace(cfg, states, records, workload, actions, meta, loop)


def _state(raw: Any, i: int, sched_cls: type) -> tuple[State, Optional[StepRecord], str]:
    at = f"states[{i}]"
    if not isinstance(raw, dict):
        raise _Invalid(at, f"must be an object, got {_show(raw)}")
    for var in VARS:
        if var not in raw:
            raise _Invalid(f"{at}.{var}", "missing")
    action = raw["action"]
    if not isinstance(action, str):
        raise _Invalid(f"{at}.action", f"must be a string, got {_show(action)}")
    values = {}
    for f in dataclasses.fields(State):
        where = f"{at}.{f.name}"
        values[f.name] = _decode_sched(raw[f.name], sched_cls, where) if f.name == "sched" else \
            _decode(raw[f.name], _hints(State)[f.name], where)
    tag, value = _variant(raw["record"], f"{at}.record")
    record = None
    if i == 0 and tag != "Init":
        raise _Invalid(f"{at}.record", f"the initial state's record must be the variant Init, not {tag!r}")
    if i > 0:
        if tag != "Step":
            raise _Invalid(f"{at}.record", f"must be the variant Step (the step into this state), not {tag!r}")
        record = _decode_record(value, StepRecord, f"{at}.record")
    return State(**values), record, action


def _decode(j: Any, hint: Any, field: str) -> Any:
    """The value of type `hint` that `_encode` wrote as `j`."""
    if type(j) is hint and (hint is int or hint is bool or hint is str):
        return j   # the common case first, as in _encode
    if _untyped(hint):
        return _decode_any(j, field)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and _is_nothing(j):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(j, inner, field)
    if hint is Phase:
        if isinstance(j, str) and j in Phase.__members__:
            return Phase[j]
        raise _Invalid(field, f"{_show(j)} is not a phase (one of {', '.join(Phase.__members__)})")
    if hint is bool or hint is str:
        if isinstance(j, hint):
            return j
        raise _Invalid(field, f"must be a {_name(hint)}, got {_show(j)}")
    if hint is int:
        return _decode_int(j, field)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
            if not isinstance(j, list):
                raise _Invalid(field, f"must be a list of records, got {_show(j)}")
            return tuple(_decode_record(v, args[0], f"{field}[{k}]") for k, v in enumerate(j))
        items = _tup(j, field)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0], f"{field}[{k}]") for k, v in enumerate(items))
        if len(items) != len(args):
            raise _Invalid(field, f"must be a tuple of {len(args)}, got one of {len(items)}")
        return tuple(_decode(v, a, f"{field}[{k}]") for k, (v, a) in enumerate(zip(items, args)))
    if dataclasses.is_dataclass(hint):
        return _decode_record(j, hint, field)
    raise _Invalid(field, f"has the type {_name(hint)}, which this reader does not know")   # a model change


def _decode_any(j: Any, field: str) -> Any:
    if _is_nothing(j):
        return None
    if isinstance(j, (bool, str)):
        return j
    if isinstance(j, dict) and "#tup" in j:
        return tuple(_decode_any(v, f"{field}[{k}]") for k, v in enumerate(_tup(j, field)))
    if type(j) is int or isinstance(j, dict) and "#bigint" in j:
        return _decode_int(j, field)
    if isinstance(j, float):
        raise _Invalid(field, f"is the float {j!r}: ITF has no floats")
    raise _Invalid(field, f"must be an integer, boolean, string, tuple or Nothing, got {_show(j)}")


def _decode_int(j: Any, field: str) -> int:
    if type(j) is int:
        return j
    if isinstance(j, dict) and set(j) == {"#bigint"} and isinstance(j["#bigint"], str) \
            and re.fullmatch(r"-?[0-9]{1,4000}", j["#bigint"]):
        return int(j["#bigint"])
    if isinstance(j, float):
        raise _Invalid(field, f"is the float {j!r}: ITF has no floats, an integer is needed")
    raise _Invalid(field, f"must be an integer, got {_show(j)}")


def _decode_record(j: Any, cls: type, field: str) -> Any:
    if not isinstance(j, dict) or any(k.startswith("#") for k in j) or _is_variant(j):
        raise _Invalid(field, f"must be a record ({cls.__name__}), got {_show(j)}")
    names = _names(cls)
    if extra := [k for k in j if k not in names]:
        raise _Invalid(f"{field}.{extra[0]}", f"is not a field of {cls.__name__}")
    for name in names:
        if name not in j:
            raise _Invalid(f"{field}.{name}", "missing")
    hints = _hints(cls)
    return cls(**{name: _decode(j[name], hints[name], f"{field}.{name}") for name in names})


def _decode_sched(j: Any, sched_cls: type, field: str) -> Any:
    if _is_nothing(j):
        return None
    tag, value = _variant(j, field)
    if sched_cls is type(None):
        raise _Invalid(field, f"must be Nothing: this policy keeps no Sched (got the variant {tag!r})")
    if tag != sched_cls.__name__:
        raise _Invalid(field, f"must be the variant {sched_cls.__name__!r} (or Nothing), not {tag!r}")
    return _decode_record(value, sched_cls, field)


def _config(j: Any) -> EngineConfig:
    at = "#meta.config"
    if not isinstance(j, dict):
        raise _Invalid(at, f"must be an object, got {_show(j)}")
    hints = _hints(EngineConfig)
    if extra := [k for k in j if k not in hints]:
        raise _Invalid(f"{at}.{extra[0]}", "is not an engine setting")
    for name, hint in hints.items():
        if name not in j:
            raise _Invalid(f"{at}.{name}", "missing")
        value = j[name]
        wrong = (not isinstance(value, dict) if name == "options" else
                 not isinstance(value, hint) or (hint is int and isinstance(value, bool)))
        if wrong:
            raise _Invalid(f"{at}.{name}", f"must be a {'JSON object' if name == 'options' else _name(hint)}, "
                                           f"got {_show(value)}")
    if j["policy"] not in POLICIES:
        raise _Invalid(f"{at}.policy", f"unknown policy {j['policy']!r} (known: {', '.join(sorted(POLICIES))})")
    try:
        return config_from_dict(j)
    except ConfigError as exc:
        field = exc.field.removeprefix("engine.")
        raise _Invalid(f"{at}.{field}", exc.reason) from None
    except (TypeError, ValueError) as exc:   # an options class that checks itself another way
        raise _Invalid(at, str(exc)) from None


def _workload(j: Any) -> Workload:
    at = "#meta.workload"
    if not isinstance(j, list):
        raise _Invalid(at, f"must be a list of requests, got {_show(j)}")
    hints = _hints(RequestSpec)
    specs = []
    for k, raw in enumerate(j):
        if not isinstance(raw, dict):
            raise _Invalid(f"{at}[{k}]", f"must be an object, got {_show(raw)}")
        if extra := [key for key in raw if key not in hints]:
            raise _Invalid(f"{at}[{k}].{extra[0]}", "is not a field of a request")
        for name, hint in hints.items():   # plain JSON here (#meta): ints, and null where None is allowed
            if name not in raw:
                raise _Invalid(f"{at}[{k}].{name}", "missing")
            value = raw[name]
            if not (type(value) is int or value is None and hint != int):
                raise _Invalid(f"{at}[{k}].{name}", f"must be an integer{'' if hint == int else ' or null'}, "
                                                    f"got {_show(value)}")
        specs.append(RequestSpec(**raw))
    return Workload(tuple(specs))


# -- helpers ------------------------------------------------------------------------------------

@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _untyped(hint: Any) -> bool:
    """A hint that says nothing about the elements (a Sched's bare `tuple`, `object`, `Any`)."""
    return hint in (Any, object, tuple)


def _name(hint: Any) -> str:
    return {int: "integer", bool: "boolean", str: "string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _is_variant(j: Any) -> bool:
    return isinstance(j, dict) and set(j) == {"tag", "value"} and isinstance(j["tag"], str)


def _is_nothing(j: Any) -> bool:
    # The unit payload is not checked: tools write it as "U_OF_UNIT", {"#tup": []} or {}.
    return _is_variant(j) and j["tag"] == "Nothing"


def _variant(j: Any, field: str) -> tuple[str, Any]:
    if not _is_variant(j):
        raise _Invalid(field, f"must be a variant {{\"tag\": ..., \"value\": ...}}, got {_show(j)}")
    return j["tag"], j["value"]


def _tup(j: Any, field: str) -> list:
    if not (isinstance(j, dict) and set(j) == {"#tup"} and isinstance(j["#tup"], list)):
        raise _Invalid(field, f"must be a tuple {{\"#tup\": [...]}}, got {_show(j)}")
    return j["#tup"]


def _show(j: Any, limit: int = 60) -> str:
    """A JSON value, shortened, for a one-line reason."""
    try:
        text = json.dumps(j, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(j)
    return text if len(text) <= limit else text[:limit - 3] + "..."
