"""SGLang's scheduler (0.5.23): the overlap event loop (the default) or the normal one, a plain model, the radix
cache on or off.

Mirrors the sglang==0.5.23 wheel (python/sglang/srt/...):
  SC = managers/scheduler.py       get_next_batch_to_run (3894), _get_new_batch_prefill_raw (4079),
                                   get_num_allocatable_reqs (4027), update_running_batch (4459),
                                   init_req_max_new_tokens (2693), _handle_generate_request (2959),
                                   abort_request (5675), process_pending_chunked_abort (3778),
                                   event_loop_normal (2026), on_idle (5241), is_fully_idle (5337),
                                   init_schedule_policy (1436), _add_request_to_queue (3480)
  SP = managers/schedule_policy.py SchedulePolicy.calc_priority (213), _sort_by_priority_and_fcfs (526);
                                   PrefillAdder: __init__ (607), _get_running_request_total_token_offset (785),
                                   budget_state (874), _update_prefill_budget (895), add_chunked_req (1140),
                                   add_one_req_ignore_eos (1241), add_one_req (1395), _select_prefill_admission
                                   (1592), preempt_to_schedule (1707); CLIP_MAX_NEW_TOKENS (89),
                                   IGNORE_EOS_RESERVE_TOKENS (122)
  PB = mem_cache/prefill_budget.py PrefillBudget (62-167)
  SB = managers/schedule_batch.py  update_finish_state (2021), set_finish_with_abort (2221), reset_for_retract
                                   (2049), release_req (2360), check_decode_mem (3432), retract_decode (3451),
                                   _get_decode_retraction_order (3542), filter_batch (3834)
  AB = mem_cache/allocator/base.py max_new_tokens_for_memory (88), check_decode_capacity (171)
  RT = managers/scheduler_components/new_token_ratio_tracker.py (14-49); EN = environ.py (646-649)
  TW = managers/tp_worker.py (568-572): max_req_len, max_req_input_len
  UR = mem_cache/unified_radix_cache.py checkpoint_into_tree (1164); CM = mem_cache/common.py release_kv_cache
       (400), checkpoint_kv_cache (271), evict_from_tree_cache (283); AL = mem_cache/allocation.py; the tree
       itself: sglang_radix.py
The engine's knobs: block_size = --page-size, num_blocks * block_size = the token pool (max_total_num_tokens),
max_num_tokens = --max-prefill-tokens, max_batch_size = --max-running-requests (the request rows and the
pipeline micro-batch cap, taken equal), chunked_prefill with `chunked_prefill_size` = --chunked-prefill-size.

One step is one iteration of the engine's event loop: ingest (arrivals, aborts), get_next_batch_to_run (merge the
last prefill batch into the running batch, filter the finished, then prefill first, else decode), run, process
a result. In SC event_loop_normal (options.disable_overlap_schedule) the result is the batch's own; in
event_loop_overlap, SGLang's default, it is the previous iteration's batch, processed after this one is
launched (model/policies/sglang_overlap.py: what that changes, rule by rule). The running batch keeps a request
that finished until the next iteration's filter, as the engine does, because that filter is what clears the
`batch_is_full` latch.

The radix cache (options.disable_radix_cache false, SGLang's default): a waiting request reached by the pass
matches its context less its last token and is charged only the rest, the tree's unlocked tokens count as free
for admission, a prefill that is done goes into the tree at once (locked while the request runs), a finish puts
the committed tokens in and unlocks them, a retraction unlocks without inserting and evicts headroom, and every
allocation evicts least recently used leaves first. Token identity is the workload's prefix groups
(sglang_radix.py). With the cache off every match is empty and nothing is evictable.

Priority scheduling (options.enable_priority_scheduling, FCFS otherwise): each pass sorts the queue by
(priority, queue-entry time), and, unless --disable-priority-preemption, a request the pass reaches once the
running batch is out of request rows may preempt running requests whose priority is more than the threshold
below its own (SP preempt_to_schedule): released like a retraction, re-queued after the pass.

Known divergences, all deliberate (docs/fidelity/sglang.md):
- the overlap loop's own divergences (model/policies/sglang_overlap.py): no grammar, no speculative decoding, and
  consecutive prefills always overlapped (SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP's opt-in not modelled);
- requests one pass preempts for priority are re-queued in running-batch order; SGLang re-queues them in the
  iteration order of a Python set of Req objects (SP preempt_to_schedule, `set(preemptible_reqs)`), an order of
  memory addresses, which the sglang target's lockstep takes from the engine (targets/sglang.py
  `adopt_requeue_order`);
- FCFS or priority only (no cache-aware policies), no mixed chunk, no speculative decoding, no DP/PP, no LoRA,
  no grammar, no HiCache, page-aligned everything as in a plain full-attention model;
- an early stop is a stop token (EOS): with ignore_eos it has no effect (SB _check_token_based_finish);
  stop strings are not modelled.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Optional

from ..config import ConfigError, EngineConfig, cdiv, positive
from ..policy import Env, Plan, Policy, register, replace
from ..state import Phase, PrefixEntry, Request, State, StepRecord
from . import sglang_radix as radix
from .sglang_overlap import land, launch, overlap_step

CLIP_MAX_NEW_TOKENS = 4096          # SP:89 (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)
IGNORE_EOS_RESERVE_TOKENS = 1       # SP:122
INIT_NEW_TOKEN_RATIO = 0.7          # EN:646
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14   # EN:647
NEW_TOKEN_RATIO_DECAY_STEPS = 600   # EN:648
RETRACT_DECODE_STEPS = 20           # EN:649
WAITING_PREFIX_REFRESH_INTERVAL = 32  # SP:139
WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # SP:137
LAST_REQUEST_OOM = ("Out of memory even after retracting all other requests in the decode batch. "
                    "Aborting the last request.")                                  # SB retract_decode
EMPTY_PROMPT = "input_ids cannot be empty."                                          # io_struct.py:499
PREFILL_OOM = "Out of memory: prefill KV allocation failed"                        # mem_cache/allocation.py:152


@dataclasses.dataclass(frozen=True)
class Options:
    # --chunked-prefill-size (used when engine.chunked_prefill is true; SC:1352-1373 make it None otherwise)
    chunked_prefill_size: int = positive(8192)
    # --schedule-conservativeness: new_token_ratio starts at min(0.7 x this, 1) (RT from_config)
    schedule_conservativeness: float = dataclasses.field(default=1.0, metadata={"positive": True})
    # every request's sampling_params.ignore_eos (benchmarks set it; the running offset is then charged in full)
    ignore_eos: bool = False
    # the model's context length; max_req_len = min(context_len - 1, pool tokens - 1) (TW:568)
    context_len: int | None = dataclasses.field(default=None, metadata={"positive": True})
    # --disable-radix-cache (SGLang's default keeps the radix cache on: model/policies/sglang_radix.py)
    disable_radix_cache: bool = False
    # --enable-priority-scheduling (fields/schedule.py:103): the queue sorted by each request's priority (the
    # workload's Request.priority), higher values first unless --schedule-low-priority-values-first
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    # --disable-priority-preemption (preemption is on by default with priority scheduling, SC:1468-1472), and
    # --priority-scheduling-preemption-threshold: the priority gap a preemption needs to exceed (default 10)
    disable_priority_preemption: bool = False
    priority_scheduling_preemption_threshold: int = 10
    # --disable-overlap-schedule (arg_groups/fields/schedule.py:193-199, default False: SC:500-502 then runs
    # event_loop_overlap, SC:6230-6231); true runs event_loop_normal (SC:2026)
    disable_overlap_schedule: bool = False


@dataclasses.dataclass(frozen=True)
class Ratio:
    """RT NewTokenRatioTracker's constants for a design."""

    init: float
    min: float
    decay: float

    @classmethod
    def of(cls, o: Options) -> "Ratio":
        init = min(INIT_NEW_TOKEN_RATIO * o.schedule_conservativeness, 1.0)
        low = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        return cls(init, low, (init - low) / NEW_TOKEN_RATIO_DECAY_STEPS)


@dataclasses.dataclass(frozen=True)
class Sched:
    """The scheduler's memory between iterations."""

    waiting: tuple[int, ...] = ()         # SC waiting_queue, front first (FCFS: never sorted)
    running: tuple[int, ...] = ()         # running_batch.reqs in batch order (finished ones until the next filter)
    last_extend: Optional[tuple[int, ...]] = None   # last_batch's requests, when it was a prefill batch
    last_chunked: int = -1                # last_batch.chunked_req: its request still chunking after that pass
    chunked: int = -1                     # SC chunked_req
    batch_is_full: bool = False           # running_batch.batch_is_full
    # running_batch.is_prefill_only (SB:2702, 3987): every request of the batch has max_new_tokens 0, so it is not
    # decoded (SC:3997). Only the overlap loop merges such requests (unfinished until their result lands)
    prefill_only: bool = False
    # new_token_ratio_tracker.current, the engine's float kept as its IEEE-754 bits (`float_bits`), so that a state
    # holds integers only (ITF traces, schedproof/itf.py); read it as `ratio`
    ratio_bits: int = 0
    to_finish: tuple[int, ...] = ()       # aborted while in flight: ends at its next result (SC abort_request)
    doomed: tuple[int, ...] = ()          # set_finish_with_abort at arrival: a 1-token prompt, ends at its prefill
    # sampling_params.max_new_tokens after the arrival clip, per arrived request (rid, cap) in arrival order. The
    # request keeps the max_new it asked for: a request clipped to 0 still samples the token its prefill ends
    # with (SB update_finish_state checks the length after appending), which is within what it asked for.
    caps: tuple[tuple[int, int], ...] = ()
    # The radix cache (empty with --disable-radix-cache): the tree, and per request holding a request row its
    # locked node and cache_protected_len (the tokens of its row the tree owns) as (rid, node, tokens)
    tree: radix.Tree = radix.Tree()
    holds: tuple[tuple[int, int, int], ...] = ()
    refresh_calls: int = 0                # SP _waiting_prefix_refresh_calls modulo the refresh interval
    # With priority scheduling only (empty otherwise): every live request in order of its last entry into the
    # waiting queue (time_stats.wait_queue_entry_time, set at arrival and at each re-queue), as ranks
    entries: tuple[int, ...] = ()
    # With priority preemption only: what init_next_round_input last left in a live request it reached, as
    # (rid, len(full_untruncated_fill_ids), prefix_len); preempt_to_schedule reads both before this pass reaches
    # the request (SB:1692-1702; the fill ids are refreshed only there, prefix_len is zeroed by reset_for_retract)
    reached: tuple[tuple[int, int, int], ...] = ()
    # the requests this iteration's pass preempted for priority, in the order they were re-queued
    preempted_for_priority: tuple[int, ...] = ()
    # The overlap loop only (always empty with --disable-overlap-schedule): the batch launched last iteration
    # whose result is still queued (SC result_queue[0]), one row per request as (rid, 1 if the forward samples a
    # token for it else 0, its extend_end), and whether it was a prefill batch (model/policies/sglang_overlap.py)
    in_flight: tuple[tuple[int, int, int], ...] = ()
    in_flight_extend: bool = False

    def cap(self, rid: int) -> int:
        return next(c for r, c in self.caps if r == rid)

    def entry_ranks(self) -> dict[int, int]:
        """rid -> its rank in queue-entry order (wait_queue_entry_time), with priority scheduling."""
        return {rid: i for i, rid in enumerate(self.entries)}

    def stale_extend(self, rid: int) -> int:
        """len(req.full_untruncated_fill_ids) - req.prefix_len as the request's last reach left them (0 and 0 for
        a request no pass has reached)."""
        return next((fill - prefix for r, fill, prefix in self.reached if r == rid), 0)

    def queued(self, cfg: EngineConfig, rids) -> "Sched":
        """SC _add_request_to_queue: to the tail of the queue, with a new queue-entry time (a retracted or
        preempted request's reset_for_retract has zeroed its prefix_len)."""
        rids = tuple(rids)
        entries = tuple(x for x in self.entries if x not in rids) + rids if priority_on(cfg) else ()
        reached = tuple((r, fill, 0 if r in rids else prefix) for r, fill, prefix in self.reached)
        return replace(self, waiting=self.waiting + rids, entries=entries, reached=reached)

    @property
    def ratio(self) -> float:
        return bits_float(self.ratio_bits)

    def with_ratio(self, value: float, **changes) -> "Sched":
        return replace(self, ratio_bits=float_bits(value), **changes)


def float_bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def bits_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def max_req_len(cfg: EngineConfig) -> int:
    """TW:568: min(context_len - 1, the pool's tokens - 1)."""
    pool = cfg.num_blocks * cfg.block_size - 1
    ctx = cfg.options.context_len
    return pool if ctx is None else min(ctx - 1, pool)


def max_req_input_len(cfg: EngineConfig) -> int:
    return max_req_len(cfg) - 5            # TW:572


def fill_tokens(s: Sched, r: Request) -> int:
    """len(fill_ids): the prompt and the outputs so far; an input-length abort's prompt is the one token [0]
    (SB set_finish_with_abort)."""
    return (1 if r.rid in s.doomed else r.prompt) + r.generated


def arrival_max_new(cfg: EngineConfig, prompt: int, max_new: int) -> int:
    """SC init_req_max_new_tokens: clip by max_req_len, then by the empty pool (AB max_new_tokens_for_memory)."""
    page = cfg.block_size
    max_new = max(0, min(max_new, max_req_len(cfg) - prompt - 1))
    return max(0, min(max_new, cfg.num_blocks * page - cdiv(prompt, page) * page - page - 1))


# -- the radix cache: what the scheduler and the result processing do with it ----------------------
def radix_on(cfg: EngineConfig) -> bool:
    return not cfg.options.disable_radix_cache


def priority_on(cfg: EngineConfig) -> bool:
    return cfg.options.enable_priority_scheduling


def preempting(cfg: EngineConfig) -> bool:
    """SC init_schedule_policy (1468-1472): `enable_priority_preemption`."""
    return priority_on(cfg) and not cfg.options.disable_priority_preemption


def doomed_at_arrival(cfg: EngineConfig, r: Request) -> bool:
    """Refused at arrival for its length: its prompt became the one token [0] (SB set_finish_with_abort)."""
    return r.prompt >= max_req_input_len(cfg)


def same_tokens(cfg: EngineConfig, state: State) -> radix.Same:
    return radix.same_tokens(state.req, lambda r: doomed_at_arrival(cfg, r))


def held_row(s: Sched, rid: int) -> Optional[tuple[int, int, int]]:
    return next((h for h in s.holds if h[0] == rid), None)


def with_cache_view(cfg: EngineConfig, state: State) -> State:
    """State.prefix_cache as the radix cache's two sizes, in pages: the evictable tokens (no live reference) and
    the protected ones (referenced by the requests holding a row), so SAFE-BLOCKS sees the tree's pages."""
    if not radix_on(cfg):
        return state
    s, page = state.sched, cfg.block_size
    return replace(state, prefix_cache=(PrefixEntry(-1, s.tree.evictable // page, 0),
                                        PrefixEntry(-1, s.tree.protected // page, len(s.holds))))


def evict_to_free(cfg: EngineConfig, state: State, tokens: int) -> State:
    """AB evict_to_free_tokens (mem_cache/common.py evict_from_tree_cache): evict LRU leaves until `tokens` are
    free, or nothing evictable is left."""
    short = tokens - state.free_blocks * cfg.block_size
    if short <= 0 or not radix_on(cfg):
        return state
    tree, freed = radix.evict(state.sched.tree, short)
    return replace(state, free_blocks=state.free_blocks + freed // cfg.block_size,
                   sched=replace(state.sched, tree=tree))


def checkpoint(cfg: EngineConfig, state: State, rid: int, up_to: int) -> State:
    """UR checkpoint_into_tree (unified_radix_cache.py:1164): insert the row's first `up_to` tokens (whole pages),
    free the row's own copies of what the tree already held past cache_protected_len, insert the prompt's pages
    once more where outputs follow them (1260-1283: it splits the node at the prompt's end and re-stamps the
    prompt's path), then move the lock to the insert's last node; cache_protected_len becomes the key's length."""
    if up_to <= 0:
        return state
    s, page, r = state.sched, cfg.block_size, state.req(rid)
    _, node, protected = held_row(s, rid)
    same = same_tokens(cfg, state)
    key = up_to // page * page
    tree, held, last = radix.insert(s.tree, same, page, rid, key)
    prompt_key = (1 if doomed_at_arrival(cfg, r) else r.prompt) // page * page
    if 0 < prompt_key < key:
        tree, _, _ = radix.insert(tree, same, page, rid, prompt_key)
    tree = radix.lock(radix.lock(tree, node, -1), last, +1)
    row = r.blocks + r.shared_blocks
    r = replace(r, shared_blocks=key // page, blocks=row - key // page)
    holds = tuple((rid, last, key) if h[0] == rid else h for h in s.holds)
    return replace(state.with_request(r), free_blocks=state.free_blocks + max(0, held - protected) // page,
                   sched=replace(s, tree=tree, holds=holds))


@register
class Sglang(Policy):
    name = "sglang"
    mirrors = ("SGLang 0.5.23 managers/scheduler.py + schedule_policy.py PrefillAdder (overlap and normal loops, radix "
               "cache on/off)")
    Options = Options
    # --max-prefill-tokens bounds a pass's later admissions only (SP _select_prefill_admission: the first
    # request may exceed it; with chunked prefill off nothing else caps a step's tokens)
    hard_step_budget = False

    def check_config(self, cfg: EngineConfig) -> None:
        if cfg.host_blocks:
            raise ConfigError("engine.host_blocks", "SGLang's host tier (HiCache) is not modelled; use 0")
        if cfg.chunk_unit:
            raise ConfigError("engine.chunk_unit", "SGLang chunks at page boundaries (block_size); leave it 0")
        if cfg.chunked_prefill and cfg.options.chunked_prefill_size % cfg.block_size:
            # arg_groups/validation_hook.py:243-246 (an assert at server start-up)
            raise ConfigError("engine.options.chunked_prefill_size", "must be divisible by page_size (block_size)")
        if max_req_input_len(cfg) <= 0:
            # TW:425 asserts max_req_len > 0; below 6 tokens every prompt is refused
            raise ConfigError("engine.num_blocks", "the pool is too small: max_req_len - 5 must be positive")

    def initial_sched(self, cfg: EngineConfig) -> Sched:
        return Sched().with_ratio(Ratio.of(cfg.options).init)

    def fits_alone(self, cfg: EngineConfig, r: Request) -> bool:
        # what the engine promises: the arrival clip (SC init_req_max_new_tokens) is meant to make every accepted
        # prompt fit the empty pool with its clipped output, so only a prompt the input-length check refuses is
        # outside; where admission still refuses an accepted prompt alone (the ignore_eos clip stall, the page
        # rounding stall: docs/findings/README.md, SGLang), that is the engine breaking its promise, and the
        # properties should count it so
        return 0 < r.prompt < max_req_input_len(cfg)

    def stall_reason(self, cfg: EngineConfig, state: State) -> Optional[str]:
        s = state.sched
        if not isinstance(s, Sched):      # an engine's state (its own view of the scheduler), or none
            return None
        if s.batch_is_full and s.waiting and s.chunked < 0 and not preempting(cfg):   # (preemption clears it)
            return ("running_batch.batch_is_full is set, so no prefill is attempted (scheduler.py:4098) until a "
                    "request leaves the running batch")
        if s.waiting and not s.running and s.chunked < 0 and not s.last_extend and not s.in_flight:
            return self.head_refusal(cfg, state, s.waiting[0])
        return None

    def stall_changes(self, cfg: EngineConfig, state: State) -> list[tuple[dict, str]]:
        """For a head refused on an empty engine: a pool that holds its page-rounded context plus a page, and a
        context length one below the pool, which clips max_new below the memory bound (page 1)."""
        s = state.sched
        if not isinstance(s, Sched) or not s.waiting or s.running or s.chunked >= 0 or s.last_extend:
            return []
        rid, page = s.waiting[0], cfg.block_size
        r = state.req(rid)
        context = fill_tokens(s, r)
        pages = cdiv(context, page) + 1
        out = []
        if pages > cfg.num_blocks:
            out.append(({"engine.num_blocks": pages}, f"a pool of {pages} pages: r{rid}'s page-rounded context "
                                                      f"plus a page"))
        pool = cfg.num_blocks * page
        clipped_at_the_bound = pages <= cfg.num_blocks and cfg.options.ignore_eos
        if clipped_at_the_bound and (cfg.options.context_len is None or cfg.options.context_len > pool - 1):
            out.append(({"engine.options.context_len": pool - 1}, "a context length one below the pool: the arrival "
                                                                  "clip then leaves a token for admission's reserve"))
        return out

    def head_refusal(self, cfg: EngineConfig, state: State, rid: int) -> Optional[str]:
        """Why admission refuses the head of the queue on an engine with nothing running (the pass stops at it)."""
        s, r, page = state.sched, state.req(rid), cfg.block_size
        context = fill_tokens(s, r)
        if not cfg.options.ignore_eos or radix_on(cfg):
            return self.ordinary_refusal(cfg, state, rid, context)
        paged = cdiv(context, page) * page + page
        free, left = state.free_blocks * page, s.cap(rid) - r.generated
        if paged > free:
            return (f"the head of the queue, r{rid}, needs {paged} tokens (its {context}-token context in "
                    f"{page}-token pages, plus a page) and the pool has {free}: admission refuses it every iteration "
                    f"and the FCFS pass stops there (schedule_policy.py add_one_req)")
        if cfg.options.ignore_eos and free - paged - left <= IGNORE_EOS_RESERVE_TOKENS:
            return (f"the head of the queue, r{rid}, is refused on an empty engine: an ignore_eos request needs the "
                    f"{free} free tokens less its {paged}-token input and its {left} tokens still to generate to "
                    f"exceed {IGNORE_EOS_RESERVE_TOKENS} (schedule_policy.py add_one_req_ignore_eos), and they leave "
                    f"{free - paged - left}; the arrival clip let its max_new reach {s.cap(rid)} "
                    f"(allocator/base.py max_new_tokens_for_memory)")
        return None

    def ordinary_refusal(self, cfg: EngineConfig, state: State, rid: int, context: int) -> Optional[str]:
        """add_one_req's check for the head on an empty engine: what it would prefill (past the prefix the tree
        holds), generate and a page, against the free tokens and the tree's evictable ones (its own path pinned)."""
        s, r, page = state.sched, state.req(rid), cfg.block_size
        prefix, evictable = 0, 0
        if radix_on(cfg):
            tree, prefix, last = radix.match_prefix(s.tree, same_tokens(cfg, state), page, rid, context - 1)
            evictable = radix.lock(tree, last, +1).evictable
        max_new = min(max(s.cap(rid) - r.generated, 0), CLIP_MAX_NEW_TOKENS)
        need, have = context - prefix + max_new + page, state.free_blocks * page + evictable
        if need < have:
            return None
        past = f" past the {prefix} its prefix match finds" if prefix else ""
        return (f"the head of the queue, r{rid}, needs {need} tokens ({context - prefix} to prefill{past}, "
                f"{max_new} to generate, a page of {page}) and admission wants fewer than the {have} free"
                f"{' and evictable' if radix_on(cfg) else ''}: it refuses it every iteration and the FCFS pass stops "
                f"there (schedule_policy.py _select_prefill_admission, a strict <)")

    # -- arrival and abort (SC ingest_requests) ----------------------------------------------
    def arrive(self, cfg: EngineConfig, state: State, rids, plan: Plan) -> State:
        s = state.sched
        for rid in rids:
            r = state.req(rid)
            if r.prompt == 0:      # GenerateReqInput refuses it before the scheduler (io_struct.py:490-499)
                state = state.with_request(replace(r, phase=Phase.REJECTED, reason=EMPTY_PROMPT))
                plan.rejected.append(rid)
                continue
            # SC:3238 init_req_max_new_tokens runs before the input-length check (SC:3240, managers/utils.py:272)
            s = replace(s, caps=s.caps + ((rid, arrival_max_new(cfg, r.prompt, r.max_new)),))
            if r.prompt >= max_req_input_len(cfg):
                s = replace(s, doomed=s.doomed + (rid,))
            state = state.with_request(replace(r, phase=Phase.WAITING))
            s = s.queued(cfg, (rid,))
        return replace(state, sched=s)

    def cancel(self, cfg: EngineConfig, state: State, rid: int) -> State:
        """SC abort_request: a queued request leaves the queue; the chunked request is released at the top of
        this iteration (process_pending_chunked_abort); one in the running batch gets `to_finish` and ends at
        its next result."""
        s = state.sched
        if rid in s.waiting:
            state = replace(state, sched=replace(s, waiting=tuple(x for x in s.waiting if x != rid),
                                                 doomed=tuple(x for x in s.doomed if x != rid)))
            return state.with_request(replace(state.req(rid), phase=Phase.CANCELLED))
        if rid == s.chunked:
            state = replace(state, sched=replace(s, chunked=-1))
            return with_cache_view(cfg, super().cancel(cfg, state, rid))
        if rid not in s.to_finish:
            state = replace(state, sched=replace(s, to_finish=s.to_finish + (rid,)))
        return state

    # -- one iteration ------------------------------------------------------------------------
    def schedule(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        return with_cache_view(cfg, _Iteration(self, cfg, state, plan).run())

    loop_knob = "disable_overlap_schedule"

    def loop(self, options: Options) -> str:
        if options.disable_overlap_schedule:
            return "Scheduler.event_loop_normal (not SGLang's default event_loop_overlap: --disable-overlap-schedule)"
        return "Scheduler.event_loop_overlap (SGLang's default: a batch's result is processed the next iteration)"

    def step(self, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
        """event_loop_normal: the shared `Policy.step` (schedule, then `execute` lands the batch at once);
        event_loop_overlap: model/policies/sglang_overlap.py `overlap_step` (the batch lands next iteration)."""
        if cfg.options.disable_overlap_schedule:
            return super().step(cfg, state, env)
        return overlap_step(self, cfg, state, env)

    def execute(self, cfg, state, plan, stops):
        """event_loop_normal: run the batch the iteration chose and process its result in the same iteration
        (SC:2047-2049)."""
        state = launch(cfg, state, plan)
        s = state.sched
        state = replace(state, sched=replace(s, in_flight=(), in_flight_extend=False))
        state, finished, rejected = land(self, cfg, state, s.in_flight, s.in_flight_extend, stops)
        return self.close_step(cfg, state, plan, finished, rejected)

    def close_step(self, cfg, state, plan, finished, rejected):
        state = with_cache_view(cfg, replace(state, step=state.step + 1))
        rec = self.record(state, plan, finished=finished, failed=plan.failed)
        return state, replace(rec, rejected=tuple(plan.rejected) + tuple(rejected))

    def checkpoint_prefill(self, cfg: EngineConfig, state: State, rid: int, end: int) -> State:
        """A prefill that is done goes into the tree up to its extend_end (BRP:393-394 checkpoint_kv_cache), with
        the radix cache on."""
        return checkpoint(cfg, state, rid, end) if radix_on(cfg) else state

    def finish(self, cfg, state, rid):
        state = self.release(cfg, state, rid, keep=True)
        return state.with_request(replace(state.req(rid), phase=Phase.FINISHED))

    def release(self, cfg: EngineConfig, state: State, rid: int, keep: bool = False) -> State:
        """mem_cache/common.py release_kv_cache: with `keep` (checkpoint=True: a finish, or an abort ending at a
        result) the tree first takes the row's committed tokens; then the row's own pages are freed and the lock
        is dropped. Retraction and a chunked request's abort do not keep (checkpoint=False)."""
        held = held_row(state.sched, rid) if radix_on(cfg) else None
        if held is None:
            return super().release(cfg, state, rid)
        if keep:
            state = checkpoint(cfg, state, rid, state.req(rid).computed)   # owned_kv_len = kv_committed_len
        s, r = state.sched, state.req(rid)
        _, node, _ = held_row(s, rid)
        s = replace(s, tree=radix.lock(s.tree, node, -1), holds=tuple(h for h in s.holds if h[0] != rid))
        state = replace(state, free_blocks=state.free_blocks + r.blocks, sched=s)
        return state.with_request(replace(r, blocks=0, shared_blocks=0))


class _Iteration:
    """SC get_next_batch_to_run and what it calls, for one iteration; mutable scratch."""

    def __init__(self, policy: Policy, cfg: EngineConfig, state: State, plan: Plan):
        self.policy, self.cfg, self.o, self.state, self.plan = policy, cfg, cfg.options, state, plan
        self.page = cfg.block_size
        self.s: Sched = state.sched

    def r(self, rid: int) -> Request:
        return self.state.req(rid)

    def done(self, rid: int) -> bool:
        return self.r(rid).phase.terminal     # Req.finished(): a finished_reason is set

    def run(self) -> State:
        live = lambda rid: not self.done(rid)
        self.s = replace(self.s, entries=tuple(filter(live, self.s.entries)), preempted_for_priority=(),
                         reached=tuple(e for e in self.s.reached if live(e[0])))
        self.stash_chunked()
        self.merge_last_batch()
        batch = self.prefill() if self.plan.error is None else None
        ran = bool(batch)
        if batch is None and self.plan.error is None and self.s.running and not self.s.prefill_only:   # SC:3997
            ran = self.decode()
        # the overlap loop calls on_idle only when the last iteration launched nothing either (SC:2118-2123)
        if not ran and self.plan.error is None and not self.s.in_flight:
            self.on_idle()
        self.s = replace(self.s, last_extend=tuple(batch) if batch else None,
                         last_chunked=self.s.chunked if batch else -1)
        return replace(self.state, sched=self.s)

    def on_idle(self) -> None:
        """SC on_idle: the ratio goes back to its initial value only when fully idle (SC is_fully_idle: nothing
        running, chunking or queued). Its other condition, an empty last_batch, always holds here in the normal
        loop: a decode batch is the running batch itself, filtered in place, and a prefill batch's requests were
        merged into the running batch or have finished."""
        s = self.s
        if not s.running and s.chunked < 0 and not s.waiting:
            self.s = s.with_ratio(Ratio.of(self.o).init)

    # -- the radix cache ---------------------------------------------------------------------------
    @property
    def radix(self) -> bool:
        return radix_on(self.cfg)

    def sync(self) -> None:
        """Put the scratch scheduler memory into the state, for the cache helpers that work on a State."""
        self.state = replace(self.state, sched=self.s)

    def after(self, state: State) -> None:
        self.state, self.s = state, state.sched

    def evict_to_free(self, tokens: int) -> None:
        self.sync()
        self.after(evict_to_free(self.cfg, self.state, tokens))

    def match(self, rid: int, length: int) -> tuple[int, int]:
        """UC match_prefix on rid's first `length` context tokens: (matched tokens, last node)."""
        tree, matched, last = radix.match_prefix(self.s.tree, same_tokens(self.cfg, self.state), self.page, rid,
                                                 length)
        self.s = replace(self.s, tree=tree)
        return matched, last

    def stash_chunked(self) -> None:
        """SC get_next_batch_to_run (3911-3919) -> stash_chunked_request: the chunk the last batch ran goes into
        the tree before anything else this iteration (common.py checkpoint_kv_cache)."""
        s = self.s
        if self.radix and s.chunked >= 0 and s.last_extend is not None and s.chunked in s.last_extend:
            self.sync()
            self.after(checkpoint(self.cfg, self.state, s.chunked, self.r(s.chunked).computed))

    def refresh_waiting_prefixes(self) -> None:
        """SP _touch_waiting_prefixes: every 32nd pass, the first 128 queued requests' whole contexts are matched,
        the head last, so that LRU evicts in reverse queue order (only with the cache on: it needs prefix
        sharing)."""
        if not self.radix or not self.s.waiting:
            return
        refresh = self.s.refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        # kept modulo the interval, all the engine reads of it, so that a stalled engine's state repeats
        self.s = replace(self.s, refresh_calls=(self.s.refresh_calls + 1) % WAITING_PREFIX_REFRESH_INTERVAL)
        if refresh:
            for rid in reversed(self.s.waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.match(rid, fill_tokens(self.s, self.r(rid)))

    # -- priority ----------------------------------------------------------------------------------
    def calc_priority(self) -> None:
        """SP calc_priority: with priority scheduling the queue is sorted in place by (priority, queue-entry time)
        (_sort_by_priority_and_fcfs, higher values first unless low values go first); FCFS leaves it. Then the
        waiting-prefix refresh, over the sorted queue."""
        if priority_on(self.cfg):
            sign = 1 if self.o.schedule_low_priority_values_first else -1
            entry = self.s.entry_ranks()
            self.s = replace(self.s, waiting=tuple(sorted(self.s.waiting,
                                                          key=lambda x: (self.r(x).priority * sign, entry[x]))))
        self.refresh_waiting_prefixes()

    def remember_reach(self, rid: int, matched: int) -> None:
        """What init_next_round_input leaves in the request (its fill ids' length, its prefix match), which a
        later pass's preempt_to_schedule reads; kept only where preemption reads it."""
        if preempting(self.cfg):
            rest = tuple(e for e in self.s.reached if e[0] != rid)
            self.s = replace(self.s, reached=rest + ((rid, fill_tokens(self.s, self.r(rid)), matched),))

    def release_req(self, rid: int, remaining: int) -> None:
        """SB release_req, for a decode retraction and a priority preemption alike: release_kv_cache(checkpoint=
        False), evict for the `remaining` requests ("use the freed memory instantly"), reset_for_retract
        (retraction_count + 1, KV recomputed when it is admitted again, outputs kept)."""
        self.release(rid)
        self.evict_to_free(remaining * RETRACT_DECODE_STEPS)
        r = self.r(rid)
        self.state = self.state.with_request(replace(r, phase=Phase.PREEMPTED, computed=0,
                                                     preemptions=r.preemptions + 1))

    def requeue_preempted(self, preempted: list[int]) -> None:
        """SC:4320-4322: the pass's preempted go to the queue's tail after it (`adder.preempt_list`)."""
        if preempted:
            self.s = replace(self.s.queued(self.cfg, preempted), preempted_for_priority=tuple(preempted))
            self.plan.preempted.extend(preempted)

    # -- SC get_next_batch_to_run: the merge and the filter ------------------------------------
    def merge_last_batch(self) -> None:
        s = self.s
        running, full, prefill_only = list(s.running), s.batch_is_full, s.prefill_only
        if s.last_extend is not None:
            keep = [x for x in s.last_extend if not self.done(x) and x != s.last_chunked and x != s.chunked]
            if len(keep) < len(s.last_extend):
                full = False
            # the batch's is_prefill_only, set when it was built from all its requests (SB:2702)
            last_only = all(s.cap(x) == 0 for x in s.last_extend)
            if keep:
                if not running:
                    # running_batch := last_batch, a batch built with the flag off
                    running, full, prefill_only = keep, False, last_only
                else:
                    running += keep               # merge_batch appends
                    prefill_only = prefill_only and last_only
        kept = [x for x in running if not self.done(x)]
        if len(kept) < len(running):
            full = False
        self.s = replace(s, running=tuple(kept), batch_is_full=full, last_extend=None, prefill_only=prefill_only)

    # -- SC _get_new_batch_prefill_raw ----------------------------------------------------------
    def allocatable(self) -> int:
        """SC get_num_allocatable_reqs: the micro-batch cap less the running batch; the request rows left
        (plus those the chunked request holds) are the same number with rows = max_running_requests."""
        return self.cfg.max_batch_size - len(self.s.running)

    def prefill(self) -> Optional[list[int]]:
        s = self.s
        if preempting(self.cfg) or not s.running:
            s = replace(s, batch_is_full=False)                              # SC:4090-4096
        self.s = s
        if (s.batch_is_full or not s.waiting) and s.chunked < 0:             # SC:4098-4101
            return None
        if self.allocatable() <= 0 and s.chunked < 0 and not preempting(self.cfg):   # SC:4121-4126
            self.s = replace(s, batch_is_full=True)
            return None
        self.calc_priority()
        adder = _Adder(self)
        chunked = s.chunked
        if chunked >= 0:
            chunked = adder.add_chunked_req(chunked)
        for rid in self.s.waiting:
            if adder.budget_state() == "OTHER":
                break
            if len(adder.can_run) >= self.allocatable():
                self.s = replace(self.s, batch_is_full=True)
            # once set, every later request of the pass needs a preemption of its own (SC:4234-4238)
            if self.s.batch_is_full and not (preempting(self.cfg) and adder.preempt_to_schedule(rid)):
                break
            if self.radix:     # SB init_next_round_input: match all but the last token (1768-1775)
                adder.prefix[rid] = self.match(rid, fill_tokens(self.s, self.r(rid)) - 1)
            self.remember_reach(rid, adder.prefix.get(rid, (0, radix.ROOT))[0])
            res = adder.add_one_req(rid)
            if res != "CONTINUE":
                if res == "NO_TOKEN":
                    self.s = replace(self.s, batch_is_full=bool(adder.can_run) or bool(self.s.running))
                break
        if not adder.can_run:
            # SC:4307-4312: the preempted are re-queued even though nothing was admitted
            self.s = replace(self.s, chunked=chunked)
            self.requeue_preempted(adder.preempted)
            return None
        admitted = set(adder.can_run)
        if adder.new_chunked >= 0:
            assert chunked < 0, "SC:4318: a new chunked request while one is in flight"
            chunked = adder.new_chunked
        self.s = replace(self.s, waiting=tuple(x for x in self.s.waiting if x not in admitted), chunked=chunked)
        self.requeue_preempted(adder.preempted)
        if not self.allocate_extend(adder):
            return None
        for rid in adder.can_run:
            self.plan.schedule(rid, adder.extend[rid])
        return adder.can_run

    def allocate_extend(self, adder: "_Adder") -> bool:
        """ScheduleBatch.prepare_for_extend: KV for every chunk at once; short of it, alloc_token_slots raises
        "Out of memory" (mem_cache/allocation.py:152), an uncaught RuntimeError that kills the scheduler."""
        need = 0
        for rid in adder.can_run:
            r = self.r(rid)
            need += cdiv(r.computed + adder.extend[rid], self.page) - cdiv(r.computed, self.page)
        # alloc_for_extend evicts first: the extend tokens, and with pages a page more per request
        # (allocation.py alloc_token_slots 152, alloc_paged_token_slots_extend 187-201)
        quota = sum(adder.extend.values()) + (len(adder.can_run) * self.page if self.page > 1 else 0)
        self.evict_to_free(quota)
        if need > self.state.free_blocks:
            self.plan.error, self.plan.error_kind = PREFILL_OOM, "crash"
            return False
        for rid in adder.can_run:
            self.grow_row(rid, self.r(rid).computed + adder.extend[rid])
        return True

    def grow_row(self, rid: int, tokens: int) -> None:
        """The request's row now covers `tokens`: the pages past what it held come from the free pool (the
        tree's pages at the row's start are the tree's, `shared_blocks`)."""
        r = self.r(rid)
        own = cdiv(tokens, self.page) - r.shared_blocks
        self.state = replace(self.state, free_blocks=self.state.free_blocks - (own - r.blocks))
        self.state = self.state.with_request(replace(r, blocks=own))

    # -- SC update_running_batch ----------------------------------------------------------------
    def decode_need(self, rids) -> int:
        """SB check_decode_mem -> new_tokens_required_next_decode: a page for each request whose KV ends on a
        page boundary, in pages."""
        return sum(1 for rid in rids if self.r(rid).computed % self.page == 0)

    def decode_fits(self, rids) -> bool:
        """AB check_decode_capacity: evict until the pages are free, then whether they are."""
        need = self.decode_need(rids)
        self.evict_to_free(need * self.page)
        return self.state.free_blocks >= need

    def finishing_in_flight(self, running: list[int]) -> list[int]:
        """SC _reqs_finishing_inflight (overlap loop only: a batch is queued): the running requests in the queued
        batch whose queued result commits their last output by length (SB next_output_finishes_by_length:
        outputs + 1 >= max_new_tokens, outputs not yet counting that result)."""
        queued = {row[0] for row in self.s.in_flight}
        return [rid for rid in running if rid in queued and self.r(rid).generated + 1 >= self.s.cap(rid)]

    def decode(self) -> bool:
        """SC update_running_batch. Under overlap the requests finishing by length in the queued result leave the
        running batch for good first (SC:4463-4467); if that empties it, or the rest does not fit while some are
        finishing, nothing is decoded this iteration: no retraction, no ratio decay (SC:4469-4474)."""
        running = list(self.s.running)
        initial = len(running)
        finishing = self.finishing_in_flight(running)
        if finishing:
            running = [rid for rid in running if rid not in finishing]
            self.s = replace(self.s, running=tuple(running))
            if not running:
                self.s = replace(self.s, batch_is_full=False)
                return False
        fits = self.decode_fits(running)
        if not fits and finishing:
            self.s = replace(self.s, batch_is_full=False)
            return False
        if not fits:
            running = self.retract(running)
        else:
            ratio = Ratio.of(self.o)
            self.s = self.s.with_ratio(max(self.s.ratio - ratio.decay, ratio.min))   # RT decay_step
        if len(running) < initial:
            self.s = replace(self.s, batch_is_full=False)
        self.s = replace(self.s, running=tuple(running))
        if not running:
            return False
        # prepare_for_decode -> alloc_for_decode evicts for a token per request, a page per request with pages
        # (allocation.py:640, 584-585), then allocates one token each
        self.evict_to_free(len(running) * self.page)
        for rid in running:
            self.grow_row(rid, self.r(rid).computed + 1)
            self.plan.schedule(rid, 1)
        return True

    def release(self, rid: int) -> None:
        """release_kv_cache(checkpoint=False) on the iteration's scratch state."""
        self.sync()
        self.after(self.policy.release(self.cfg, self.state, rid))

    def retract(self, running: list[int]) -> list[int]:
        """SB retract_decode: keep-most-preferred first by (outputs desc, prompt asc), ties in batch order;
        retract from the tail, at least one, until the rest fit or one is left; abort that one if even it does
        not fit. The batch keeps the preference order (filter_batch(keep_indices)); the ratio becomes the
        estimate over what is kept (RT estimate_new_token_ratio_after_retract: 0 when nothing is)."""
        order = sorted(running, key=lambda rid: (self.r(rid).generated, -self.r(rid).prompt), reverse=True)
        first, retracted = True, []
        while first or not self.decode_fits(order):
            if len(order) == 1:
                break
            first = False
            rid = order.pop()
            self.release_req(rid, len(order))
            retracted.append(rid)
        if len(order) <= 1 and not self.decode_fits(order):
            rid = order.pop()
            self.release(rid)
            self.state = self.state.with_request(replace(self.r(rid), phase=Phase.FAILED, reason=LAST_REQUEST_OOM))
            self.plan.failed.append(rid)
        kept = [self.r(rid) for rid in order]
        est = (sum(r.generated for r in kept) + RETRACT_DECODE_STEPS * len(kept)) / (
            sum(self.s.cap(r.rid) for r in kept) + 1)
        self.s = self.s.with_ratio(min(1.0, est)).queued(self.cfg, retracted)       # SC: the tail
        self.plan.preempted.extend(retracted)
        return order


class _Adder:
    """SP PrefillAdder with PB PrefillBudget, for one prefill pass. With the radix cache off nothing is evictable
    and every prefix match is empty, so a request's extend is its whole context."""

    def __init__(self, it: _Iteration):
        self.it, self.page = it, it.page
        o, cfg = it.o, it.cfg
        self.ignore_eos = o.ignore_eos
        self.ratio = it.s.ratio
        # SP:669-676: every running request's offset
        self.total_offset = sum(self.running_offset(x) for x in it.s.running)
        self.current_offset = 0
        self.rem_input = cfg.max_num_tokens
        self.rem_chunk = o.chunked_prefill_size if cfg.chunked_prefill else None
        self.can_run: list[int] = []
        self.extend: dict[int, int] = {}
        self.new_chunked = -1
        self.req_states: Optional[list[tuple[int, int]]] = None
        self.prefix: dict[int, tuple[int, int]] = {}      # rid -> (prefix_len, last_node) of this pass's match
        self.pinned = radix.ROOT                          # SP _lock_node: the candidate's path, for its check
        self.preempted: list[int] = []                    # SP preempt_list

    def running_offset(self, rid: int) -> float:
        """SP _get_running_request_total_token_offset: the tokens still to generate, clipped, at the ratio (1.0
        with ignore_eos)."""
        ratio = 1.0 if self.it.o.ignore_eos else self.ratio
        return min(self.it.s.cap(rid) - self.it.r(rid).generated, CLIP_MAX_NEW_TOKENS) * ratio

    # -- PB --------------------------------------------------------------------------------------
    def ceil_page(self, tokens: int) -> int:
        return cdiv(tokens, self.page) * self.page

    @property
    def available(self) -> int:
        """PB _available_and_evictable: the free tokens and the tree's unlocked ones, read live."""
        tree = self.it.s.tree
        if self.pinned != radix.ROOT:
            tree = radix.lock(tree, self.pinned, +1)
        return self.it.state.free_blocks * self.page + tree.evictable

    @property
    def rem_total(self):
        return self.available - self.total_offset

    @property
    def rem_current(self):
        return self.available - self.current_offset

    def budget_state(self) -> str:
        if not (self.rem_total > 0 and self.rem_current > 0):
            return "NO_TOKEN"
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return "OTHER"
        return "CONTINUE"

    def take(self, rid: int, extend: int, max_new: int) -> None:
        """The admission's commit and SP _update_prefill_budget -> PB reserve: the KV budgets take the
        page-ceiled extend plus a page (and max_new in the total), the compute budgets the page-ceiled extend."""
        self.can_run.append(rid)
        self.extend[rid] = extend
        paged = self.ceil_page(extend)
        self.total_offset += paged + self.page + max_new
        self.current_offset += paged + self.page
        self.rem_input -= paged
        if self.rem_chunk is not None:
            self.rem_chunk -= paged

    def context(self, rid: int) -> int:
        """len(fill_ids): the prompt and the outputs so far (1 token for a request aborted at arrival)."""
        r = self.it.r(rid)
        return fill_tokens(self.it.s, r)

    # -- SP add_chunked_req -------------------------------------------------------------------------
    def add_chunked_req(self, rid: int) -> int:
        """The continuation goes first; its chunk is min(rem_chunk, remaining_total), or a full chunk when no
        memory is left ("continuation must make progress", PB available_chunk_tokens). Returns the request
        while it is still chunking, else -1."""
        rem = min(self.rem_chunk, int(self.rem_total))
        if rem <= 0:
            rem = self.rem_chunk
        r = self.it.r(rid)
        cand = self.context(rid) - r.computed             # prefix_len: its chunks so far
        truncated = cand > rem
        self.take(rid, min(cand, rem), 0 if truncated else min(self.it.s.cap(rid), CLIP_MAX_NEW_TOKENS))
        return rid if truncated else -1

    # -- SP preempt_to_schedule -----------------------------------------------------------------------
    def preempt_to_schedule(self, rid: int) -> bool:
        """Preempt running requests for `rid` when each is more than the threshold below it in priority, taken
        lowest priority first, then newest queue entry first, until their offsets cover what `rid` would be
        charged beyond the budget left. The charge reads the fill ids and prefix_len as `rid`'s last reach left
        them, since this pass has not matched it yet (both 0 for a request no pass has reached). The chosen are
        released in running-batch order and their offsets leave the budget."""
        it, o = self.it, self.it.o
        sign = 1 if o.schedule_low_priority_values_first else -1
        entry = it.s.entry_ranks()
        prio = lambda x: it.r(x).priority
        candidates = sorted(it.s.running, key=lambda x: (prio(x) * -sign, -entry[x]))
        need = (it.s.stale_extend(rid) + min(it.s.cap(rid), CLIP_MAX_NEW_TOKENS)
                + 0 - self.rem_total)      # + _request_slot_reserve_for_req: 0 for a plain allocator (AB:79-86)
        chosen = []
        for x in candidates:
            if (prio(rid) - prio(x)) * -sign <= o.priority_scheduling_preemption_threshold:
                break
            chosen.append(x)
            need -= self.running_offset(x)
            if need <= 0:
                break
        if not chosen or need > 0:
            return False
        running, released = list(it.s.running), 0
        for x in running:
            if x in chosen:
                self.total_offset -= self.running_offset(x)
                released += 1
                it.release_req(x, len(running) - released)
        it.s = replace(it.s, running=tuple(x for x in running if x not in chosen))
        self.preempted += [x for x in running if x in chosen]
        return True

    # -- SP add_one_req ------------------------------------------------------------------------------
    def add_one_req(self, rid: int) -> str:
        if self.ignore_eos and not self.it.radix:
            return self.add_one_req_ignore_eos(rid)       # SP:1401: ignore_eos with the tree cache disabled
        prefix, last = self.prefix.get(rid, (0, radix.ROOT))
        self.pinned = last                                # SP:1431 `with self._lock_node(req.last_node)`
        verdict = self.select(rid, prefix)
        self.pinned = radix.ROOT
        if verdict is not None:
            return verdict
        if self.it.radix:                                 # SP _commit_prefill_admission: req.lock = lock(last_node)
            self.it.s = replace(self.it.s, tree=radix.lock(self.it.s.tree, last, +1),
                                holds=self.it.s.holds + ((rid, last, prefix),))
            r = self.it.r(rid)
            self.it.state = self.it.state.with_request(replace(r, computed=prefix, shared_blocks=prefix // self.page,
                                                               blocks=0))
        return self.budget_state()

    def select(self, rid: int, prefix: int) -> Optional[str]:
        """SP _select_prefill_admission and the commit's budget update; a verdict when refused."""
        r = self.it.r(rid)
        cand = self.context(rid) - prefix
        cap = self.it.s.cap(rid)
        max_new = min(max(cap - r.generated, 0), CLIP_MAX_NEW_TOKENS)
        if not cand + max_new + self.page < self.rem_total:                       # PB check_prefill: strict <
            return "NO_TOKEN"
        if self.rem_chunk is None and self.can_run and self.ceil_page(cand) >= self.rem_input:
            return "OTHER"                                # the first request may exceed max_prefill_tokens
        extend, charge = cand, min(cap, CLIP_MAX_NEW_TOKENS)                     # the commit: not less outputs
        if self.rem_chunk is not None and self.ceil_page(cand) > self.rem_chunk:
            # a chunk whose end is page-aligned (the prefix is whole pages)
            extend = self.rem_chunk // self.page * self.page
            if extend <= 0:
                return "OTHER"
            self.new_chunked, charge = rid, 0
        self.take(rid, extend, charge)
        return None

    def add_one_req_ignore_eos(self, rid: int) -> str:
        """SP add_one_req_ignore_eos: the input must fit what is left now; then a simulation of the batch
        finishing in order of tokens left (unclipped) must keep a token per request at every point."""
        r = self.it.r(rid)
        cand = self.context(rid)
        paged_input = self.ceil_page(cand) + self.page
        if not paged_input <= min(self.rem_current, self.rem_total):
            return "NO_TOKEN"
        if self.req_states is None:
            self.req_states = []
            for x in (rid, *self.it.s.running, *self.can_run):
                self.add_req_state(x)
            self.req_states.sort(key=lambda st: st[0])
        else:
            self.add_req_state(rid, insert_sort=True)
        cur, freed = self.rem_current - paged_input, 0
        for i, (left, occupied) in enumerate(self.req_states):
            bs = len(self.req_states) - i
            if cur + freed - left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return "NO_TOKEN"
            freed += occupied
        if self.rem_chunk is None or cand <= self.rem_chunk:
            self.take(rid, cand, min(self.it.s.cap(rid), CLIP_MAX_NEW_TOKENS))
        else:
            if self.rem_chunk <= 0:
                return "OTHER"
            self.new_chunked = rid
            self.take(rid, self.rem_chunk, 0)                # not page-aligned on this path
        return self.budget_state()

    def add_req_state(self, rid: int, insert_sort: bool = False) -> None:
        """SP add_req_state: (tokens left, tokens occupied); none for a request with nothing left. The
        insertion keeps SGLang's loop: past every element it lands before the last one."""
        r = self.it.r(rid)
        left = self.it.s.cap(rid) - r.generated                # max_new x 1.0 (ignore_eos) - outputs
        if left <= 0:
            return
        entry = (left, fill_tokens(self.it.s, r))
        if not insert_sort:
            self.req_states.append(entry)
            return
        i = 0
        for i in range(len(self.req_states)):
            if left <= self.req_states[i][0]:
                break
        self.req_states.insert(i, entry)
