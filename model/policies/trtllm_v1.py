"""TensorRT-LLM V1 `SimpleScheduler` (PyTorch backend, KV cache manager V1), in the executor's overlap loop (the
default) or its non-overlap loop (`disable_overlap_scheduler`).

Mirrors NVIDIA/TensorRT-LLM, the 1.4.0rc line (main, 2026):
  S  = tensorrt_llm/_torch/pyexecutor/scheduler/scheduler.py @ 002f3cc3d0554c4ebd530d1354f96e89666d93b8
       (the Python mirrors of the C++ capacityScheduler.cpp / microBatchScheduler.cpp, line by line)
  K  = tensorrt_llm/_torch/pyexecutor/resource_manager.py `KVCacheManager.prepare_resources`,
       `_request_forward_tokens`, `fit_token_budget` (the version with PR #15187's post-allocation
       trim, which S's `ScheduledRequests` docstring relies on; read from the index, commit not shown)
  L  = cpp/include/tensorrt_llm/batch_manager/llmRequest.h `setPrepopulatedPromptLen`, `pause` (@ 00e9b8a7)
  E  = tensorrt_llm/_torch/pyexecutor/py_executor.py @ 002f3cc3 (`_pause_requests`: terminate + `pause(max_input_len)`;
       the two loops, model/policies/trtllm_overlap.py)
  ME = tensorrt_llm/_torch/pyexecutor/model_engine.py `_prepare_tp_inputs`
       (`assert total_num_tokens <= self.max_num_tokens`, issue #13318, PR #15187)
Each rule below names the function it mirrors.

One step is one iteration of the executor's loop: E `_executor_loop` with options.disable_overlap_scheduler (the
batch's tokens applied and its finished requests freed in the same iteration), or `_executor_loop_overlap`, the
engine's default (batch k scheduled before batch k-1's tokens are applied; GENERATION_TO_COMPLETE requests hold a
capacity seat but get no micro-batch slot): model/policies/trtllm_overlap.py, rule by rule.

One pass, as in S `SimpleScheduler.schedule_request`:
  # capacity     -- S `GuaranteedNoEvictPolicy.schedule` or `MaxUtilizationPolicy.schedule`
  # micro-batch  -- S `PyMicroBatchScheduler.schedule` over the capacity pass's fitting list
  # pause        -- E: paused requests are terminated (KV freed) and `pause(max_input_len)`
  # resources    -- K: first context chunk allocates the whole context, reusing what the cache holds
                    now (L moves the chunk past it); a decode step adds 1 + drafts
  # trim         -- K: over the budget, context chunks shrink (chunked prefill only)
  # forward      -- ME: the step's tokens (drafts included) must not exceed max_num_tokens

Known divergences (deliberate; also in docs/fidelity/trtllm_v1.md):
- the overlap loop's own (model/policies/trtllm_overlap.py); beam width 1, one attention window, no LoRA/PEFT, no
  encoder-decoder, no disagg, no multimodal, no FORCE_CHUNK, no STATIC_BATCH, no two-step lookahead;
- every arrived request is in the active list at once (the executor's fetch cap is not modelled);
- block reuse is a model of prefix groups: the first request of a group to compute its prefix
  donates floor(min(prefix_len, prompt - 1) / block_size) full blocks to `State.prefix_cache`;
  a later request of the group is charged with the entry as its reuse estimate and reuses what
  is left of it when it allocates. Eviction takes whole entries, so the reuse obtained is the
  estimate or none of it; partial reuse, host offload and the radix tree are not modelled;
  `_beneficial_to_skip` (prefix-aware deferral) is not modelled;
- K's trim has a later discard stage (unscheduling first chunks) in some upstream revisions;
  whether the pinned commit has it is not established, and it is not modelled;
- drafts: a decode step runs 1 + draft_len tokens and a last context chunk carries draft_len
  drafts (as in the trtllm_v2 model); all drafts are rejected at execution (the shared execute);
- unreferenced prefix-cache blocks count as free for admission and are evicted on demand;
- `max_input_len` defaults to max_num_tokens: the stored PyTorch-backend sources disagree
  (llm_args versions give None or 1024); the C++ TRTGptModel derives min(max_seq_len - 1,
  max_num_tokens). Set it explicitly where it matters;
- the MAX_UTILIZATION pause drops generated tokens past the cap: `generated` decreases, which
  the SAFE-REQUESTS property reports as lost tokens (the real engine had already streamed them).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..config import ConfigError, EngineConfig, cdiv, choice, non_negative
from ..policy import Env, Plan, Policy, register, replace
from ..state import Phase, PrefixEntry, Request, State, StepRecord
from .trtllm_overlap import loop_name, overlap_step, to_complete

GNE = "guaranteed_no_evict"
MAX_UTIL = "max_utilization"
FCFS = "first_come_first_served"
EQUAL = "equal_progress"


@dataclasses.dataclass(frozen=True)
class Options:
    kv_cache_max_tokens: Optional[int] = dataclasses.field(default=None, metadata={"positive": True})
    capacity_scheduler_policy: str = choice(GNE, GNE, MAX_UTIL)
    max_input_len: Optional[int] = dataclasses.field(default=None, metadata={"positive": True})
    draft_len: int = non_negative(0)
    enable_block_reuse: bool = False
    chunking_policy: str = choice(FCFS, FCFS, EQUAL)
    # K `fit_token_budget` (PR #15187, in the pinned engine); false models the builds before it,
    # such as the one issue #13318 was reported on
    token_budget_trim: bool = True
    # TorchLlmArgs.disable_overlap_scheduler (llmapi/llm_args.py, default False) -> E `PyExecutor.__init__`: at
    # pp_size 1 the executor runs `_executor_loop` when true, `_executor_loop_overlap` (the default) when false
    disable_overlap_scheduler: bool = False


@dataclasses.dataclass(frozen=True)
class Sched:
    """The overlap loop's memory between iterations (None in the non-overlap loop, which keeps nothing, E
    `_executor_loop`): batch k-1's requests that sample a token, in batch order (model/policies/trtllm_overlap.py)."""
    in_flight: tuple[int, ...] = ()


def pool_blocks_from_max_tokens(max_tokens: int, block_size: int) -> int:
    """V1 KV cache manager: `kv_cache_config.max_tokens` becomes ceil(max_tokens / tokens_per_block)
    primary blocks, with no 1/max_util inflation (docs/engine-notes/trtllm_v2.md, V1 section:
    `_util.py` `configure_kv_cache_capacity` V1 branch, C++ `BaseKVCacheManager` block count).
    The rounding (ceil vs floor) is unconfirmed; both agree on multiples of block_size."""
    return cdiv(max_tokens, block_size)


def shifted_chunk(prepopulated: int, chunk: int, context_len: int, block_size: int) -> int:
    """C++ `LlmRequest::setPrepopulatedPromptLen`: once `add_sequence` has reused `prepopulated`
    tokens, the chunk scheduled from position 0 starts there instead; if it then reaches the end
    of the context it forwards the rest, otherwise its end is aligned down to a block."""
    if prepopulated == 0:
        return chunk
    if prepopulated + chunk >= context_len:
        return context_len - prepopulated
    return (prepopulated + chunk) // block_size * block_size - prepopulated


def reuse_adjusted(chunk: int, reusable: int, remaining: int) -> int:
    """S `_reuse_adjusted_compute`: a non-last chunk costs its size; a chunk that reaches the end
    of the context (with the reusable prefix) costs max(0, remaining - reusable)."""
    if reusable <= 0 or reusable + chunk < remaining:
        return chunk
    return max(0, remaining - reusable)


@register
class TrtllmV1(Policy):
    name = "trtllm_v1"
    mirrors = "TensorRT-LLM 1.4.0rc (main @002f3cc3) scheduler.py SimpleScheduler (V1 capacity + micro-batch)"
    Options = Options
    pool_option = "kv_cache_max_tokens"
    pool_inputs = ("kv_cache_max_tokens",)

    def gpu_blocks_from_option(self, block_size, options, engine):
        return pool_blocks_from_max_tokens(options.kv_cache_max_tokens, block_size)

    loop_knob = "disable_overlap_scheduler"

    def loop(self, options: Options) -> str:
        return loop_name(options)

    def initial_sched(self, cfg: EngineConfig):
        return None if cfg.options.disable_overlap_scheduler else Sched()

    def step(self, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
        """E `_executor_loop`: the shared `Policy.step`; `_executor_loop_overlap`: trtllm_overlap.overlap_step."""
        if cfg.options.disable_overlap_scheduler:
            return super().step(cfg, state, env)
        return overlap_step(self, cfg, state, env)

    def paused_token_landed(self, cfg: EngineConfig, state: State, rid: int, done: bool) -> tuple[State, bool]:
        """The overlap loop: a victim paused (and freed, E `_terminate_requests`) this iteration whose token of the
        last batch has just been appended. E `_pause_requests` then runs `pause(max_input_len)` on it whatever
        that token did (no `is_finished` guard, unlike V2's executor): the prompt takes the generated tokens up to
        max_input_len and the request is back to CONTEXT_INIT, even when the token had finished it (L `pause`).
        Returns the state and whether the request ended (never)."""
        r = state.req(rid)
        kept = min(r.generated, max(0, self.max_input_len(cfg) - r.prompt))
        return state.with_request(replace(r, generated=kept)), False

    def check_config(self, cfg: EngineConfig) -> None:
        o = cfg.options
        if o.chunking_policy != FCFS and not cfg.chunked_prefill:
            raise ConfigError("engine.options.chunking_policy", "only applies with chunked_prefill = true")

    def refuse(self, cfg: EngineConfig, r: Request) -> str:
        """LLM API argument check (PyTorch backend; from memory, not re-read at a pinned commit):
        without chunked prefill a prompt longer than max_num_tokens is refused at submission."""
        if not cfg.chunked_prefill and r.prompt > cfg.max_num_tokens:
            return (f"ValueError: The sum of prompt length ({r.prompt}) and query length (0) should not "
                    f"exceed max_num_tokens ({cfg.max_num_tokens})")
        return ""

    def fits_alone(self, cfg: EngineConfig, r: Request) -> bool:
        """On an empty engine: GNE admits only when the worst case (prompt + max_new + drafts) fits
        the pool; MAX_UTILIZATION needs the real peak (the last sampled token gets no slot);
        without chunking the prompt must pass the argument check."""
        o = cfg.options
        if not cfg.chunked_prefill and r.prompt > cfg.max_num_tokens:
            return False
        if o.capacity_scheduler_policy == GNE:
            return cfg.blocks_for(r.prompt + r.max_new + o.draft_len) <= cfg.num_blocks
        return cfg.blocks_for(r.prompt + r.max_new - 1 + o.draft_len) <= cfg.num_blocks

    def max_input_len(self, cfg: EngineConfig) -> int:
        return cfg.options.max_input_len or cfg.max_num_tokens

    def schedule(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        return _Pass(self, cfg, state, plan).run()

    def after_step(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        state = donate_prefixes(cfg, state)
        return replace(state, step=state.step + 1)


# -- prefix cache (block reuse) ------------------------------------------------------------

def prefix_blocks(cfg: EngineConfig, r: Request) -> int:
    """Full blocks of the shared prefix that can be reused (the last prompt token is always
    recomputed, so a prefix covering the whole prompt yields one block less at most)."""
    if r.prefix_group < 0:
        return 0
    return min(r.prefix_len, r.prompt - 1) // cfg.block_size


def entry_of(state: State, group: int) -> Optional[PrefixEntry]:
    return next((e for e in state.prefix_cache if e.group == group), None)


def donate_prefixes(cfg: EngineConfig, state: State) -> State:
    """After a forward pass: the first request of a group to have computed the prefix's full
    blocks hands them to the cache (they stay referenced by it)."""
    if not cfg.options.enable_block_reuse:
        return state
    for r in state.requests:
        n = prefix_blocks(cfg, r)
        if (n == 0 or r.shared_blocks or not r.phase.unfinished or r.computed < n * cfg.block_size
                or r.blocks < n or entry_of(state, r.prefix_group) is not None):
            continue
        state = replace(state, prefix_cache=state.prefix_cache + (PrefixEntry(r.prefix_group, n, 1),))
        state = state.with_request(replace(r, blocks=r.blocks - n, shared_blocks=n))
    return state


class _Pass:
    """One iteration of the executor: S `SimpleScheduler.schedule_request`, then E's pause and
    K's allocation, then ME's token assert. Mutable scratch, discarded after the pass.

    `inflight` is the executor's `inflight_req_ids`, which the micro-batch scheduler skips (S
    `PyMicroBatchScheduler.schedule`) and the capacity scheduler is not given: empty in both loops at pp_size 1
    (model/policies/trtllm_overlap.py, rule 1); the upstream tests pass one."""

    def __init__(self, policy: TrtllmV1, cfg: EngineConfig, state: State, plan: Plan,
                 inflight: frozenset = frozenset()):
        self.policy, self.cfg, self.o, self.state, self.plan = policy, cfg, cfg.options, state, plan
        self.inflight = inflight
        self.L = [r.rid for r in sorted((r for r in state.requests if r.phase.unfinished),
                                        key=lambda r: (r.arrival, r.rid))]   # active list, arrival order

    def r(self, rid: int) -> Request:
        return self.state.req(rid)

    def put(self, r: Request) -> None:
        self.state = self.state.with_request(r)

    def run(self) -> State:
        if self.o.capacity_scheduler_policy == GNE:
            fitting, paused = self.guaranteed_no_evict(), []
        else:
            fitting, paused = self.max_utilization()
        batch = self.micro_batch(fitting)
        if self.plan.error:
            return self.state
        for rid in paused:
            self.pause(rid)
        runs: list[list] = []   # [rid, tokens forwarded, drafts, charge], in batch order
        for rid, tokens, draft, charge in batch:
            forwarded = self.allocate(rid, tokens, draft)
            if forwarded is None:
                self.schedule_runs(runs)
                self.plan.error = ("RuntimeError: Can't allocate new blocks. No free blocks left "
                                   f"(KV cache manager V1, request {rid})")
                self.plan.error_kind = "crash"
                return self.state
            runs.append([rid, forwarded, draft, charge])
        self.fit_token_budget(runs)
        self.schedule_runs(runs)
        self.check_forward_tokens()
        return self.state

    def schedule_runs(self, runs: list[list]) -> None:
        for rid, tokens, draft, charge in runs:
            self.plan.schedule(rid, tokens, draft, charge=charge)

    # -- shared quantities ---------------------------------------------------------------
    def is_context(self, r: Request) -> bool:
        return r.phase in (Phase.WAITING, Phase.PREFILLING, Phase.PREEMPTED)

    def first_chunk(self, r: Request) -> bool:
        return self.is_context(r) and r.computed == 0

    def started(self, r: Request) -> bool:
        """S `MaxUtilizationPolicy.schedule.is_started_request`: a context past its first chunk,
        or a generation in progress."""
        return (self.is_context(r) and r.computed > 0) or r.phase == Phase.DECODING

    def reusable_blocks(self, r: Request) -> int:
        """Prefix blocks a first chunk would reuse now (the capacity scheduler's estimate)."""
        if not self.o.enable_block_reuse or not self.first_chunk(r) or r.shared_blocks:
            return 0
        e = entry_of(self.state, r.prefix_group)
        return min(e.blocks, prefix_blocks(self.cfg, r)) if e is not None else 0

    def reusable_tokens(self, r: Request) -> int:
        """S: `estimated_reusable_tokens`, credited on the first context chunk only."""
        return self.reusable_blocks(r) * self.cfg.block_size

    def idle_cache_blocks(self) -> int:
        return sum(e.blocks for e in self.state.prefix_cache if e.refs == 0)

    def free_for_scheduling(self) -> int:
        """Free blocks per the block manager: unreferenced reusable blocks count as free."""
        return self.state.free_blocks + self.idle_cache_blocks()

    def held(self, r: Request) -> int:
        return r.blocks + r.shared_blocks

    def remaining_blocks_to_completion(self, r: Request) -> int:
        """C++ `KVCacheManager::getRemainingBlocksToCompletion` (worst case): blocks for
        prompt + max_new (+ drafts) minus those held, minus reusable ones for a first chunk."""
        total = self.cfg.blocks_for(r.prompt + r.max_new + self.o.draft_len)
        return max(0, total - self.held(r) - self.reusable_blocks(r))

    def needed_blocks_one_step(self, r: Request) -> int:
        """C++ `KVCacheManager::getNeededBlocksOneStep`: a first chunk needs its whole context
        (+ drafts) minus reuse; a later chunk nothing (K allocated it all); a decode step the
        blocks for one more token plus drafts."""
        if r.phase == Phase.DECODING:
            return max(0, self.cfg.blocks_for(r.computed + 1 + self.o.draft_len) - self.held(r))
        if self.first_chunk(r):
            return max(0, self.cfg.blocks_for(r.context_len + self.o.draft_len) - self.reusable_blocks(r))
        return 0

    # -- capacity: S `GuaranteedNoEvictPolicy.schedule` -----------------------------------
    def guaranteed_no_evict(self) -> list[int]:
        max_requests = self.cfg.max_batch_size
        avail = self.free_for_scheduling()   # S `NoEvictScheduledBlocksManager.__init__`
        scheduled, pending = [], []
        # generation: scheduled unconditionally, their worst case reserved (may go negative)
        for rid in self.L:
            if len(scheduled) >= max_requests:
                break
            r = self.r(rid)
            if r.phase == Phase.DECODING:
                scheduled.append(rid)
                avail -= self.remaining_blocks_to_completion(r)
            else:
                pending.append(rid)
        # contexts: the first whose worst case does not fit stops everything behind it
        for rid in pending:
            if len(scheduled) >= max_requests:
                break
            need = self.remaining_blocks_to_completion(self.r(rid))
            if need > avail:
                break   # S `enough_available_blocks` false -> head-of-line break (B13)
            scheduled.append(rid)
            avail -= need
        return scheduled

    # -- capacity: S `MaxUtilizationPolicy.schedule` --------------------------------------
    def max_utilization(self) -> tuple[list[int], list[int]]:
        avail = self.free_for_scheduling()   # `start_scheduling` snapshot
        scheduled_blocks = 0
        scheduled, paused = [], []
        end, i = len(self.L), 0
        while i < end:
            r = self.r(self.L[i])
            need = self.needed_blocks_one_step(r)
            # S `_try_scheduling_request` / `prepare_blocks_if_schedulable`
            if len(scheduled) < self.cfg.max_batch_size and scheduled_blocks + need <= avail:
                scheduled_blocks += need
                scheduled.append(r.rid)
                i += 1
                continue
            j = next((k for k in range(end - 1, i - 1, -1) if self.started(self.r(self.L[k]))), None)
            if j is None:
                break
            victim = self.r(self.L[j])
            avail += victim.blocks   # `scheduling_remove_sequence` (shared blocks stay cached)
            paused.append(victim.rid)
            end = j   # the victim may be r itself: then the loop ends
        return scheduled, paused

    # -- micro-batch: S `PyMicroBatchScheduler.schedule` ----------------------------------
    def micro_batch(self, fitting: list[int]) -> list[tuple[int, int, int, int]]:
        """Returns (rid, tokens run, drafts run, tokens charged) per scheduled request."""
        M, draft = self.cfg.max_num_tokens, self.o.draft_len
        batch_tokens, n = 0, 0
        out: list[tuple[int, int, int, int]] = []
        to_chunk: list[int] = []
        chunked_compute, all_fit = 0, True
        for rid in fitting:
            r = self.r(rid)
            # the in-flight set, then the state range up to GENERATION_TO_COMPLETE (S `PyMicroBatchScheduler`'s
            # no_schedule_after_state): skipped, no seat, no tokens; the capacity pass counted them
            if rid in self.inflight or to_complete(self.state, r):
                continue
            if r.phase == Phase.DECODING:
                t = 1 + draft   # beam width + draft tokens
                if batch_tokens + t > M:
                    break
                out.append((rid, 1, draft, t))
                batch_tokens += t
            elif not self.cfg.chunked_prefill:
                remaining = r.remaining_context
                compute = max(1, reuse_adjusted(r.context_len, self.reusable_tokens(r), remaining) + draft)
                if compute > M:
                    self.plan.error = f"AssertionError: Context compute tokens ({compute}) exceeds limit ({M})"
                    self.plan.error_kind = "crash"
                    return []
                if batch_tokens + compute > M:
                    break
                out.append((rid, remaining, draft, compute))   # the whole context (K moves it past a reused prefix)
                batch_tokens += compute
            else:
                remaining = r.remaining_context
                compute = reuse_adjusted(remaining, self.reusable_tokens(r), remaining) + draft
                if compute > M:
                    compute, all_fit = M, False
                to_chunk.append(rid)
                chunked_compute += compute
            n += 1
            if n >= self.cfg.max_batch_size:
                break
        if chunked_compute > M - batch_tokens:
            all_fit = False
        chunks = {rid: self.r(rid).remaining_context for rid in to_chunk}
        drafts = {rid: draft for rid in to_chunk}
        if not all_fit and to_chunk:
            capacity = M - batch_tokens
            if self.o.chunking_policy == EQUAL:
                chunks = self.chunk_equal_progress(to_chunk, capacity)
            else:
                chunks = self.chunk_fcfs(to_chunk, capacity)
            drafts = self.fit_draft_tokens(to_chunk, chunks, capacity)
        for rid in to_chunk:
            chunk = chunks[rid]
            if chunk <= 0:
                continue
            r = self.r(rid)
            d = drafts[rid] if chunk == r.remaining_context else 0
            charge = reuse_adjusted(chunk, self.reusable_tokens(r), r.remaining_context) + d
            out.append((rid, chunk, d, charge))
        return out

    def chunk_fcfs(self, rids: list[int], capacity: int) -> dict[int, int]:
        """S `_chunk_fcfs`: in order, each takes what the compute capacity allows; a trimmed chunk
        is aligned down to the chunk unit."""
        unit, M = self.policy.default_chunk_unit(self.cfg), self.cfg.max_num_tokens
        left, chunks = capacity, {}
        for rid in rids:
            r = self.r(rid)
            suggested = r.remaining_context
            reusable = min(self.reusable_tokens(r), suggested)
            size = suggested
            if left < reuse_adjusted(suggested, reusable, suggested):
                size = left
            if reuse_adjusted(size, reusable, suggested) > M:
                size = min(M, suggested)
            if size < suggested:
                size = size // unit * unit
            chunks[rid] = size
            left -= reuse_adjusted(size, reusable, suggested)
        return chunks

    def chunk_equal_progress(self, rids: list[int], capacity: int) -> dict[int, int]:
        """S `_chunk_equal_progress`: rounds of +unit per request while the compute capacity
        lasts and some request grew."""
        unit, M = self.policy.default_chunk_unit(self.cfg), self.cfg.max_num_tokens
        chunks = {rid: 0 for rid in rids}
        used, grew = 0, 1
        while used < capacity and grew > 0:
            grew = 0
            for rid in rids:
                r = self.r(rid)
                remaining = r.remaining_context
                past = chunks[rid]
                size = min(past + unit, remaining)
                reusable = min(self.reusable_tokens(r), remaining)
                inc = reuse_adjusted(size, reusable, remaining) - reuse_adjusted(past, reusable, remaining)
                if used + inc > capacity or size > M:
                    continue
                chunks[rid] = size
                used += inc
                grew += size - past
        return chunks

    def fit_draft_tokens(self, rids: list[int], chunks: dict[int, int], capacity: int) -> dict[int, int]:
        """S `_fit_draft_tokens`: a last chunk keeps drafts only in the free tail of its last
        chunk unit and within the compute capacity left."""
        unit, M = self.policy.default_chunk_unit(self.cfg), self.cfg.max_num_tokens
        used = sum(reuse_adjusted(chunks[rid], min(self.reusable_tokens(self.r(rid)), self.r(rid).remaining_context),
                                  self.r(rid).remaining_context) for rid in rids)
        kept = {}
        for rid in rids:
            r, chunk = self.r(rid), chunks[rid]
            if chunk != r.remaining_context or self.o.draft_len == 0:
                kept[rid] = 0
                continue
            rem = chunk % unit
            space = max(0, min(0 if rem == 0 else unit - rem, M - chunk))
            k = max(0, min(self.o.draft_len, space, capacity - used))
            used += k
            kept[rid] = k
        return kept

    # -- E `_pause_requests` ---------------------------------------------------------------
    def pause(self, rid: int) -> None:
        """Terminate (free KV), then C++ `LlmRequest::pause(max_input_len)`: the generated tokens
        join the prompt up to max_input_len; tokens past the cap are dropped and regenerated."""
        self.state = self.policy.release(self.cfg, self.state, rid)
        r = self.r(rid)
        cap = max(0, self.policy.max_input_len(self.cfg) - r.prompt)
        kept = min(r.generated, cap)
        self.put(replace(r, phase=Phase.PREEMPTED, computed=0, generated=kept, preemptions=r.preemptions + 1))
        self.plan.preempted.append(rid)
        note = f"r{rid} paused; replay {r.prompt + kept} tokens"
        if kept < r.generated:
            note += f" ({r.generated - kept} generated tokens dropped at max_input_len)"
        self.plan.notes.append(note)

    # -- K `KVCacheManager.prepare_resources` ----------------------------------------------
    def allocate(self, rid: int, tokens: int, draft: int) -> Optional[int]:
        """First context chunk: `add_sequence(prompt_len)`, then one slot per draft; decode:
        `add_token` for the new token and each draft. Returns the tokens the chunk forwards
        (None when the blocks are not there).

        `add_sequence` reuses what the cache holds *now*: an earlier request of this batch may
        have evicted blocks the capacity pass counted as reusable (PR #12682: "addSequence calls
        evict cached blocks, reducing actual reuse for later requests below the scheduler's
        estimate"). C++ `LlmRequest::setPrepopulatedPromptLen(P)` (llmRequest.h) then moves the
        scheduled window right by the P tokens obtained: a chunk that reaches the end of the
        context forwards the uncached tail L - P, a shorter one keeps its end block-aligned.
        The chunk was charged with the estimate E, so when P < E it forwards more than it was
        charged (resource_manager.py `_request_forward_tokens`: the uncached tail, once the
        prefix is applied; #13318's mechanism as PR #15187 describes it)."""
        r = self.r(rid)
        if self.first_chunk(r):
            n = self.reusable_blocks(r)
            if n:
                e = entry_of(self.state, r.prefix_group)
                cache = tuple(replace(x, refs=x.refs + 1) if x is e else x for x in self.state.prefix_cache)
                self.state = replace(self.state, prefix_cache=cache)
                tokens = shifted_chunk(n * self.cfg.block_size, tokens, r.context_len, self.cfg.block_size)
                r = replace(r, shared_blocks=n, computed=n * self.cfg.block_size)
                self.put(r)
            target = r.context_len + draft
        elif r.phase == Phase.DECODING:
            target = r.computed + 1 + draft
        else:
            target = r.context_len + draft
        need = self.cfg.blocks_for(target) - self.held(r)
        if need <= 0:
            return tokens
        if not self.make_room(need):
            return None
        self.state = replace(self.state, free_blocks=self.state.free_blocks - need)
        self.put(replace(self.r(rid), blocks=self.r(rid).blocks + need))
        return tokens

    def fit_token_budget(self, runs: list[list]) -> None:
        """K `KVCacheManager.fit_token_budget`, run at the end of `ResourceManager.prepare_resources`
        (resource_manager.py, PR #15187; scheduler.py @002f3cc3's `ScheduledRequests` docstring
        relies on it). If the batch forwards more than max_num_tokens, context chunks are shrunk,
        never deferred: last chunks first, from the back of the batch, then the other chunks from
        the back. A chunk keeps its end block-aligned and at least one block of progress
        (`_shrink_context_chunk`); a shrunk last chunk is no longer last and loses its drafts.
        With chunked prefill off it only warns, and the forward pass asserts."""
        if not self.o.token_budget_trim:
            return
        M, bs = self.cfg.max_num_tokens, self.cfg.block_size
        excess = sum(tokens + draft for _, tokens, draft, _ in runs) - M
        contexts = [run for run in runs if self.r(run[0]).phase != Phase.DECODING]
        if excess <= 0 or not contexts:
            return
        if not self.cfg.chunked_prefill:
            self.plan.notes.append(f"fit_token_budget: {excess} tokens over max_num_tokens; cannot trim with "
                                   "chunked prefill disabled")
            return
        last = [run for run in contexts if self.is_last(run)]
        shed = 0
        for run in reversed([run for run in contexts if not self.is_last(run)] + last):
            if shed >= excess:
                break
            pos, cur = self.r(run[0]).computed, run[1]
            new = max(bs - pos % bs, (pos + cur - (excess - shed)) // bs * bs - pos)
            if new >= cur:
                continue
            shed += cur - new
            self.plan.notes.append(f"r{run[0]}'s chunk trimmed from {cur} to {new} tokens to fit max_num_tokens")
            run[1], run[2] = new, 0

    def is_last(self, run: list) -> bool:
        r = self.r(run[0])
        return r.computed + run[1] >= r.context_len

    def make_room(self, need: int) -> bool:
        """Evict unreferenced prefix-cache blocks, oldest entry first, until `need` are free."""
        while self.state.free_blocks < need:
            idle = next((e for e in self.state.prefix_cache if e.refs == 0), None)
            if idle is None:
                return False
            self.state = replace(self.state, free_blocks=self.state.free_blocks + idle.blocks,
                                 prefix_cache=tuple(e for e in self.state.prefix_cache if e is not idle))
        return True

    # -- ME `_prepare_tp_inputs` -------------------------------------------------------------
    def check_forward_tokens(self) -> None:
        total = sum(s.total for s in self.plan.scheduled)
        if total > self.cfg.max_num_tokens:
            self.plan.error = (f"AssertionError: assert total_num_tokens <= self.max_num_tokens "
                               f"({total} > {self.cfg.max_num_tokens}; the scheduler charged {self.plan.charged})")
            self.plan.error_kind = "crash"
