"""Scenario files: one design (engine, policy, knobs) and one concrete workload, in TOML.

Every problem with a file is a `ScenarioError` naming the file, the field and the reason;
the command line prints it as one line and exits 2.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, Optional

from model import limits, releases
from model.config import ConfigError, EngineConfig, build_options
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload
import model.policies  # noqa: F401  (registers every policy)
from properties import VERDICTS


class ScenarioError(Exception):
    def __init__(self, path: str, field: str, reason: str):
        super().__init__(f"{path}: {field}: {reason}")
        self.path, self.field, self.reason = path, field, reason


# Where an expectation comes from, so a reader can tell an engine fact from a model prediction.
SOURCES = {
    "engine": "observed on the real engine (the scenario names the run or the test that pins it)",
    "field-report": "reported from the field (the scenario names the public report and its row)",
    "upstream-test": "asserted by the engine's own test suite (the scenario names the test)",
    "model": "predicted by this model alone, not yet confirmed on the engine",
}


@dataclasses.dataclass(frozen=True)
class Expectation:
    verdict: Optional[str] = None
    completed: Optional[int] = None
    failed: Optional[int] = None
    source: Optional[str] = None      # a key of SOURCES


@dataclasses.dataclass(frozen=True)
class Scenario:
    path: str
    name: str
    description: str
    cfg: EngineConfig
    workload: Workload
    max_overtakes: int
    expect: Expectation


ENGINE_KEYS = {"policy", "block_size", "num_blocks", "host_blocks", "max_num_tokens", "max_batch_size",
               "chunked_prefill", "chunk_unit", "options", "version"}
REQUEST_KEYS = {"count", "prompt", "max_new", "arrival", "output_len", "cancel_at", "prefix_group",
                "prefix_len", "priority"}
TOP_KEYS = {"name", "description", "engine", "requests", "properties", "expect", "check"}   # [check]: `schedproof check` only


def read_toml(path: str) -> dict:
    """The file as a TOML table, or a ScenarioError saying why not."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ScenarioError(path, "-", "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(path, "-", f"malformed TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ScenarioError(path, "-", "malformed TOML: not UTF-8 text") from None
    except OSError as exc:
        raise ScenarioError(path, "-", f"cannot read: {exc.strerror}") from None


def load(path: str | Path) -> Scenario:
    path = str(path)
    raw = read_toml(path)
    try:
        return _parse(path, raw)
    except ConfigError as exc:
        raise ScenarioError(path, exc.field, exc.reason) from None


def from_table(path: str, raw: dict) -> Scenario:
    """A scenario from its TOML table (a file's, changed by `sweep`); bad input as for a file."""
    try:
        return _parse(path, raw)
    except ConfigError as exc:
        raise ScenarioError(path, exc.field, exc.reason) from None


def _parse(path: str, raw: dict) -> Scenario:
    _no_unknown(raw, TOP_KEYS, "")
    name = _get(raw, "name", str, "")
    engine = _table(raw, "engine", "")
    _no_unknown(engine, ENGINE_KEYS, "engine.")
    policy_name = _get(engine, "policy", str, "engine.")
    if policy_name not in POLICIES:
        raise ConfigError("engine.policy", f"unknown policy {policy_name!r} (known: {', '.join(sorted(POLICIES))})")
    policy = POLICIES[policy_name]
    opts_raw = engine.get("options", {})
    if not isinstance(opts_raw, dict):
        raise ConfigError("engine.options", "must be a table")
    options = build_options(policy.Options, opts_raw)
    block_size = _get(engine, "block_size", int, "engine.")
    num_blocks = _pool(engine, policy, block_size, options)
    cfg = EngineConfig(
        policy=policy_name,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_tokens=_get(engine, "max_num_tokens", int, "engine."),
        max_batch_size=_get(engine, "max_batch_size", int, "engine."),
        host_blocks=_get(engine, "host_blocks", int, "engine.", default=0),
        chunked_prefill=_get(engine, "chunked_prefill", bool, "engine.", default=False),
        chunk_unit=_get(engine, "chunk_unit", int, "engine.", default=0),
        options=options,
        version=_get(engine, "version", str, "engine.", default=""),
    )
    releases.release(cfg)   # a version its policy does not mirror: one line naming the ones it does
    policy.check_config(cfg)
    workload = _workload(raw)
    props = raw.get("properties", {})
    if not isinstance(props, dict):
        raise ConfigError("properties", "must be a table")
    _no_unknown(props, {"max_overtakes"}, "properties.")
    max_overtakes = _get(props, "max_overtakes", int, "properties.", default=cfg.max_batch_size)
    if max_overtakes < 0:
        raise ConfigError("properties.max_overtakes", f"must be >= 0 (got {max_overtakes})")
    return Scenario(path, name, _get(raw, "description", str, "", default=""), cfg, workload,
                    max_overtakes, _expect(raw))


def _pool(engine: dict, policy, block_size: int, options) -> int:
    """The GPU pool is `num_blocks`, or the engine's own knob converted as the engine does; exactly one."""
    given_option = policy.pool_option is not None and getattr(options, policy.pool_option) is not None
    if "num_blocks" in engine and given_option:
        raise ConfigError("engine.num_blocks",
                          f"give the pool once: either num_blocks or engine.options.{policy.pool_option}")
    if given_option:
        pages = policy.gpu_blocks_from_option(block_size, options, engine)
        if pages > limits.MAX_VALUE:
            raise ConfigError(f"engine.options.{policy.pool_option}",
                              f"converts to {pages} pages; at most {limits.MAX_VALUE} ({limits.VALUE.why})")
        return pages
    if "num_blocks" not in engine:
        alt = f" or engine.options.{policy.pool_option}" if policy.pool_option else ""
        raise ConfigError("engine.num_blocks", f"missing: the GPU pool must be given as num_blocks{alt}")
    return _get(engine, "num_blocks", int, "engine.")


def _workload(raw: dict) -> Workload:
    groups = raw.get("requests")
    if groups is None:
        raise ConfigError("requests", "missing: give at least one [[requests]] group")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        raise ConfigError("requests", "must be one or more [[requests]] tables")
    specs = []
    for k, g in enumerate(groups):
        where = f"requests[{k}]."
        _no_unknown(g, REQUEST_KEYS, where)
        count = _get(g, "count", int, where, default=1)
        if count <= 0:
            raise ConfigError(where + "count", f"must be a positive integer (got {count})")
        if len(specs) + count > limits.REQUESTS.high:
            raise ConfigError(where + "count", f"the groups up to this one hold {len(specs) + count} requests; "
                                               f"a run takes at most {limits.REQUESTS.high:g} ({limits.REQUESTS.why})")
        prompt = _get(g, "prompt", int, where)
        max_new = _get(g, "max_new", int, where)
        if prompt <= 0:
            raise ConfigError(where + "prompt", f"must be a positive integer (got {prompt})")
        if max_new <= 0:
            raise ConfigError(where + "max_new", f"must be a positive integer (got {max_new})")
        arrival = _get(g, "arrival", int, where, default=0)
        if arrival < 0:
            raise ConfigError(where + "arrival", f"must be >= 0 (got {arrival})")
        output_len = _get(g, "output_len", int, where, default=None)
        if output_len is not None and not 1 <= output_len <= max_new:
            raise ConfigError(where + "output_len", f"must be between 1 and max_new={max_new} (got {output_len})")
        cancel_at = _get(g, "cancel_at", int, where, default=None)
        if cancel_at is not None and cancel_at < arrival:
            raise ConfigError(where + "cancel_at", f"must be >= arrival={arrival} (got {cancel_at})")
        prefix_group = _get(g, "prefix_group", int, where, default=-1)
        prefix_len = _get(g, "prefix_len", int, where, default=0)
        if (prefix_group >= 0) != (prefix_len > 0) or prefix_len > prompt:
            raise ConfigError(where + "prefix_len",
                              "a shared prefix needs both prefix_group >= 0 and 0 < prefix_len <= prompt")
        priority = _get(g, "priority", int, where, default=0)
        specs += [RequestSpec(prompt, max_new, arrival, output_len, cancel_at, prefix_group, prefix_len, priority)] * count
    return Workload(tuple(specs))


def _expect(raw: dict) -> Expectation:
    e = raw.get("expect", {})
    if not isinstance(e, dict):
        raise ConfigError("expect", "must be a table")
    _no_unknown(e, {"verdict", "completed", "failed", "source"}, "expect.")
    verdict = _get(e, "verdict", str, "expect.", default=None)
    if verdict is not None and verdict not in VERDICTS:
        raise ConfigError("expect.verdict", f"must be one of {', '.join(VERDICTS)} (got {verdict!r})")
    source = _get(e, "source", str, "expect.", default=None)
    if source is not None and source not in SOURCES:
        raise ConfigError("expect.source", f"must be one of {', '.join(SOURCES)} (got {source!r})")
    return Expectation(verdict, _get(e, "completed", int, "expect.", default=None),
                       _get(e, "failed", int, "expect.", default=None), source)


_MISSING = object()


def _get(table: dict, key: str, typ: type, where: str, default: Any = _MISSING) -> Any:
    if key not in table:
        if default is _MISSING:
            raise ConfigError(where + key, "missing")
        return default
    value = table[key]
    if isinstance(value, list) and typ is int:
        raise ConfigError(where + key, "a range [low, high] needs `schedproof check`; `run` takes one value")
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(where + key, f"must be an integer (got {value!r})")
    if typ is int and (refused := limits.VALUE.refusal(value)):
        raise ConfigError(where + key, refused)
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(where + key, f"must be true or false (got {value!r})")
    if typ is str and not isinstance(value, str):
        raise ConfigError(where + key, f"must be a string (got {value!r})")
    return value


def _table(raw: dict, key: str, where: str) -> dict:
    if key not in raw:
        raise ConfigError(where + key, "missing")
    if not isinstance(raw[key], dict):
        raise ConfigError(where + key, "must be a table")
    return raw[key]


def _no_unknown(table: dict, known: set, where: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(where + key, f"unknown field (known: {', '.join(sorted(known))})")
