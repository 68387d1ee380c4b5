"""Engine releases as a dimension of the model: which releases each policy mirrors, and every scheduling
difference between them, keyed by the release that introduced it.

A design names its release in `[engine] version` (EngineConfig.version); empty means the newest release its policy
mirrors. A policy (and its symbolic core) asks `changed(cfg, NAME)` where a rule differs between releases, so each
difference is written once, here, with the engine file and function that made it; the policy keeps one copy of
every other rule. Releases are compared as tuples of integers ("0.33" > "0.32"), so a rule introduced in one release
holds in every later one until a later entry here says otherwise.
"""

from __future__ import annotations

import dataclasses

from .config import ConfigError, EngineConfig


@dataclasses.dataclass(frozen=True)
class Change:
    """A scheduling rule that differs from `since` on: `where` is the code in that release, `what` the difference."""

    policy: str
    name: str
    since: str
    where: str
    what: str


# The releases each policy mirrors, oldest first (the newest is a design's default). A release listed here with no
# Change since the one before behaves as that one: its evidence (a lockstep run on the engine, or the source diff) is
# in docs/conformance.md ("vLLM releases", "transformers releases").
RELEASES: dict[str, tuple[str, ...]] = {
    "vllm_v1": ("0.32", "0.33", "0.34"),
    "hf_cb": ("5.19", "5.20", "5.21", "5.22", "5.23", "5.24", "5.25"),
    "sglang": ("0.5.23",),
    "trtllm_v1": ("1.4.0rc",),
    "trtllm_v2": ("1.4.0rc",),
}

CHANGES: tuple[Change, ...] = (
    Change("vllm_v1", "priority_self_preemption_goes_on", "0.33",
           "vllm 0.33.0 v1/core/sched/scheduler.py:981-990 `Scheduler.schedule` (the running loop's `new_blocks is "
           "None` branch)",
           "under the PRIORITY policy a running request that preempted itself (it was the lowest-priority running "
           "request) no longer ends the running loop: the loop goes on to the requests after it, which have higher "
           "priority and may fit in the blocks it freed (0.32: `break`, S:846-848; FCFS still ends the loop)"),
    Change("vllm_v1", "long_prefill_cap_needs_chunking", "0.34",
           "vllm 0.34.0 v1/core/sched/scheduler.py:775-779 `Scheduler.schedule` (the `long_prefill_token_threshold` "
           "it uses)",
           "`long_prefill_token_threshold` caps a request's tokens only with chunked prefill on (and more than one "
           "request eligible); 0.32 and 0.33 cap with chunked prefill off too (S:643-649), which admits a prompt "
           "longer than the cap a piece at a time although chunking is off"),
)


def named(cfg: EngineConfig) -> str:
    """The release a design runs on, for a report: "vllm_v1 0.33"."""
    return f"{cfg.policy} {release(cfg)}"


def releases(policy: str) -> tuple[str, ...]:
    return RELEASES[policy]


def release(cfg: EngineConfig) -> str:
    """The release a design runs on: its `version`, or the newest its policy mirrors."""
    known = RELEASES[cfg.policy]
    if not cfg.version:
        return known[-1]
    if cfg.version not in known:
        raise ConfigError("engine.version", f"{cfg.policy} mirrors the releases {', '.join(known)} "
                                            f"(got {cfg.version!r})")
    return cfg.version


def key(version: str) -> tuple:
    """"0.33" -> (0, 33); "1.4.0rc" -> (1, 4, 0, 'rc'): numbers compare as numbers."""
    parts = []
    for piece in version.replace("rc", ".rc").split("."):
        parts.append(int(piece) if piece.isdigit() else piece)
    return tuple(parts)


def changed(cfg: EngineConfig, name: str) -> bool:
    """Whether the design's release has the change `name` of its policy."""
    return changed_at(cfg.policy, release(cfg), name)


def changed_at(policy: str, at: str, name: str) -> bool:
    """Whether release `at` of `policy` has the change `name`."""
    for c in CHANGES:
        if c.policy == policy and c.name == name:
            return key(at) >= key(c.since)
    raise KeyError(f"no release change {name!r} for {policy}")


def nearest(policy: str, engine_version: str) -> str:
    """The modelled release an installed engine version is held to: the newest modelled release at or below it
    (0.33.2 -> 0.33; 0.35.0 -> 0.34), or the oldest when it is older than all; the newest when the version does
    not read as one (an engine that does not say its version: the target refuses it unless told otherwise)."""
    known = RELEASES[policy]
    try:
        at_or_below = [r for r in known if key(r) <= key(engine_version)[:len(key(r))]]
    except TypeError:   # a number compared with a word: not a version
        return known[-1]
    return at_or_below[-1] if at_or_below else known[0]
