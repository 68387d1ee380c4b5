"""Conformance in lockstep: a target runs its policy's model beside the engine and compares after every step.

`Lockstep` is the mixin both engine targets use (targets/transformers_cb.py, targets/vllm_v1.py): the model
(`ReferenceTarget`) gets the same actions, and after each engine step `compare` (the scheduled list, the error,
per request phase / computed / generated / blocks held, free blocks, cached blocks; a target may compare more)
names the first field on which they differ. A difference is a `MODEL-CONFORMANCE` violation
(`conformance_check`), which the state machine and `replay` raise like any property failure, so Hypothesis
shrinks it; targets/lockstep.py runs the machine as a conformance run. Where the engine makes a choice the model
cannot predict (SGLang's set-ordered re-queue), a target's `lockstep_adopt` gives the model the engine's choice
before the comparison, and only that choice. A documented divergence (`KNOWN`) is
excused only when its predicate accepts the divergence itself (the field, the requests, the direction), and
the comparison then stops for that run: the two states no longer match by construction.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from model.config import EngineConfig
from model.state import State
from properties.registry import Violation

from .protocol import Action, Add, Cancel, Observation, Step, Stop, TargetUnavailable
from .reference import ReferenceTarget

CONFORMANCE = "MODEL-CONFORMANCE"


@dataclasses.dataclass
class Divergence:
    step: int
    field: str
    model_value: object
    engine_value: object
    model_state: Optional[State] = None
    engine_state: Optional[State] = None

    def __str__(self) -> str:
        lines = [f"step {self.step}: {self.field}: model {self.model_value!r} != engine {self.engine_value!r}"]
        if self.model_state is not None and self.engine_state is not None:
            lines.append(f"  model : {describe(self.model_state)}")
            lines.append(f"  engine: {describe(self.engine_state)}")
        return "\n".join(lines)


def describe(s: State) -> str:
    reqs = " ".join(f"r{r.rid}:{r.phase.name[:4]}(c{r.computed},g{r.generated},b{r.blocks + r.shared_blocks})"
                    for r in s.requests)
    return f"free={s.free_blocks} cached={cached(s)} {reqs}" + (f" error={s.error!r}" if s.error else "")


def cached(s: State) -> int:
    """Blocks referenced by no request but kept for their content: the anonymous entry, plus the group prefix
    blocks whose reference count is 0 where the model keeps them (`Sched.slots` of hf_cb)."""
    if hasattr(s.sched, "cached_blocks"):    # the engine's own count (targets/transformers_cb.EngineView)
        return s.sched.cached_blocks
    slots = getattr(s.sched, "slots", None)
    if slots is None:
        return sum(e.blocks for e in s.prefix_cache if e.refs == 0)
    return (sum(e.blocks for e in s.prefix_cache if e.group == -1)
            + sum(1 for _, refs in slots for x in refs if x == 0))


def compare(m: Observation, e: Observation) -> Optional[tuple[str, object, object]]:
    """The first field (in a fixed order) on which the two observations differ."""
    if m.record.scheduled != e.record.scheduled:
        return "scheduled", m.record.scheduled, e.record.scheduled
    if (m.record.error is None) != (e.record.error is None) or m.record.error_kind != e.record.error_kind:
        return "error", (m.record.error_kind, m.record.error), (e.record.error_kind, e.record.error)
    for rm, re_ in zip(m.state.requests, e.state.requests):
        if rm.phase != re_.phase:
            return f"r{rm.rid}.phase", rm.phase.name, re_.phase.name
    for rm, re_ in zip(m.state.requests, e.state.requests):
        for f in ("computed", "generated"):
            if getattr(rm, f) != getattr(re_, f):
                return f"r{rm.rid}.{f}", getattr(rm, f), getattr(re_, f)
        if rm.blocks + rm.shared_blocks != re_.blocks + re_.shared_blocks:
            return f"r{rm.rid}.blocks", rm.blocks + rm.shared_blocks, re_.blocks + re_.shared_blocks
    if m.state.free_blocks != e.state.free_blocks:
        return "free_blocks", m.state.free_blocks, e.state.free_blocks
    if cached(m.state) != cached(e.state):
        return "cached_blocks", cached(m.state), cached(e.state)
    return None


def identical_context_twins(actions: Sequence[Action]) -> set[int]:
    """Requests whose whole prompt is their group's prefix, as an earlier request's of the same group and
    length: greedy decoding gives both the same output tokens."""
    seen, twins = set(), set()
    for a in actions:
        if isinstance(a, Add) and a.prefix_group >= 0 and a.prefix_len >= a.prompt:
            key = (a.prefix_group, a.prompt)
            if key in seen:
                twins.add(a.rid)
            seen.add(key)
    return twins


def identical_context_dedup(cfg: EngineConfig, actions: Sequence[Action], d: "Divergence") -> bool:
    """HF-IDENTICAL-CONTEXT-DEDUP, recognised on the divergence: with block sharing on, the engine holds
    fewer blocks than the model for a request with an identical twin (it adopted the twin's output block),
    or has more blocks free or cached than the model, while such a twin exists."""
    if cfg.policy != "hf_cb" or not cfg.options.allow_block_sharing:
        return False
    twins = identical_context_twins(actions)
    if not twins:
        return False
    if d.field.startswith("r") and d.field.endswith(".blocks"):
        return int(d.field[1:-len(".blocks")]) in twins and d.engine_value < d.model_value
    return d.field in ("free_blocks", "cached_blocks") and d.engine_value > d.model_value


# The divergences docs/conformance.md lists, each with a predicate on the divergence and the workload.
KNOWN = {
    "HF-IDENTICAL-CONTEXT-DEDUP": (
        "the engine de-duplicates every identical full block, output blocks of requests with one whole prompt "
        "included (cache_allocator.py:290-311); the model shares only the group prefix "
        "(model/policies/hf_cb.py 'Known divergences')", identical_context_dedup),
}


def known_divergence(cfg: EngineConfig, actions: Sequence[Action], d: "Divergence") -> Optional[str]:
    """The id of the documented divergence that explains `d`, or None."""
    for key, (_, explains) in KNOWN.items():
        if explains(cfg, actions, d):
            return key
    return None


class Lockstep:
    """The model of the target's policy beside the engine. A target calls `_start_lockstep` in its
    constructor, `_lockstep_add` / `_lockstep_cancel` / `_lockstep_stop` with its actions, and `_lockstep` with each step's
    observation; it may override `lockstep_diff` to compare more than `compare` does."""

    lockstep = True   # the default; a target built with lockstep=False runs the engine alone
    # the modelled release (model/releases.py) the installed engine is held to; set by the target before
    # `_start_lockstep`, None where the target does not say (the design's own release is used)
    engine_release: Optional[str] = None

    def _start_lockstep(self, cfg: EngineConfig, enabled: Optional[bool]) -> None:
        cfg = self.release_config(cfg)
        self.model = ReferenceTarget(cfg) if (self.lockstep if enabled is None else enabled) else None
        self.divergence: Optional[Violation] = None
        self.excused: Optional[str] = None      # the KNOWN divergence that ended the comparison, if any
        self._compared: list[Action] = []

    def release_config(self, cfg: EngineConfig) -> EngineConfig:
        """The design as the model runs it beside this engine: at the installed engine's release. A design that
        names another release is about another engine, and is refused (exit 4) rather than compared."""
        if self.engine_release is None:
            return cfg
        if cfg.version and cfg.version != self.engine_release:
            raise TargetUnavailable(f"the design names {cfg.policy} release {cfg.version} (engine.version) but the "
                                    f"installed engine is held to release {self.engine_release}: run it where that "
                                    f"release is installed (schedproof env, docs/targets.md)")
        return dataclasses.replace(cfg, version=self.engine_release)

    def _lockstep_add(self, action: Add) -> None:
        if self.model is not None:
            self.model.add(action)
            self._compared.append(action)

    def _lockstep_cancel(self, rid: int) -> None:
        if self.model is not None:
            self.model.cancel(rid)
            self._compared.append(Cancel(rid))

    def _lockstep_stop(self, rid: int) -> None:
        if self.model is not None:
            self.model.stop(rid)
            self._compared.append(Stop(rid))

    def lockstep_diff(self, m: Observation, e: Observation):
        return compare(m, e)

    def lockstep_adopt(self, m: Observation, e: Observation) -> Optional[Observation]:
        """Where the engine resolves a choice the model leaves open (an order no model can predict), the model's
        observation with the engine's choice taken, which also becomes the model's state; None when the step
        made no such choice or the engine's differs from the model's in more than it."""
        return None

    def _lockstep(self, obs: Observation) -> None:
        if self.model is None or self.divergence is not None or self.excused is not None:
            return
        mo = self.model.step()
        self.model_record = mo.record   # what the model did in this step (a tally reads its notes)
        self._compared.append(Step())
        adopted = self.lockstep_adopt(mo, obs)
        if adopted is not None:
            mo = adopted
            self.model.state = adopted.state
        diff = self.lockstep_diff(mo, obs)
        if diff is None:
            return
        d = Divergence(obs.record.step, *diff, mo.state, obs.state)
        self.excused = known_divergence(self.cfg, self._compared, d)
        if self.excused is None:
            self.divergence = Violation(CONFORMANCE, obs.record.step,
                                        f"the {self.cfg.policy} model and the {self.name} engine diverge on "
                                        f"{d.field}: model {d.model_value!r} != engine {d.engine_value!r}")

    def conformance_check(self, obs: Observation) -> Optional[Violation]:
        """The lockstep divergence of the step just taken, if any (a target-level oracle)."""
        return self.divergence
