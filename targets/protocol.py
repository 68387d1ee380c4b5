"""The one interface every engine adapter implements.

A target is driven by actions — add a request, cancel one, step the engine once — and after
each step reports what it exposes in the model's own vocabulary: a `State` (requests with
their phase and token counts, free blocks per tier) and a `StepRecord` (what ran, what
finished or failed, the engine's error). So the property registry's step checks run on a
real engine exactly as on the model, and the model itself is just another target.

Actions are plain frozen data, so a failing action list replays on any target and prints as
code for a regression test.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Optional, Union

from model.config import EngineConfig
from model.state import Phase, State, StepRecord


@dataclasses.dataclass(frozen=True)
class Add:
    """Submit request `rid` (ids are 0, 1, 2, ... in submission order)."""

    rid: int
    prompt: int
    max_new: int
    prefix_group: int = -1   # requests of one group share their first `prefix_len` prompt tokens
    prefix_len: int = 0
    priority: int = 0        # vLLM's priority policy (lower first), SGLang's priority scheduling (either way)


@dataclasses.dataclass(frozen=True)
class Cancel:
    rid: int


@dataclasses.dataclass(frozen=True)
class Stop:
    """The environment ends request `rid` early: the next token it samples is a stop token (EOS or a stop
    string). Pending until it samples (a request mid-prefill or preempted samples later); no effect on a
    request already answered. The model's `Env.stops`; a target without it has `early_stops = False`."""

    rid: int


@dataclasses.dataclass(frozen=True)
class Step:
    pass


Action = Union[Add, Cancel, Stop, Step]


def prompt_tokens(a: Add, vocab: int = 512) -> list[int]:
    """The token ids of a request's prompt, derived from the action alone so a replay submits the
    same text: the group's shared prefix, then tokens particular to this request."""
    shared = min(a.prefix_len, a.prompt) if a.prefix_group >= 0 else 0
    prefix = [1 + (a.prefix_group * 7 + k) % (vocab - 1) for k in range(shared)]
    own = [1 + (a.rid * 131 + k * 17 + 3) % (vocab - 1) for k in range(a.prompt - shared)]
    return prefix + own


@dataclasses.dataclass
class Observation:
    state: State
    record: StepRecord
    outputs: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # rid -> token ids, if real


@dataclasses.dataclass
class Answered:
    """How an engine answered a request (its final phase, tokens and reason), kept by an engine target once the
    engine has let go of the request."""
    phase: Phase
    computed: int
    generated: int
    reason: str = ""


class TargetUnavailable(Exception):
    """The engine behind a target cannot be used here: not installed, not a supported release, or its platform
    refuses this machine (it cannot build even a configuration it must accept). An install or platform problem,
    not a finding: exit status 4 (`exit_status`)."""

    status = 4


class UnknownTarget(TargetUnavailable):
    """No target has that name: bad input, exit status 2."""

    status = 2


class AdapterMismatch(TargetUnavailable):
    """The installed engine's API is not the one the adapter drives (a type, field or method it calls has changed):
    the adapter must follow the engine, and nothing it would report could be trusted. Exit status 5."""

    status = 5


def exit_status(exc: TargetUnavailable) -> int:
    """The command's exit status for a target that cannot run: 2 an unknown name, 4 an install or platform
    problem, 5 an adapter that no longer matches the engine's API (an engine's refusal of the configuration is
    bad input, 2, and its crash a finding, 1: neither comes here)."""
    return exc.status


class TargetHung(Exception):
    """An engine step did not return within the target's time limit (a finding, not a test hang)."""


class Target(abc.ABC):
    name: str
    real: bool = False   # True when an actual engine runs behind the adapter
    early_stops: bool = False   # True when `stop` can end a request early (the engine's outputs are ours to pick)

    @abc.abstractmethod
    def __init__(self, cfg: EngineConfig, step_timeout_s: float = 10.0): ...

    @abc.abstractmethod
    def add(self, action: Add) -> None: ...

    @abc.abstractmethod
    def cancel(self, rid: int) -> None: ...

    def stop(self, rid: int) -> None:
        raise NotImplementedError(f"the {self.name} target cannot stop a request early (its model picks the tokens)")

    @abc.abstractmethod
    def step(self) -> Observation:
        """One engine step; raises TargetHung past the time limit. An engine exception is not
        raised: it comes back as `record.error` (with `error_kind`), as the model reports it."""

    def close(self) -> None:
        pass

    def apply(self, action: Action) -> Optional[Observation]:
        if isinstance(action, Add):
            self.add(action)
        elif isinstance(action, Cancel):
            self.cancel(action.rid)
        elif isinstance(action, Stop):
            self.stop(action.rid)
        else:
            return self.step()
        return None
