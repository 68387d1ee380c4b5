"""TensorRT-LLM `KVCacheV2Scheduler` (PyTorch backend, KV cache manager V2), in the executor's overlap loop (the
default) or its non-overlap loop (`disable_overlap_scheduler`).

Mirrors NVIDIA/TensorRT-LLM, the 1.4.0rc line (the field report ran 1.4.0rc3):
  S  = tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py @ 00746ef9
  M  = tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py @ 00439672
  R  = tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py @ 00f6bd61
  E  = tensorrt_llm/_torch/pyexecutor/py_executor.py (recompute-pause reset, unbounded cap; @ 00043967
       `_terminate_recompute_paused_requests` / `_pause_recompute_paused_requests`, and the two loops:
       model/policies/trtllm_overlap.py)
  ME = tensorrt_llm/_torch/pyexecutor/model_engine.py `_prepare_tp_inputs` (the forward-pass token
       assert shared with V1; what a request forwards: resource_manager.py `_request_forward_tokens`)
Each rule below names the function it mirrors. The fixes A, B and E of issue #21826 are not
in any stored source; they follow the field report (`fix_*` options) and are marked [inferred].

One step is one iteration of the executor's loop: E `_executor_loop` with options.disable_overlap_scheduler (the
batch's tokens applied and its finished requests freed in the same iteration), or `_executor_loop_overlap`, the
engine's default (batch k scheduled before batch k-1's tokens are applied; GENERATION_TO_COMPLETE requests are not
scheduled, not recompute-paused and not counted by the detector): model/policies/trtllm_overlap.py, rule by rule.

One pass, as in S `KVCacheV2Scheduler.schedule_request`:
  # generation   -- list order; contexts are only collected; a STOP ends the phase
  # contexts     -- FCFS over the collected ones; non-chunked STOP blocks everything behind
  # detector     -- 1000 consecutive passes without progress raise the deadlock error
  # forward      -- ME: the batch's tokens (drafts included) must not exceed max_num_tokens
Pages are allocated inline by the scheduler (no separate capacity pass in V2).

Known divergences (all deliberate, all small):
- the overlap loop's own (model/policies/trtllm_overlap.py); beam width 1,
  no LoRA/PEFT, no disagg, no multimodal, no KV connector, no block reuse;
- every arrived request is fetched into the active list at once (the executor's fetch cap
  `max_num_active_requests` is not modelled);
- the CUDA-graph padding dummy request, which keeps 1 page for the executor's lifetime once
  a padded generation-only batch has run, is not modelled (the pool is 1 page larger than
  the engine's from that point; see docs/fidelity.md);
- drafts are charged and allocated but all rejected at execution; every context's last chunk
  carries draft_len drafts, where the engine stamps placeholder drafts only on generation
  requests (py_executor `_prepare_draft_requests`): a context has drafts only if its request
  brings its own, so the model's context drafts are a conservative reading.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from .. import limits
from ..config import ConfigError, EngineConfig, cdiv, non_negative
from ..policy import Env, Plan, Policy, register, replace
from ..state import Phase, Request, State, StepRecord
from .trtllm_overlap import loop_name, overlap_step, to_complete

DEADLOCK_STALL_ITERS = 1000   # S `_DEADLOCK_STALL_ITERS`
GIB = 1 << 30


def gpu_tier_granularity(quota: int) -> int:
    """R `CacheLevelManager.cache_tier_granularity` (_storage_manager.py @00f6bd61): 2 MiB shifted
    left by floor(log2(quota / 1 GiB)), clamped to 0..4, on the unrounded quota: 2 MiB below
    2 GiB, 4 MiB from 2 GiB, ... 32 MiB from 16 GiB (integer form of the engine's float log2,
    exact at the powers of two)."""
    shift = (quota // GIB).bit_length() - 1 if quota >= GIB else 0
    return (2 << 20) << min(4, max(0, shift))


class Act(enum.Enum):
    SCHED = "scheduled"
    SKIP = "skip"
    STOP = "stop"


@dataclasses.dataclass(frozen=True)
class Options:
    kv_cache_max_tokens: int | None = dataclasses.field(default=None, metadata={"positive": True})
    # bytes of KV per token over all layers; the default is Qwen2.5-0.5B in bf16 (the field
    # report's model): 24 layers x (K,V) x 2 KV heads x 64 head dim x 2 bytes
    kv_bytes_per_token: int = dataclasses.field(default=12288, metadata={"positive": True, "limit": limits.BYTES_PER_TOKEN})
    max_util_for_resume: float = dataclasses.field(default=0.95, metadata={"positive": True, "max": 1.0})
    enable_recompute_pause: bool = True
    draft_len: int = non_negative(0)
    stall_limit: int = dataclasses.field(default=DEADLOCK_STALL_ITERS, metadata={"positive": True})
    fix_replay_fit: bool = False            # fix A [inferred]
    fix_worst_case_admission: bool = False  # fix B [inferred]
    # B* [schedproof's repair, not an engine change]: fix B reserves the worst case of every admitted
    # request, not only of those whose replay can outgrow the budget. B alone is refuted for mixed
    # workloads (proofs/claims.py `v2-ab-mixed`); A+B* is proved for any number of requests that each
    # fit alone (`v2-ab-reserve-all`); what it costs: bench/repair_cost.py
    reserve_every_worst_case: bool = False
    fix_error_message: bool = False         # fix E [inferred]
    # TorchLlmArgs.disable_overlap_scheduler (llmapi/llm_args.py, default False) -> E `PyExecutor.__init__`: at
    # pp_size 1 the executor runs `_executor_loop` when true, `_executor_loop_overlap` (the default) when false
    disable_overlap_scheduler: bool = False


@dataclasses.dataclass(frozen=True)
class Sched:
    stalls: int = 0   # S `_detect_deadlock`: consecutive passes without progress, kept on the scheduler
    # the overlap loop only (always empty with disable_overlap_scheduler): batch k-1's requests that sample a
    # token, in batch order (model/policies/trtllm_overlap.py)
    in_flight: tuple[int, ...] = ()


def pool_pages_from_max_tokens(max_tokens: int, block_size: int, bytes_per_token: int, max_util_for_resume: float) -> int:
    """GPU pages KV cache manager V2 ends up with for `kv_cache_config.max_tokens`.

    1. M `KVCacheManagerV2.__init__`: quota = ceil(_get_quota_from_max_tokens(max_tokens) / max_util_for_resume):
       the knob is inflated by 1/max_util_for_resume so that about max_tokens stay resumable;
    2. M `_get_quota_from_max_tokens`: max_tokens x bytes per token (full attention only);
    3. R `StorageManager._compute_slot_count_for_level`: the GPU quota is rounded up to the tier
       granularity, which grows with the quota (`gpu_tier_granularity`);
    4. R / `_core.py` `ratio_to_slot_count_list`: one pool of slots, each a page for all layers:
       floor(quota / (block_size x bytes per token)).
    For the field report (8192 tokens, 32-token pages, 12,288 B/token, 0.95) this is 272 pages,
    not 8192 / 32 = 256: the victim is then paused at about 274 generated tokens, past the
    148 after which its replay no longer fits max_num_tokens = 2048.
    """
    quota = math.ceil(max_tokens * bytes_per_token / max_util_for_resume)
    granularity = gpu_tier_granularity(quota)
    quota = cdiv(quota, granularity) * granularity
    return quota // (block_size * bytes_per_token)


class Budget:
    """S `BudgetTracker`, created fresh every pass."""

    def __init__(self, max_tokens: int, max_requests: int):
        self.max_tokens, self.max_requests = max_tokens, max_requests
        self.tokens = self.requests = 0

    def can_fit(self, tokens: int) -> bool:
        return self.tokens + tokens <= self.max_tokens

    @property
    def requests_full(self) -> bool:
        return self.requests >= self.max_requests

    def commit(self, tokens: int) -> None:
        self.tokens += tokens
        self.requests += 1


@register
class TrtllmV2(Policy):
    name = "trtllm_v2"
    mirrors = "TensorRT-LLM 1.4.0rc (main @00746ef9) scheduler_v2.py KVCacheV2Scheduler"
    Options = Options
    pool_option = "kv_cache_max_tokens"
    pool_inputs = ("kv_cache_max_tokens", "kv_bytes_per_token")   # max_util_for_resume: the resume gate reads it too

    def gpu_blocks_from_option(self, block_size, options, engine):
        return pool_pages_from_max_tokens(options.kv_cache_max_tokens, block_size,
                                          options.kv_bytes_per_token, options.max_util_for_resume)

    def initial_sched(self, cfg):
        return Sched()

    loop_knob = "disable_overlap_scheduler"

    def loop(self, options: Options) -> str:
        return loop_name(options)

    def step(self, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
        """E `_executor_loop`: the shared `Policy.step`; `_executor_loop_overlap`: trtllm_overlap.overlap_step."""
        if cfg.options.disable_overlap_scheduler:
            return super().step(cfg, state, env)
        return overlap_step(self, cfg, state, env)

    def paused_token_landed(self, cfg: EngineConfig, state: State, rid: int, done: bool) -> tuple[State, bool]:
        """The overlap loop: a victim recompute-paused (its KV freed, E `_terminate_recompute_paused_requests`) this
        iteration whose token of the last batch has just been appended. E `_pause_recompute_paused_requests` resets
        it only if it is not finished: one finished by that token ends (its KV is already freed); otherwise it
        replays prompt + every generated token, that one included. Returns the state and whether it ended."""
        if done:
            return self.finish(cfg, state, rid), True
        return state, False

    def check_config(self, cfg: EngineConfig) -> None:
        if cfg.host_blocks and cfg.options.fix_worst_case_admission:
            # Fix B only acts when there is no tier below the GPU; saying so beats ignoring it.
            raise ConfigError("engine.options.fix_worst_case_admission",
                              "only applies with host_blocks = 0 (no cache tier below the GPU)")
        if cfg.options.reserve_every_worst_case and not cfg.options.fix_worst_case_admission:
            raise ConfigError("engine.options.reserve_every_worst_case",
                              "widens fix B, so it needs fix_worst_case_admission = true")

    # ---------------------------------------------------------------------------------
    def schedule(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        return _Pass(cfg, state, plan).run()


class _Pass:
    """One call of S `schedule_request`; mutable scratch, discarded after the pass.

    `inflight` is the executor's `inflight_req_ids` (S `_schedule_loop`'s filter, `_is_evictable`,
    `_is_recompute_pause_candidate`, `_detect_deadlock`): empty in both loops at pp_size 1
    (model/policies/trtllm_overlap.py, rule 1); the upstream tests pass one."""

    def __init__(self, cfg: EngineConfig, state: State, plan: Plan, inflight: frozenset = frozenset()):
        self.cfg, self.o, self.state, self.plan = cfg, cfg.options, state, plan
        self.inflight = inflight
        self.L = [r.rid for r in state.requests if r.phase.unfinished]   # arrival order
        self.budget = Budget(cfg.max_num_tokens, cfg.max_batch_size)
        self.can_evict = cfg.host_blocks > 0   # M: can_evict = len(cache_tiers) > 1
        self.end = len(self.L)
        self.frontier = len(self.L)            # S recompute_pause_state.frontier
        self.victims: set[int] = set()         # list indices paused this pass
        self.evicted: list[int] = []           # rids suspended this pass
        self.paused: list[int] = []            # rids recompute-paused this pass
        self.gen_s: list[int] = []
        self.ctx_s: list[int] = []
        self.preempted_ids: set[int] = set()

    def r(self, rid: int) -> Request:
        return self.state.req(rid)

    def put(self, r: Request) -> None:
        self.state = self.state.with_request(r)

    # -- pass structure ----------------------------------------------------------------
    def run(self) -> State:
        pending = self.generation_phase()
        self.context_phase(pending)
        self.detect_deadlock(pending)
        if self.plan.error is None:
            self.check_forward_tokens()
        return self.state

    def generation_phase(self) -> list[int]:
        """S `schedule_request`, first loop: generation requests in list order."""
        pending = []
        i = 0
        while i < self.end:
            rid = self.L[i]
            if i in self.victims or rid in self.inflight:
                i += 1
                continue
            if self.budget.requests_full:
                break   # also stops collecting contexts behind i
            if to_complete(self.state, self.r(rid)):
                i += 1   # S: outside the schedulable range [CONTEXT_INIT, GENERATION_TO_COMPLETE), no budget
                continue
            if self.r(rid).phase != Phase.DECODING:
                pending.append(rid)
                i += 1
                continue
            act = self.try_generation(i)
            if act is Act.STOP:
                break
            self.gen_s.append(rid)
            self.plan.schedule(rid, 1, self.o.draft_len)
            self.budget.commit(1 + self.o.draft_len)
            i += 1
        return pending

    def context_phase(self, pending: list[int]) -> None:
        """S `schedule_request`, second loop: the collected contexts, FCFS."""
        for rid in pending:
            if self.budget.requests_full:
                break
            if rid in self.preempted_ids:
                continue
            r = self.r(rid)
            if self.cfg.chunked_prefill and not self.chunk_budget_left():
                continue
            first_chunk = r.computed == 0
            act, tokens = self.try_context(rid)
            if first_chunk and act is not Act.SCHED:
                # S `_try_schedule_context`: drop the partially created cache, rewind the cursor
                self.release(rid)
            if act is Act.STOP:
                break
            if act is Act.SKIP:
                continue
            self.ctx_s.append(rid)
            draft = self.o.draft_len if tokens == self.r(rid).remaining_context else 0
            self.plan.schedule(rid, tokens, draft)
            self.budget.commit(tokens + draft)

    # -- generation: S `_try_schedule_generation` ---------------------------------------
    def try_generation(self, i: int) -> Act:
        rid = self.L[i]
        if not self.budget.can_fit(1 + self.o.draft_len):
            return Act.STOP
        ok = self.allocate_generation(rid)
        if not ok:
            ok = self.evict_for_generation(i)
        if not ok and self.o.enable_recompute_pause:
            ok = self.recompute_pause_for_generation(i)
        if ok:
            return Act.SCHED
        r = self.r(rid)
        if r.blocks and not r.suspended:
            self.suspend(rid)   # self-eviction: counts as progress for the detector
        return Act.STOP

    def allocate_generation(self, rid: int) -> bool:
        """M `try_allocate_generation`: resume if suspended (may be refused), then grow the
        capacity by exactly 1 + draft tokens relative to the current capacity."""
        r = self.r(rid)
        if r.suspended and not self.resume(rid):
            return False
        r = self.r(rid)
        need = self.cfg.blocks_for(r.computed + 1 + self.o.draft_len) - r.blocks
        return self.grow(rid, need)

    def evict_for_generation(self, i: int) -> bool:
        """S `_try_evict_for_gen`: suspend later started requests with active KV, newest first,
        retrying after each. Runs even with no tier below the GPU, where suspending frees no
        page (R `is_evictable`: held pages on the last level stay put)."""
        while self.end > i:
            j = self.last_index(range(i + 1, self.end), self.evictable)
            if j is None:
                return False
            self.suspend(self.L[j])
            self.end = j
            if self.allocate_generation(self.L[i]):
                return True
        return False

    def recompute_pause_for_generation(self, i: int) -> bool:
        """S `_try_recompute_pause_for_gen`: destructive victims, newest first, after i."""
        while True:
            j = self.last_index(
                range(i + 1, self.frontier),
                lambda rid, k: k not in self.victims and self.rp_candidate(rid)
                and (self.can_evict or rid not in self.evicted))
            if j is None and self.can_evict:
                promoted = next((rid for rid in self.evicted if self.rp_candidate(rid)), None)
                j = self.L.index(promoted) if promoted is not None else None
            if j is None:
                return False
            self.recompute_pause(self.L[j])
            self.victims.add(j)
            self.frontier = min(self.frontier, j)
            if self.allocate_generation(self.L[i]):
                return True
            if self.can_evict and self.evict_for_generation(i):
                return True

    def rp_candidate(self, rid: int) -> bool:
        """S `_is_recompute_pause_candidate`: started, not in flight, not GENERATION_TO_COMPLETE. Fix A
        [inferred] adds: its replay (prompt + generated, the unbounded cap of E) still fits max_num_tokens."""
        r = self.r(rid)
        if not r.started or rid in self.inflight or to_complete(self.state, r):
            return False
        if self.o.fix_replay_fit and not self.cfg.chunked_prefill:
            return r.context_len + self.o.draft_len <= self.cfg.max_num_tokens
        return True

    def evictable(self, rid: int, _k: int) -> bool:
        """S `_is_evictable`: started (GENERATION_TO_COMPLETE included), not in flight, KV active on the GPU."""
        r = self.r(rid)
        return r.started and r.blocks > 0 and not r.suspended and rid not in self.inflight

    def last_index(self, indices, pred):
        for k in reversed(indices):
            if pred(self.L[k], k):
                return k
        return None

    # -- contexts: S `_try_schedule_context_full` / `_chunked` ---------------------------
    def try_context(self, rid: int) -> tuple[Act, int]:
        if self.cfg.chunked_prefill:
            return self.try_context_chunked(rid)
        r = self.r(rid)
        if not self.prepare_context(rid):
            return Act.STOP, 0
        remaining = r.remaining_context
        if not self.budget.can_fit(remaining + self.o.draft_len):
            return Act.STOP, 0   # the head-of-line STOP of #21826 when the replay outgrew the budget
        if not self.admissible_worst_case(rid):
            return Act.STOP, 0
        if not self.resize_context(rid, remaining + self.o.draft_len):
            return (Act.STOP if self.preempt_for_pages(rid) else Act.SKIP), 0
        return Act.SCHED, remaining

    def try_context_chunked(self, rid: int) -> tuple[Act, int]:
        r = self.r(rid)
        left = self.cfg.max_num_tokens - self.budget.tokens
        if not self.prepare_context(rid):
            return Act.SKIP, 0
        remaining = r.remaining_context
        chunk = min(left, remaining, self.cfg.max_num_tokens)
        if chunk < remaining:
            unit = self.unit
            chunk = chunk // unit * unit
        if chunk <= 0:
            return Act.SKIP, 0
        if r.computed == 0 and not self.admissible_worst_case(rid):
            return Act.SKIP, 0
        last = chunk == remaining
        if not self.resize_context(rid, chunk + (self.o.draft_len if last else 0)):
            return (Act.STOP if self.preempt_for_pages(rid) else Act.SKIP), 0
        return Act.SCHED, chunk

    @property
    def unit(self) -> int:
        return self.cfg.chunk_unit or self.cfg.block_size

    def chunk_budget_left(self) -> bool:
        left = self.cfg.max_num_tokens - self.budget.tokens
        return left > 0 and left >= self.unit

    def prepare_context(self, rid: int) -> bool:
        """M `prepare_context_cache`: a new cache starts suspended and is resumed through
        `_resume_and_restore`, so admission passes the same utilisation gate as a resume."""
        r = self.r(rid)
        if r.blocks == 0 or r.suspended:
            return self.resume(rid)
        return True

    def resize_context(self, rid: int, tokens: int) -> bool:
        """M `resize_context`: capacity = max(capacity, cursor + tokens); no page for the
        first generated token (it is added by the first generation step)."""
        r = self.r(rid)
        return self.grow(rid, self.cfg.blocks_for(r.computed + tokens) - r.blocks)

    def admissible_worst_case(self, rid: int) -> bool:
        """Fix B [inferred from the field report]: with no tier below the GPU, a context that
        could outgrow its replay (prompt + max_new past max_num_tokens) is admitted only if the
        worst-case pages of every such request plus the current pages of the others fit."""
        if not self.o.fix_worst_case_admission or self.can_evict or self.cfg.chunked_prefill:
            return True
        r = self.r(rid)
        if r.computed > 0 or not self.reserved(r):
            return True
        held = 0
        for other in self.state.requests:
            if other.rid == rid or not other.phase.unfinished or (other.blocks == 0 and not other.started):
                continue
            held += self.worst_pages(other) if self.reserved(other) else other.blocks
        return held + self.worst_pages(r) <= self.cfg.num_blocks

    def reserved(self, r: Request) -> bool:
        """Whose worst case fix B counts: those that can outgrow their replay; every request with B*."""
        return self.o.reserve_every_worst_case or self.outgrows(r)

    def outgrows(self, r: Request) -> bool:
        return r.prompt + r.max_new + self.o.draft_len > self.cfg.max_num_tokens

    def worst_pages(self, r: Request) -> int:
        return self.cfg.blocks_for(r.prompt + r.max_new + self.o.draft_len)

    def preempt_for_pages(self, rid: int) -> bool:
        """S `_try_preempt_for_pages`: only with no tier below the GPU; scans the whole list
        newest first; protects this pass's scheduled requests and the requester; the victim
        must be a recompute-pause candidate with active KV; at most one per call."""
        if self.can_evict or not self.o.enable_recompute_pause:
            return False
        protected = set(self.gen_s) | set(self.ctx_s) | {rid}
        for victim in reversed(self.L):
            v = self.r(victim)
            if victim in protected or not self.rp_candidate(victim) or v.suspended or v.blocks == 0:
                continue
            self.recompute_pause(victim)
            self.preempted_ids.add(victim)
            return True
        return False

    # -- KV operations -------------------------------------------------------------------
    def utilisation_allows_resume(self) -> bool:
        """R `get_utilization` and `_KVCache.resume`: refused when unavailable / total pages
        exceeds max_util_for_resume. Suspended pages on the last tier are unavailable."""
        total = self.cfg.num_blocks
        evictable = sum(r.blocks for r in self.state.requests if r.suspended) if self.can_evict else 0
        unavailable = total - self.state.free_blocks - evictable
        return unavailable / total <= self.o.max_util_for_resume

    def resume(self, rid: int) -> bool:
        if not self.utilisation_allows_resume():
            return False
        r = self.r(rid)
        if r.host_blocks:
            if r.host_blocks > self.state.free_blocks:
                return False
            n = r.host_blocks
            self.state = replace(self.state, free_blocks=self.state.free_blocks - n,
                                 free_host_blocks=self.state.free_host_blocks + n)
            r = replace(r, blocks=r.blocks + n, host_blocks=0)
        self.put(replace(r, suspended=False))
        return True

    def grow(self, rid: int, need: int) -> bool:
        if need <= 0:
            return True
        if need > self.state.free_blocks:
            return False
        r = self.r(rid)
        self.state = replace(self.state, free_blocks=self.state.free_blocks - need)
        self.put(replace(r, blocks=r.blocks + need))
        return True

    def suspend(self, rid: int) -> None:
        """M `suspend_request`: the KV stays; its pages move to the host tier if there is one
        with room, and otherwise stay held on the GPU (the last tier)."""
        r = self.r(rid)
        if self.can_evict and r.blocks <= self.state.free_host_blocks:
            self.state = replace(self.state, free_blocks=self.state.free_blocks + r.blocks,
                                 free_host_blocks=self.state.free_host_blocks - r.blocks)
            r = replace(r, host_blocks=r.host_blocks + r.blocks, blocks=0)
        self.put(replace(r, suspended=True))
        self.evicted.append(rid)
        self.plan.offloaded.append(rid)

    def recompute_pause(self, rid: int) -> None:
        """S `_recompute_pause_request` + E `_pause_recompute_request`: free all KV, then
        `reset_for_recompute(0x7fffffff)`: the new prompt is prompt + every generated token
        (no cap), cursor 0. Here that is phase PREEMPTED with computed = 0; the context to
        replay is `context_len` = prompt + generated."""
        if rid in self.evicted:
            # S `_try_recompute_pause_for_gen`: a victim suspended earlier in this pass leaves
            # the suspended list (upstream's paused list); the step record lists it as preempted only
            self.evicted.remove(rid)
            self.plan.offloaded.remove(rid)
        self.release(rid)
        r = self.r(rid)
        self.put(replace(r, phase=Phase.PREEMPTED, computed=0, preemptions=r.preemptions + 1))
        self.paused.append(rid)
        self.plan.preempted.append(rid)
        self.plan.notes.append(f"r{rid} recompute-paused; replay {r.context_len} tokens")

    def release(self, rid: int) -> None:
        r = self.r(rid)
        self.state = replace(self.state, free_blocks=self.state.free_blocks + r.blocks,
                             free_host_blocks=self.state.free_host_blocks + r.host_blocks)
        computed = r.computed if r.phase == Phase.DECODING else 0
        self.put(replace(r, blocks=0, host_blocks=0, suspended=False, computed=computed))

    # -- ME `_prepare_tp_inputs` -------------------------------------------------------------
    def check_forward_tokens(self) -> None:
        """ME's `assert total_num_tokens <= self.max_num_tokens` runs on every batch, whichever
        scheduler built it. A generation step forwards 1 + drafts, a context chunk its tokens
        plus its drafts when it is the last one (resource_manager.py `_request_forward_tokens`,
        which mirrors `_prepare_tp_inputs`). V2 charges exactly that, but `_try_schedule_context_chunked`
        sizes a last chunk against the budget left and adds its drafts afterwards without a
        second `can_fit`: 100 + 20 drafts under a 110 budget is scheduled (upstream
        test_budget_limits_draft_space) and the forward pass then asserts. The post-allocation
        trim (`KVCacheManager.fit_token_budget`) belongs to the V1 manager class, which
        KVCacheManagerV2 does not derive from (kv_cache_manager_v2.py), so nothing shrinks it."""
        total = sum(s.total for s in self.plan.scheduled)
        if total > self.cfg.max_num_tokens:
            self.plan.error = (f"AssertionError: assert total_num_tokens <= self.max_num_tokens "
                               f"({total} > {self.cfg.max_num_tokens}; the scheduler charged {self.plan.charged})")
            self.plan.error_kind = "crash"

    # -- S `_detect_deadlock` ----------------------------------------------------------
    def detect_deadlock(self, pending: list[int]) -> None:
        sched = self.state.sched
        progress = self.gen_s or self.ctx_s or self.evicted or self.paused
        # S: in-flight and GENERATION_TO_COMPLETE requests are not counted
        G = sum(1 for rid in self.L if self.r(rid).phase == Phase.DECODING and rid not in self.inflight
                and not to_complete(self.state, self.r(rid)))
        C = sum(1 for rid in pending if rid not in self.preempted_ids)
        if progress or (G == 0 and C == 0):
            stalls = 0
        else:
            stalls = sched.stalls + 1
        self.state = replace(self.state, sched=replace(sched, stalls=stalls))
        if stalls >= self.o.stall_limit:
            self.plan.error = self.deadlock_message(G, C, stalls, pending)
            self.plan.error_kind = "deadlock"

    def deadlock_message(self, G: int, C: int, stalls: int, pending: list[int]) -> str:
        too_long = [rid for rid in pending
                    if self.r(rid).remaining_context + self.o.draft_len > self.cfg.max_num_tokens]
        if self.o.fix_error_message and too_long and not self.cfg.chunked_prefill:
            r = self.r(too_long[0])
            return (f"V2 scheduler deadlock: context request {r.rid} needs {r.remaining_context} tokens in one "
                    f"iteration, more than max_num_tokens={self.cfg.max_num_tokens}, and chunked prefill is off. "
                    f"Enable chunked prefill or raise max_num_tokens.")
        return (f"V2 scheduler deadlock: {G} generation and {C} context request(s) active but none could be "
                f"scheduled, suspended or preempted in {stalls} consecutive attempts. The KV cache pool is likely "
                f"exhausted. Configure kv_cache_config.host_cache_size, increase kv_cache_config.max_tokens, or "
                f"lower max_batch_size.")
