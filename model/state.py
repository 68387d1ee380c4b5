"""The abstract state of one scheduler and its paged KV pool.

Everything here is frozen and ordered (tuples, enums), so a state hashes, compares and
replays the same way every time (style lesson 1). A policy never mutates a state: it
returns a new one with `dataclasses.replace`.

Token bookkeeping is the same for every engine:
- `prompt` is the original prompt, `generated` the output tokens sampled so far (kept
  across a recompute preemption: the engines replay them as part of the new context);
- while a request is in its context phase, its context is `prompt + generated` tokens and
  `computed` of them have KV; the step that computes the last context token samples one
  more output token;
- while decoding, `computed == prompt + generated - 1`: the newest sampled token has no KV
  yet, and the next decode step writes it and samples the next one.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional


class Phase(enum.IntEnum):
    PENDING = 0      # not arrived yet (the environment has not submitted it)
    WAITING = 1      # queued, holds no KV
    PREFILLING = 2   # context started: some context tokens have KV
    DECODING = 3     # context done, generating one token per step
    PREEMPTED = 4    # KV dropped for recompute (vLLM preempt, TRT-LLM recompute-pause, HF soft reset)
    OFFLOADED = 5    # KV moved to the lower tier (HF CPU offload)
    FINISHED = 6
    FAILED = 7       # failed by the engine (an engine error)
    REJECTED = 8     # refused at admission with a clear error, before any work
    CANCELLED = 9

    @property
    def terminal(self) -> bool:
        return self >= Phase.FINISHED

    @property
    def unfinished(self) -> bool:
        """Arrived and still owed an answer."""
        return Phase.WAITING <= self < Phase.FINISHED


@dataclasses.dataclass(frozen=True)
class Request:
    rid: int
    prompt: int
    max_new: int            # what the engine knows; the actual output length lives in the workload
    arrival: int            # step at which the environment submits it
    prefix_group: int = -1  # requests of one group share their first `prefix_len` prompt tokens
    prefix_len: int = 0
    priority: int = 0       # vLLM priority policy: lower first; SGLang priority scheduling: either way
    phase: Phase = Phase.PENDING
    computed: int = 0       # tokens of the current context that have KV
    generated: int = 0
    blocks: int = 0         # GPU blocks this request owns (shared prefix blocks are counted in the cache)
    shared_blocks: int = 0  # prefix-cache blocks this request references
    host_blocks: int = 0    # lower-tier blocks
    suspended: bool = False  # TRT-LLM V2: KV kept but not active
    preemptions: int = 0
    reason: str = ""        # why it failed or was rejected

    @property
    def context_len(self) -> int:
        """Tokens the current context must cover: the prompt plus everything generated before
        the last (re)start. Equals prompt + generated until the context's last step."""
        return self.prompt + self.generated

    @property
    def remaining_context(self) -> int:
        if self.phase == Phase.DECODING:
            return 0
        return self.context_len - self.computed

    @property
    def started(self) -> bool:
        return self.phase in (Phase.PREFILLING, Phase.DECODING)


@dataclasses.dataclass(frozen=True)
class PrefixEntry:
    """Full blocks of one prefix group kept in the cache, and how many live requests use them."""

    group: int
    blocks: int
    refs: int


@dataclasses.dataclass(frozen=True)
class State:
    step: int
    requests: tuple[Request, ...]
    free_blocks: int
    free_host_blocks: int
    sched: object = None               # the policy's own memory between steps (frozen dataclass)
    prefix_cache: tuple[PrefixEntry, ...] = ()
    error: Optional[str] = None        # the engine raised: it is dead from here on

    def req(self, rid: int) -> Request:
        return self.requests[rid]

    def with_request(self, r: Request) -> "State":
        reqs = list(self.requests)
        reqs[r.rid] = r
        return dataclasses.replace(self, requests=tuple(reqs))

    @property
    def cached_blocks(self) -> int:
        return sum(e.blocks for e in self.prefix_cache)

    def key(self) -> tuple:
        """Everything but the step counter: two states with one key behave alike from here on
        (once the environment has nothing left to submit or cancel)."""
        return (self.requests, self.free_blocks, self.free_host_blocks, self.sched,
                self.prefix_cache, self.error)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one engine step did, as the properties see it."""

    step: int
    scheduled: tuple[tuple[int, int], ...] = ()   # (rid, tokens the forward pass runs for it, drafts included)
    charged: int = 0                               # tokens the scheduler charged against its budget
    preempted: tuple[int, ...] = ()                # KV dropped for recompute
    offloaded: tuple[int, ...] = ()                # KV moved to a lower tier / suspended
    finished: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    rejected: tuple[int, ...] = ()
    error: Optional[str] = None
    error_kind: Optional[str] = None               # "deadlock" (the engine's own stall detector) or "crash"
    notes: tuple[str, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(t for _, t in self.scheduled)
