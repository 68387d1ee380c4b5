"""Engine configuration: the knobs every policy shares, plus one options dataclass per policy.

A configuration checks itself on construction (nano-vllm's `Config`), and raises
`ConfigError(field, reason)` so the scenario loader can name the file and field.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Mapping

from . import limits


class ConfigError(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    policy: str
    block_size: int          # tokens per KV block
    num_blocks: int          # GPU blocks, as the engine ends up with them (engine knobs converted)
    max_num_tokens: int      # per-step token budget
    max_batch_size: int      # requests per step
    host_blocks: int = 0     # lower-tier blocks; 0 = no tier below the GPU
    chunked_prefill: bool = False
    chunk_unit: int = 0      # chunk granularity; 0 = the policy's default
    options: Any = None      # the policy's Options instance
    # the engine release (`[engine] version`, one of model/releases.py's for the policy); empty: the newest
    version: str = ""

    def __post_init__(self):
        for name in ("block_size", "num_blocks", "max_num_tokens", "max_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"engine.{name}", f"must be a positive integer (got {value!r})")
            if refused := limits.VALUE.refusal(value):
                raise ConfigError(f"engine.{name}", refused)
        if not isinstance(self.host_blocks, int) or self.host_blocks < 0:
            raise ConfigError("engine.host_blocks", f"must be an integer >= 0 (got {self.host_blocks!r})")
        if not isinstance(self.version, str):
            raise ConfigError("engine.version", f"must be a string such as \"0.33\" (got {self.version!r})")
        if self.chunk_unit < 0:
            raise ConfigError("engine.chunk_unit", f"must be >= 0 (got {self.chunk_unit!r})")

    def blocks_for(self, tokens: int) -> int:
        return cdiv(max(tokens, 0), self.block_size)


def build_options(options_cls: type, raw: Mapping[str, Any], prefix: str = "engine.options") -> Any:
    """Turn a TOML table into a policy's frozen Options dataclass, refusing unknown keys and
    values of the wrong type. Field metadata `positive=True` / `choices=(...)` adds checks."""
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    hints = typing.get_type_hints(options_cls)
    values = {}
    for key, value in raw.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"{prefix}.{key}", f"unknown option for this policy (known: {known})")
        values[key] = _check_option(f"{prefix}.{key}", value, hints[key], fields[key].metadata)
    return options_cls(**values)


def _check_option(field: str, value: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    allowed = typing.get_args(hint) or (hint,)
    if bool in allowed:
        if not isinstance(value, bool):
            raise ConfigError(field, f"must be true or false (got {value!r})")
        return value
    if value is None:
        raise ConfigError(field, "must be given a value")
    if isinstance(value, bool):
        raise ConfigError(field, f"must be a number, not a boolean (got {value!r})")
    if int in allowed and isinstance(value, int):
        pass
    elif float in allowed and isinstance(value, (int, float)):
        value = float(value)
    elif str in allowed and isinstance(value, str):
        pass
    else:
        names = " or ".join(getattr(a, "__name__", str(a)) for a in allowed if a is not type(None))
        raise ConfigError(field, f"must be a {names} (got {value!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(field, f"must be a finite number (got {value!r})")
    if isinstance(value, int) and (refused := meta.get("limit", limits.VALUE).refusal(value)):
        raise ConfigError(field, refused)
    if meta.get("positive") and value <= 0:
        raise ConfigError(field, f"must be > 0 (got {value!r})")
    if meta.get("non_negative") and value < 0:
        raise ConfigError(field, f"must be >= 0 (got {value!r})")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(field, f"must be <= {meta['max']} (got {value!r})")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(field, f"must be one of {', '.join(map(str, meta['choices']))} (got {value!r})")
    return value


def positive(default):
    return dataclasses.field(default=default, metadata={"positive": True})


def non_negative(default):
    return dataclasses.field(default=default, metadata={"non_negative": True})


def choice(default, *choices):
    return dataclasses.field(default=default, metadata={"choices": choices})
