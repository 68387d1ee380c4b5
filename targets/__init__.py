"""Adapters that drive real engines, and the model itself as the `reference` target.

`get_target(name)` imports an engine's adapter only when asked, so the harness runs without any
engine installed; an adapter whose engine is missing or not the pinned version raises
`TargetUnavailable` with a one-line reason.
"""

from __future__ import annotations

import importlib

from .protocol import (Action, Add, AdapterMismatch, Cancel, Observation, Step, Stop, Target, TargetHung,
                       TargetUnavailable, UnknownTarget, exit_status)

TARGETS = {
    "reference": ("targets.reference", "ReferenceTarget"),
    "transformers": ("targets.transformers_cb", "TransformersTarget"),
    "vllm": ("targets.vllm_v1", "VllmTarget"),
    "sglang": ("targets.sglang", "SglangTarget"),
}


def get_target(name: str) -> type:
    if name not in TARGETS:
        raise UnknownTarget(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    module, cls = TARGETS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise TargetUnavailable(f"target {name!r} needs an engine that is not installed: {exc}") from None


__all__ = ["Action", "Add", "AdapterMismatch", "Cancel", "Observation", "Step", "Stop", "Target", "TargetHung",
           "TargetUnavailable", "UnknownTarget", "exit_status",
           "TARGETS", "get_target"]
