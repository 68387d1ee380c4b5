"""Hugging Face transformers continuous batching (`ContinuousBatchingManager`), transformers 5.19.0.

Paths are under transformers/generation/continuous_batching/ of transformers 5.19.0 (the version this
project pins: vLLM's CPU build caps transformers < 5.20; the scheduling code is identical in 5.24.0):
  SCH = scheduler.py (`Scheduler`, `FIFOScheduler`, `PrefillFirstScheduler`)
  OM  = offloading_manager.py (`OffloadingManager.offload_requests`)
  API = continuous_api.py (`ContinuousBatchProcessor.prepare_next_batch` / `update_batch`)
  C   = cache.py (`PagedAttentionCache`), CA = cache_allocators/cache_allocator.py, FA = .../full_attention.py
  REQ = requests.py (`RequestState`), INIT = initialization.py
Each rule below names the function and lines it mirrors (rule numbers R1-R26 of docs/engine-notes/hf_cb.md).

One engine step, as in API `prepare_next_batch` :482-536 (R1):
  drain arrivals into the waiting FIFO -> drop cancellations -> nothing active or waiting: idle
  -> `schedule_batch`; while it returns None: `offload_requests` (False => the fatal
     RuntimeError :509) and schedule again -> [] => idle step
  -> starved requests left: `offload_requests` once more (:519-520) -> forward -> `update_batch`.

Mapping of the shared knobs (ContinuousBatchingConfig names):
  block_size = page_size (>= 4, INIT:38-40, :310-313), num_blocks = num_blocks (one sector per block, the usual
  geometry, C:173/:223), max_num_tokens = max_batch_tokens, max_batch_size = max_requests_per_batch, capped at
  max_batch_tokens as INIT:306 does. The engine has no "chunked prefill off": it always splits a prefill by the
  token budget left (SCH `_schedule_request` :141-177), so `chunked_prefill` must be true and chunk_unit 0 or 1.
  host_blocks must be 0: cpu_offload_space > 0 (the pinned CPU swap pool) is not modelled (it also fails at
  start-up on a CPU-only machine: pin_memory needs CUDA), so every offload is a soft reset.

Soft reset (OM:230-234, REQ `create_equivalent_initial_request` :329-352): the new request's prompt is
prompt + generated and its max_new_tokens is reduced by the generated count. Here: phase PREEMPTED, computed 0,
blocks released without caching; `generated` is kept, so context_len = prompt + generated is the new prompt and
finishing at generated >= max_new is the same point as the reduced max_new_tokens.

Prefix cache (allow_block_sharing, default True; R21-R23): the full blocks a request has written are hashed after each
step it does not finish in (API:564-574, C:348-357); on finish/cancel an unreferenced hashed block stays occupied as
a cached block (CA `BlockLedger.release` :66-93), reclaimed all at once by the safety-margin check (SCH:179-194) or by
`offload_requests` (OM:167, CA `evict_cached_blocks` :100-108). Requests of one prefix group (`prefix_group`,
`prefix_len`) have identical first `prefix_len // page` blocks (same chained hash, CA `compute_block_hash` :25-31):
- a PENDING request (fresh or soft reset) matches the longest run of its group's hashed prefix blocks, over at most
  (len(prompt) - 1) // page blocks, acquires them and starts PREFILLING at matched * page (SCH `_infer_request_tokens`
  :118-139, C `search_prefix_match` :308-333, CA :268-288);
- a prefix block hashed while an identical one exists is de-duplicated: the request adopts the existing block and its
  copy goes back to the pool (CA `mark_complete_blocks` :290-311);
- each group prefix block has its own reference count (`Sched.slots`: -1 = no such hashed block, 0 = cached);
  a release decrements each shared block, so offloading a request whose blocks are all shared frees nothing
  (seeds.md 1; CA :66-93, scenarios/hf-cb-shared-prefix-offload-frees-nothing.toml).
The group's blocks are mirrored in `PrefixEntry(group, blocks = hashed prefix blocks, refs = requests referencing
them)`; the cached blocks of requests' own (non-prefix) tokens are one anonymous `PrefixEntry(group=-1, refs=0)`; the
per-request hashed count lives in `Sched.hashed`. Matched on the real engine step by step for three shared-prefix
workloads (tests/test_policy_hf_cb.py `test_trace_shared_prefix_*`).

Engine finding (reproduced on the real engine, scenarios/hf-cb-cancel-after-soft-reset.toml): cancelling the
last active request right after a soft reset leaves block_new_requests set (only a finish clears it, API:569;
SCH `clear_cancelled_requests` :95-110 does not), so the soft-reset request is never a candidate again and
`schedule_batch` returns [] forever: a permanent idle with a request owed an answer. The model reproduces it.

Known divergences (all deliberate):
- only the shared prefix of a group is shared: every token past `prefix_len` (and every generated token) is taken as
  distinct. On the real engine with greedy decoding, requests whose whole prompt is the same produce the same output
  tokens, whose blocks would be de-duplicated too (CA:290-311); the model does not share those;
- the CPU offload path (cpu_offload_space > 0) is not modelled (ConfigError on host_blocks > 0);
- one sector per block (sector size = lcm(bytes per block, 128)); exotic geometries that round capacity up to
  whole sectors are not modelled;
- parallel sampling (num_return_sequences > 1, forks) and the decode fast path (CUDA only) are not modelled;
- an unknown scheduler_type is a ConfigError here; the engine warns and falls back to FIFO;
- EOS is an environment stop (`Env.stops`), as for every policy.
"""

from __future__ import annotations

import dataclasses

from ..config import ConfigError, EngineConfig, cdiv, choice
from ..policy import Plan, Policy, register, replace
from ..state import Phase, PrefixEntry, Request, State

ERROR = "No requests can be scheduled and no requests can be offloaded."   # API:509
EMPTY_BATCH_ERROR = "the forward pass of a batch with no query tokens (only empty prompts) fails: cannot reshape tensor of 0 elements"
DEFAULT_SAFETY_MARGIN = {"fifo": 0.15, "prefill_first": 0.0}             # SCH:313-314, :363-364
MIN_PAGE_SIZE = 4                                                         # INIT:38-40 BOUNDS["page_size"]
ANON = -1   # PrefixEntry group of the cached blocks of finished/cancelled requests (no group shares them)


@dataclasses.dataclass(frozen=True)
class Options:
    scheduler_type: str = choice("fifo", "fifo", "prefill_first")
    # None = the scheduler type's own default (fifo 0.15, prefill_first 0.0); SCH:39-40 wants [0, 1]
    safety_margin: float | None = dataclasses.field(default=None, metadata={"non_negative": True, "max": 1.0})
    allow_block_sharing: bool = True


@dataclasses.dataclass(frozen=True)
class Sched:
    active: tuple[int, ...] = ()      # SCH `active_requests`, dict insertion order
    waiting: tuple[int, ...] = ()     # SCH `waiting_requests_order` (FIFO deque)
    block_new: bool = False           # SCH `block_new_requests`
    hashed: tuple[tuple[int, int], ...] = ()   # (rid, full blocks hashed) for requests holding blocks
    # per prefix group, one entry per full block of the shared prefix (block index i): -1 = no hashed block
    # with that content, else its reference count (0 = cached, CA `BlockLedger` :34-108)
    slots: tuple[tuple[int, tuple[int, ...]], ...] = ()


@register
class HfCb(Policy):
    name = "hf_cb"
    mirrors = "transformers 5.19.0 generation/continuous_batching (FIFOScheduler / PrefillFirstScheduler)"
    engine_loop = "ContinuousBatchingManager's generation loop (transformers' only one)"
    Options = Options

    def initial_sched(self, cfg):
        return Sched()

    def stall_reason(self, cfg, state):
        """SCH `_get_waiting_candidates` :282-297: with block_new_requests set the waiting queue is no
        candidate; only a finish clears it (API :567-569), so with no active request it stays set."""
        s = state.sched
        if s.block_new and not s.active and s.waiting:
            names = ", ".join(f"r{rid}" for rid in s.waiting)
            return (f"block_new_requests is set and no request is active (only a finish clears it), so the waiting "
                    f"queue ({names}) is never a candidate again")
        return None

    def check_config(self, cfg: EngineConfig) -> None:
        if cfg.block_size < MIN_PAGE_SIZE:
            # INIT `check_cb_values_bounds` :310-313 raises ValueError
            raise ConfigError("engine.block_size",
                              f"page_size must be at least {MIN_PAGE_SIZE} but got {cfg.block_size}")
        if not cfg.chunked_prefill:
            raise ConfigError("engine.chunked_prefill",
                              "transformers always splits prefills by the token budget left "
                              "(scheduler.py:141-177); set chunked_prefill = true")
        if cfg.chunk_unit > 1:
            raise ConfigError("engine.chunk_unit",
                              "transformers chunks prefills at token granularity; use 0 or 1")
        if cfg.host_blocks:
            raise ConfigError("engine.host_blocks",
                              "the CPU offload pool (cpu_offload_space > 0) is not modelled: only soft resets "
                              "(it also fails at start-up on a CPU-only machine); use host_blocks = 0")

    def fits_alone(self, cfg: EngineConfig, r: Request) -> bool:
        """R18 / R15: the last sampled token's KV is never written, so one request alone needs
        prompt + max_new - 1 tokens of pages (verified 54/54 on the real engine, notes §7 (a))."""
        return r.prompt + r.max_new - 1 <= cfg.num_blocks * cfg.block_size

    # -- queue bookkeeping -----------------------------------------------------------------
    def arrive(self, cfg, state, rids, plan):
        """API `_update_tp_group_state` :421-464 -> SCH `add_waiting_request` :57-60: appended to the FIFO."""
        state = super().arrive(cfg, state, rids, plan)
        new = tuple(rid for rid in rids if state.req(rid).phase == Phase.WAITING)
        if new:
            state = replace(state, sched=replace(state.sched, waiting=state.sched.waiting + new))
        return state

    def cancel(self, cfg, state, rid):
        """SCH `clear_cancelled_requests` :95-110: popped from active/waiting, blocks freed (with caching),
        no output. `block_new_requests` is left as it is (R20)."""
        state = super().cancel(cfg, state, rid)
        return _forget(state, rid)

    def finish(self, cfg, state, rid):
        """API `update_batch` :567-569: `finish_request` frees the blocks, then block_new_requests = False."""
        state = super().finish(cfg, state, rid)
        state = _forget(state, rid)
        return replace(state, sched=replace(state.sched, block_new=False))

    def release(self, cfg, state, rid):
        return _release(state, rid, no_cache=False)

    def after_step(self, cfg, state, plan):
        """API `update_batch` :564-574 -> C `mark_complete_blocks` :348-357: every scheduled request not
        finished by this step gets its fully written blocks hashed (count = pos // page, R22); the blocks
        completed by a request's finishing step are never hashed."""
        if cfg.options.allow_block_sharing:
            for s in plan.scheduled:
                r = state.req(s.rid)
                if r.phase in (Phase.PREFILLING, Phase.DECODING):
                    state = _hash_blocks(cfg, state, s.rid, r.computed // cfg.block_size)
        return super().after_step(cfg, state, plan)

    # -- the step ------------------------------------------------------------------------
    def schedule(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        state = _Pass(cfg, state, plan).run()
        if plan.scheduled and plan.error is None and sum(s.tokens for s in plan.scheduled) == 0:
            # API `_generation_step` :635: a batch of zero query tokens (only empty prompts) fails in the
            # model's forward pass (torch cannot reshape the empty query); the manager's loop dies
            # (`_handle_critical_error` :1209). Found by `schedproof fuzz --target transformers`.
            plan.error, plan.error_kind = EMPTY_BATCH_ERROR, "crash"
        return state


def shared_prefix_blocks(cfg: EngineConfig, r: Request) -> int:
    """Full blocks of the request's shared prefix: their content (and chained hash, CA `compute_block_hash` :25-31)
    is the same for every request of the group; later blocks are distinct."""
    if r.prefix_group < 0 or not cfg.options.allow_block_sharing:
        return 0
    return min(r.prefix_len, r.prompt) // cfg.block_size


def _slots(state: State, group: int) -> list[int]:
    return list(dict(state.sched.slots).get(group, ()))


def _set_slots(state: State, group: int, slots: list[int]) -> State:
    """Store a group's per-block ref counts and mirror them in its `PrefixEntry`: blocks = hashed prefix blocks
    that exist (referenced or cached), refs = live requests referencing any of them."""
    d = dict(state.sched.slots)
    while slots and slots[-1] < 0:
        slots.pop()
    if slots:
        d[group] = tuple(slots)
    else:
        d.pop(group, None)
    state = replace(state, sched=replace(state.sched, slots=tuple(sorted(d.items()))))
    blocks = sum(1 for x in slots if x >= 0)
    refs = sum(1 for r in state.requests if r.prefix_group == group and r.shared_blocks > 0)
    entries = [e for e in state.prefix_cache if e.group != group]
    if blocks or refs:
        entries.append(PrefixEntry(group, blocks, refs))
    return replace(state, prefix_cache=tuple(sorted(entries, key=lambda e: e.group)))


def _hash_blocks(cfg: EngineConfig, state: State, rid: int, upto: int) -> State:
    """C `mark_complete_blocks` :348-357 -> CA `mark_complete_blocks` :290-311: the request's blocks are hashed
    in order; a block of the shared prefix whose hash already exists is de-duplicated (the request acquires the
    existing block, CA `BlockLedger.acquire` :58-64, and its own copy, unhashed, goes back to the pool, CA:310-311);
    otherwise it registers (CA `register_new_hash` :89-98) and becomes the group's block. Blocks past the shared
    prefix are distinct: they stay the request's own, counted in `hashed`."""
    r = state.req(rid)
    old = dict(state.sched.hashed).get(rid, 0)
    k = shared_prefix_blocks(cfg, r)
    if upto > old and old < k:
        slots = _slots(state, r.prefix_group)
        slots += [-1] * (k - len(slots))
        free, own, shared = state.free_blocks, r.blocks, r.shared_blocks
        for i in range(old, min(upto, k)):
            if slots[i] >= 0:          # identical block exists: adopt it, release our duplicate to the pool
                slots[i] += 1
                free += 1
            else:                      # first of its content: registered, now a shared (hashed) block
                slots[i] = 1
            own -= 1
            shared += 1
        state = replace(state, free_blocks=free).with_request(replace(r, blocks=own, shared_blocks=shared))
        state = _set_slots(state, r.prefix_group, slots)
    hashed = dict(state.sched.hashed)
    hashed[rid] = max(old, upto)
    return replace(state, sched=replace(state.sched, hashed=tuple(sorted(hashed.items()))))


def _release(state: State, rid: int, no_cache: bool) -> State:
    """C `free_blocks` :295-299 -> CA `free_blocks` :233-239 / `BlockLedger.release` :66-93 (R23): each block
    loses one reference; a shared block still referenced stays (so releasing a request whose blocks are all shared
    frees nothing); an unreferenced hashed block becomes a cached block (still occupied) unless no_cache (offload,
    OM:198), which unhashes it back to the pool; unhashed blocks go back to the pool."""
    r = state.req(rid)
    hashed = dict(state.sched.hashed).get(rid, 0)
    free = state.free_blocks
    if r.shared_blocks:
        slots = _slots(state, r.prefix_group)
        for i in range(r.shared_blocks):
            slots[i] -= 1
            if slots[i] == 0 and no_cache:
                slots[i] = -1          # CA:81-83 hash dropped, block back to the pool
                free += 1
    keep = 0 if no_cache else min(max(0, hashed - r.shared_blocks), r.blocks)
    state = replace(state, free_blocks=free + r.blocks - keep,
                    sched=replace(state.sched, hashed=_without(state.sched.hashed, rid)))
    state = state.with_request(replace(r, blocks=0, shared_blocks=0, host_blocks=0, suspended=False))
    if r.shared_blocks:
        state = _set_slots(state, r.prefix_group, slots)
    if keep:
        state = _add_cached(state, keep)
    return state


def _without(pairs, rid):
    return tuple(p for p in pairs if p[0] != rid)


def _forget(state: State, rid: int) -> State:
    s = state.sched
    return replace(state, sched=replace(s, active=tuple(x for x in s.active if x != rid),
                                        waiting=tuple(x for x in s.waiting if x != rid)))


def _add_cached(state: State, n: int) -> State:
    entries = list(state.prefix_cache)
    for i, e in enumerate(entries):
        if e.group == ANON:
            entries[i] = replace(e, blocks=e.blocks + n)
            return replace(state, prefix_cache=tuple(entries))
    return replace(state, prefix_cache=tuple(entries) + (PrefixEntry(ANON, n, 0),))


class _Pass:
    """One call of API `prepare_next_batch` (scheduling part); mutable scratch, discarded after the step."""

    def __init__(self, cfg: EngineConfig, state: State, plan: Plan):
        self.cfg, self.o, self.state, self.plan = cfg, cfg.options, state, plan
        self.page = cfg.block_size
        self.capacity = cfg.num_blocks
        # INIT `update_cb_config` :306: max_requests_per_batch = min(max_requests_per_batch, max_batch_tokens)
        self.max_requests = min(cfg.max_batch_size, cfg.max_num_tokens)
        margin = self.o.safety_margin
        self.margin = DEFAULT_SAFETY_MARGIN[self.o.scheduler_type] if margin is None else margin
        self.starved: list[tuple[int, int]] = []

    # -- small accessors -----------------------------------------------------------------
    def r(self, rid: int) -> Request:
        return self.state.req(rid)

    def put(self, r: Request) -> None:
        self.state = self.state.with_request(r)

    @property
    def sched(self) -> Sched:
        return self.state.sched

    def set_sched(self, **kw) -> None:
        self.state = replace(self.state, sched=replace(self.sched, **kw))

    def needs(self, rid: int, q: int) -> int:
        """FA `_compute_blocks_needed` :118-122: ceil((position_offset + q) / page) - blocks held."""
        r = self.r(rid)
        return max(0, cdiv(r.computed + q, self.page) - (r.blocks + r.shared_blocks))

    # -- API `prepare_next_batch` :482-536 -------------------------------------------------
    def run(self) -> State:
        if not self.sched.active and not self.sched.waiting:
            return self.state                                   # :495-496 nothing pending
        batch = self.schedule_batch()
        while batch is None:                                    # :506
            if not self.offload_requests():                     # :508
                self.plan.error = ERROR                         # :509
                self.plan.error_kind = "deadlock"               # the engine's own no-progress detector
                return self.state
            batch = self.schedule_batch()                       # :511-513
        if not batch:
            self.plan.notes.append("schedule_batch returned []: idle step")   # :516-517
            return self.state
        if self.starved:
            self.offload_requests()                             # :519-520, return value ignored
        for rid, q in batch:
            self.plan.schedule(rid, q)
        return self.state

    # -- SCH `schedule_batch` (FIFO :317-351, PrefillFirst :367-402) ---------------------
    def candidates(self) -> list[int]:
        """R2/R3: active DECODING and PREFILLING in active-dict order (FIFO: decodes first; prefill_first:
        prefills first), then the waiting FIFO unless block_new_requests (SCH `_get_waiting_candidates`
        :282-297; no CPU-offloaded requests to interleave)."""
        active = self.sched.active
        dec = [rid for rid in active if self.r(rid).phase == Phase.DECODING]
        pre = [rid for rid in active if self.r(rid).phase != Phase.DECODING]
        out = dec + pre if self.o.scheduler_type == "fifo" else pre + dec
        if not self.sched.block_new:
            out += list(self.sched.waiting)
        return out

    def schedule_batch(self):
        """SCH `_process_candidates` :196-280 plus the None-vs-[] return (:347-351 / :398-402)."""
        scheduled: list[tuple[int, int]] = []
        one_allocation_failed = False
        self.starved = []                                       # :211
        token_budget = self.cfg.max_num_tokens                  # API:499-501 max_batch_tokens
        cache_budget = self.capacity * self.page                # C:228 max_tokens_read
        request_budget = self.max_requests                      # :214
        in_margin = self.meet_safety_margin()                   # :217, once per call
        for rid in self.candidates():
            r = self.r(rid)
            if not in_margin and scheduled and r.phase != Phase.DECODING:
                break                                           # :221-222 (R6)
            r = self.match_prefix(rid)                          # :225 SCH `_infer_request_tokens` (R21)
            length = 1 if r.phase == Phase.DECODING else r.context_len - r.computed
            q = min(length, token_budget)                       # :227 (R7)
            read_needed = r.computed                            # :233-235 position_offset
            if cache_budget < read_needed:
                continue                                        # :237-238 skipped, not starved (R12)
            need = self.needs(rid, q)
            if need > self.state.free_blocks:                   # C `can_store_request_tokens` :248-273 (R8)
                one_allocation_failed = True                    # :243
                if rid in self.sched.active:
                    self.starved.append((rid, q))               # :245-246 (R9)
                continue                                        # :247
            self.allocate(rid, need)
            scheduled.append((rid, q))
            token_budget -= q                                   # :257-259 (R10)
            cache_budget -= read_needed
            request_budget -= 1
            if token_budget == 0 or cache_budget <= 0 or request_budget <= 0:
                break                                           # :275-276 (R11)
        if not scheduled and one_allocation_failed:
            return None                                         # (R13)
        return scheduled

    def match_prefix(self, rid: int) -> Request:
        """SCH `_infer_request_tokens` :118-139 -> C `search_prefix_match` :308-333 -> CA `match_prefix_blocks`
        :268-280 / `acquire_prefix_blocks` :282-288 (R21): a PENDING request (fresh or soft-reset) matches the
        longest run of hashed blocks of its group's prefix, from block 0, over at most (len(prompt) - 1) // page
        blocks; the matched blocks are acquired (ref + 1, or taken back from the cached blocks), computed starts at
        matched * page, and it moves to active_requests as PREFILLING, even if its allocation then fails."""
        r = self.r(rid)
        if r.phase not in (Phase.WAITING, Phase.PREEMPTED):
            return r
        k = min(shared_prefix_blocks(self.cfg, r), (r.context_len - 1) // self.page)
        slots = _slots(self.state, r.prefix_group)
        n = 0
        while n < min(k, len(slots)) and slots[n] >= 0:
            n += 1
        if n == 0:
            return r
        for i in range(n):
            slots[i] += 1
        r = replace(r, phase=Phase.PREFILLING, computed=n * self.page, shared_blocks=n)
        self.put(r)
        self.state = _set_slots(self.state, r.prefix_group, slots)
        hashed = dict(self.sched.hashed)
        hashed[rid] = n
        self.set_sched(hashed=tuple(sorted(hashed.items())),
                       active=self.sched.active + (rid,),
                       waiting=tuple(x for x in self.sched.waiting if x != rid))
        self.plan.notes.append(f"r{rid} prefix match: {n} shared block(s)")
        return r

    def allocate(self, rid: int, need: int) -> None:
        """FA `allocate_cache_to_request` :129-135 all-or-nothing, and SCH `_schedule_request` :141-177: a
        waiting request enters active_requests (at the end) and leaves the waiting queue (:269-272, :299-303)."""
        r = self.r(rid)
        self.state = replace(self.state, free_blocks=self.state.free_blocks - need)
        self.put(replace(r, blocks=r.blocks + need))
        if rid not in self.sched.active:
            self.set_sched(active=self.sched.active + (rid,),
                           waiting=tuple(x for x in self.sched.waiting if x != rid))

    def meet_safety_margin(self) -> bool:
        """SCH `_try_to_meet_safety_margin` :179-194 (R5): free / total >= margin (C `compute_free_capacity`
        :481-486, cached blocks are not free); if out of margin, evict every cached block and look again."""
        in_margin = self.state.free_blocks / self.capacity >= self.margin
        if not in_margin and self.evict_cached_blocks():
            in_margin = self.state.free_blocks / self.capacity >= self.margin
        return in_margin

    def evict_cached_blocks(self) -> bool:
        """C `evict_cached_blocks` :359-369: all unreferenced cached blocks back to the pool at once."""
        n = sum(e.blocks for e in self.state.prefix_cache if e.group == ANON)
        self.state = replace(self.state, free_blocks=self.state.free_blocks + n,
                             prefix_cache=tuple(e for e in self.state.prefix_cache if e.group != ANON))
        for group, slots in self.sched.slots:   # CA `evict_cached_blocks` :100-108: refs-0 hashed blocks
            cached = sum(1 for x in slots if x == 0)
            if cached:
                n += cached
                self.state = replace(self.state, free_blocks=self.state.free_blocks + cached)
                self.state = _set_slots(self.state, group, [-1 if x == 0 else x for x in slots])
        if not n:
            return False
        self.plan.notes.append(f"evicted {n} cached block(s)")
        return True

    # -- OM `offload_requests` :156-242 (R16) ---------------------------------------------
    def offload_requests(self) -> bool:
        evicted = self.evict_cached_blocks()                    # :167
        starved = list(self.starved)                            # :163
        if not starved:
            return evicted                                      # :168-169
        need = [self.needs(rid, q) for rid, q in starved]       # :171-177, computed once
        num_active = len(self.sched.active)                     # :180
        offloaded: list[int] = []
        while starved and num_active - len(offloaded) > 1:      # :183
            if sum(need) <= self.state.free_blocks:             # C `count_storable_requests` :275-293
                break                                           # :185-187
            rid, _ = starved.pop()                              # :190-191 the newest starved request
            need.pop()
            offloaded.append(rid)
            self.state = _release(self.state, rid, no_cache=True)   # :198
        self.starved = starved
        if not offloaded:
            return evicted                                      # :202-203
        for rid in reversed(offloaded):                         # :209-234, oldest first
            self.soft_reset(rid)
        self.set_sched(block_new=True)                          # :236
        return True                                             # :242

    def soft_reset(self, rid: int) -> None:
        """OM :230-234 + REQ `create_equivalent_initial_request`: restarted with prompt + generated as its
        prompt (max_new reduced by generated), at the END of the waiting queue."""
        r = self.r(rid)
        self.put(replace(r, phase=Phase.PREEMPTED, computed=0, preemptions=r.preemptions + 1))
        self.set_sched(active=tuple(x for x in self.sched.active if x != rid),
                       waiting=self.sched.waiting + (rid,))
        self.plan.preempted.append(rid)
        self.plan.notes.append(f"r{rid} soft reset: new prompt {r.context_len} tokens, "
                               f"{r.max_new - r.generated} left to generate")
