"""TensorRT-LLM V1 `SimpleScheduler` as a core: model/policies/trtllm_v1.py over slots.

Every method re-expresses the function of the same name in model/policies/trtllm_v1.py
(`TrtllmV1`, `_Pass`, `donate_prefixes`), which cites the engine: TensorRT-LLM 1.4.0rc (main
@002f3cc3) tensorrt_llm/_torch/pyexecutor/scheduler/scheduler.py `SimpleScheduler.schedule_request`
(`GuaranteedNoEvictPolicy.schedule`, `MaxUtilizationPolicy.schedule`, `PyMicroBatchScheduler.schedule`,
`_chunk_fcfs`, `_fit_draft_tokens`, `_reuse_adjusted_compute`), resource_manager.py
`KVCacheManager.prepare_resources`, py_executor.py `_pause_requests` and model_engine.py
`_prepare_tp_inputs` (the `total_num_tokens <= max_num_tokens` assert of #13318).

The active list L of the policy is the unfinished requests sorted by (arrival, rid); slots are
in arrival order with rid == slot index, so L is the unfinished slots in slot order and list
positions become slot indices.

The prefix cache (`State.prefix_cache`, at most one entry per prefix group, in insertion order)
is kept in the request slots: the entry of a group lives in the group's first slot (its home),
in the fields `pc_blocks`, `pc_refs`, `pc_rank` (blocks 0 = no entry; rank = the entry's
position in `State.prefix_cache`, which orders eviction). Group ids may be any values, concrete
or symbolic (checkers/space.py makes them terms pinned by constraints).
`cached_blocks` and `core_invariants` give the BMC the cache's blocks and bookkeeping.

Subset (everything else is refused by `unsupported`):
- both capacity policies (GUARANTEED_NO_EVICT, MAX_UTILIZATION with its recompute pause and
  `max_input_len` cap), chunked prefill on and off, any chunk unit, draft tokens;
- block reuse on or off, with shared prefixes (any group ids and prefix lengths);
- chunking_policy = first_come_first_served only: `_chunk_equal_progress` loops in rounds of one
  chunk unit while capacity lasts, a loop with no bound fixed by the structure;
- the workload rules of the scenario loader (prompt >= 1, 0 <= prefix_len) are assumed: with them
  every cache entry holds at least one block, which the eviction order below relies on;
- host_blocks is allowed (V1 never touches the host pool; free_host_blocks stays put);
- both executor loops (model/policies/trtllm_overlap.py): `_executor_loop` (disable_overlap_scheduler), and
  TensorRT-LLM's default, `_executor_loop_overlap`, as model/symbolic/overlap.py (`OverlapLoop`: launch batch k,
  rule 4, then land batch k-1, rule 5; the per-slot `in_flight` field is batch k-1's sampling rows, rule 6). The
  micro-batch skips GENERATION_TO_COMPLETE (rule 2; the capacity pass counts it and may pause it, as written), and
  a pause victim's landed token is kept up to `max_input_len` (`paused_token_landed`: paused anyway, even when that
  token was its last, so such a request replays and finishes one token past max_new, or past its stop). In
  `_executor_loop` nothing reads or writes `in_flight`. In the overlap loop no decode run is accelerated
  (`decode_guard` is false there), and four invariants say where it differs: `decode-cursor`, `in-flight-decodes`,
  `fields` (generated up to max(max_new, cap + 1)) and `live-owes-tokens` (a live request past max_new or its stop
  is such a victim: at most `cap` tokens, queued, replaying, or launched with its token in flight).

Running values (`_Pass.seen`): every loop over the requests names what its turn reads besides the
request itself (tokens batched, capacity left, ...), and MAX_UTILIZATION's capacity outcome passes
through `env.capacity`. Without an environment (`Plan.env`, the normal case) both return their input
unchanged; checkers/parametric/local.py gives them one to prove the token budget for any number of
requests.

Acceleration (`decode_guard` / `decode_advance`): m identical pure-decode passes as one
transition, for both capacity policies, chunking on or off, drafts and block reuse. Every
unfinished request decodes or is a queued context (waiting, or paused for recompute: no KV);
the decoders all fit the batch cap and the token budget, their growth over the m steps fits the
free pool (so `make_room` evicts nothing and the cache stays as it is); none finishes, stops or
donates a prefix; nothing arrives or is cancelled; and the first queued context in L is kept
out at the first pass, hence at every pass: by the capacity pass (what it is measured against
only shrinks as the decoders grow), or, chunking off, by the micro-batch's budget (its whole
context does not fit what the decoders leave, which stays the same); chunking on, every queued
context may instead be starved by the budget (under one chunk unit left: `chunk_fcfs` gives
each a chunk of 0). MAX_UTILIZATION also needs every context behind every decoder: a context
ahead of a decoder that does not fit pauses the last started request behind it.
checkers/accel.py proves it equal to m single steps. Not covered (taken one step at a time): a
chunked context starved while a later one that the capacity pass did not admit would fit the
budget, and, under MAX_UTILIZATION, a context ahead of a decoder that fits the pool but not the
budget. The guard admits 5622 of the 5634 pure-decode steps of the simulator's runs on the
random cases (tests/symbolic/test_core_trtllm_v1.py asserts at least 99%).
"""

from __future__ import annotations

from typing import Optional

from ...config import EngineConfig
from ...policies.trtllm_overlap import in_flight
from ...policies.trtllm_v1 import EQUAL, GNE
from ...state import State
from ..core import Core, Plan, register
from ..ops import Guarded
from ..overlap import FIELD as IN_FLIGHT
from ..overlap import OverlapLoop, in_flight_decodes, overlap, to_complete
from ..overlap import decode_cursor as overlap_decode_cursor
from ..slots import DECODING, FINISHED, OFFLOADED, PREEMPTED, PREFILLING, WAITING, Knobs, Params, SlotState, unfinished


@register
class TrtllmV1Core(OverlapLoop, Core):
    policy = "trtllm_v1"
    # shared_blocks: Request.shared_blocks; pc_*: the cache entry of the group whose home is this slot;
    # in_flight: batch k-1's sampling requests in the overlap loop (model/symbolic/overlap.py), never read or
    # written in the other loop
    extra_req_fields = {"shared_blocks": int, "pc_blocks": int, "pc_refs": int, "pc_rank": int, IN_FLIGHT: bool}

    # -- what the core covers ----------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None) -> Optional[tuple[str, str]]:
        """equal_progress chunking; concrete prompts < 1 or prefix lengths < 0."""
        if cfg.options.chunking_policy == EQUAL:
            return ("engine.options.chunking_policy",
                    "the symbolic trtllm_v1 core does not model equal_progress chunking (its rounds loop has no "
                    "bound fixed by the structure); use first_come_first_served")
        if params is None:
            return None
        for i, w in enumerate(params.slots):
            if isinstance(w["prompt"], int) and w["prompt"] < 1:
                return (f"requests[{i}].prompt", "must be >= 1 (the scenario loader's rule, assumed by the core)")
            if isinstance(w["prefix_len"], int) and w["prefix_len"] < 0:
                return (f"requests[{i}].prefix_len", "must be >= 0 (the scenario loader's rule)")
        return None

    # -- states ------------------------------------------------------------------------
    def initial_req_extra(self, ops, k: Knobs, p: Params, i: int) -> dict:
        return {**dict(shared_blocks=0, pc_blocks=0, pc_refs=0, pc_rank=0), IN_FLIGHT: False}

    def absent_req_extra(self, i: int) -> dict:
        return {**dict(shared_blocks=0, pc_blocks=0, pc_refs=0, pc_rank=0), IN_FLIGHT: False}

    def abstract_req_extra(self, cfg: EngineConfig, state: State, rid: int) -> dict:
        return {**dict(shared_blocks=state.req(rid).shared_blocks, pc_blocks=0, pc_refs=0, pc_rank=0),
                IN_FLIGHT: rid in in_flight(state)}

    def abstract(self, cfg: EngineConfig, state: State, n: int) -> SlotState:
        """Core.abstract, then each prefix-cache entry copied into its group's home slot."""
        s = super().abstract(cfg, state, n)
        for rank, e in enumerate(state.prefix_cache):
            home = min(r.rid for r in state.requests if r.prefix_group == e.group)
            s.req[home].update(pc_blocks=e.blocks, pc_refs=e.refs, pc_rank=rank)
        return s

    def cached_blocks(self, ops, k: Knobs, p: Params, s: SlotState):
        """The blocks of the prefix-cache entries (`State.cached_blocks`)."""
        return ops.sum(r["pc_blocks"] for r in s.req)

    def shared_blocks(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        return s.req[i]["shared_blocks"]

    def cache_refs(self, ops, k: Knobs, p: Params, s: SlotState):
        return ops.sum(r["pc_refs"] for r in s.req)

    def core_invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        """The prefix cache's bookkeeping (proved inductive with the base invariants):
        - entries live only in home slots; an entry holds blocks >= 0; no entry means no refs and
          rank 0; the entries' ranks are 0 .. entries - 1 (their order in `State.prefix_cache`);
        - a request holds shared blocks only while prefilling or decoding, and only with an entry
          of its group; an entry's refs count the requests of its group holding shared blocks;
        - no request is OFFLOADED (V1 has no such phase); a queued request (waiting, or paused for
          recompute) has no KV at all; without block reuse there is no entry and nothing shared."""
        n = len(s.req)
        home = homes(ops, p)
        inv = {}
        present = [ops.not_(r["pc_blocks"] == 0) for r in s.req]
        entries = ops.count(present)
        holds = [ops.not_(r["shared_blocks"] == 0) for r in s.req]
        for g, e in enumerate(s.req):
            inv[f"pc{g}.entry"] = ops.and_(e["pc_blocks"] >= 0, ops.implies(present[g], home[g][g]), ops.implies(
                ops.not_(present[g]), ops.and_(e["pc_refs"] == 0, e["pc_rank"] == 0)))
            inv[f"pc{g}.rank"] = ops.implies(present[g], ops.and_(
                e["pc_rank"] >= 0, e["pc_rank"] < entries,
                *[ops.implies(present[h], ops.not_(e["pc_rank"] == s.req[h]["pc_rank"])) for h in range(g)]))
            inv[f"pc{g}.refs"] = e["pc_refs"] == ops.count(ops.and_(holds[i], home[i][g]) for i in range(g, n))
        for i, r in enumerate(s.req):
            ph = r["phase"]
            inv[f"r{i}.shared"] = ops.and_(r["shared_blocks"] >= 0, ops.implies(holds[i], ops.and_(
                ops.or_(ph == PREFILLING, ph == DECODING), ops.not_(self.entry(ops, p, s, i, "pc_blocks") == 0))))
            inv[f"r{i}.not-offloaded"] = ops.not_(ph == OFFLOADED)
            if not k.options.enable_block_reuse:   # only `donate_prefixes` makes entries and shared blocks
                inv[f"r{i}.no-cache"] = ops.and_(r["shared_blocks"] == 0, r["pc_blocks"] == 0, r["pc_refs"] == 0,
                                                 r["pc_rank"] == 0)
            inv[f"r{i}.queued-holds-nothing"] = ops.implies(ops.or_(ph == WAITING, ph == PREEMPTED), ops.and_(
                r["computed"] == 0, r["blocks"] == 0, r["shared_blocks"] == 0))
            if overlap(k):
                inv[f"r{i}.in-flight-decodes"] = in_flight_decodes(ops, s, i)
        return inv

    # -- the overlap loop (model/symbolic/overlap.py) ------------------------------------------
    def cap(self, ops, k: Knobs, p: Params, i: int):
        """`pause(max_input_len)`'s room for generated tokens: max(0, max_input_len - prompt)."""
        return ops.max(0, (k.options.max_input_len or k.max_num_tokens) - p.slots[i]["prompt"])

    def paused_token_landed(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, i: int, done) -> None:
        """TrtllmV1.paused_token_landed: E `_pause_requests` runs `pause(max_input_len)` on the victim whatever its
        token did (no `is_finished` guard): the token joins its prompt up to the cap, and it never ends here."""
        r = x.req[i]
        G.set(r, "generated", G.ops.min(r["generated"], self.cap(G.ops, k, p, i)))

    def decode_cursor(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """overlap.decode_cursor in the overlap loop (a decoder in flight has one more token in its KV)."""
        if not overlap(k):
            return super().decode_cursor(ops, k, p, s, i)
        return overlap_decode_cursor(ops, p, s, i)

    def max_generated(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """The overlap loop: a victim whose in-flight token was its last is paused anyway (rule 5), keeping up to
        `cap` generated tokens, and its replay lands one more: max(max_new, cap + 1)."""
        if not overlap(k):
            return super().max_generated(ops, k, p, s, i)
        return ops.max(p.slots[i]["max_new"], self.cap(ops, k, p, i) + 1)

    def owes_tokens(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """The overlap loop: a live request past max_new or its stop is a pause victim whose in-flight token reached
        it (rule 5): it holds at most `cap` tokens and is queued, replaying, or launched with its token in
        flight (which finishes it when it lands, unless it is paused again)."""
        if not overlap(k):
            return super().owes_tokens(ops, k, p, s, i)
        w, r = p.slots[i], s.req[i]
        ph = r["phase"]
        live = ops.and_(ph >= WAITING, ph < FINISHED)
        replayed = ops.and_(r["generated"] <= self.cap(ops, k, p, i), r["preemptions"] >= 1,
                            ops.or_(ph != DECODING, r[IN_FLIGHT]))
        return ops.implies(live, ops.and_(
            ops.or_(r["generated"] < w["max_new"], replayed),
            ops.or_(w["output_len"] <= 0, r["generated"] < w["output_len"], replayed)))

    # -- hooks the engine-checked policy overrides ----------------------------------------
    def refuse(self, ops, k: Knobs, p: Params, x: SlotState, i: int):
        """TrtllmV1.refuse: without chunked prefill a prompt longer than max_num_tokens is refused."""
        if k.chunked_prefill:
            return False
        return p.slots[i]["prompt"] > k.max_num_tokens

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        _Pass(self, G, k, p, x, plan).run()

    def after_step(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """TrtllmV1.after_step: donate_prefixes, then the step counter."""
        if k.options.enable_block_reuse:
            self.donate_prefixes(G, k, p, x)
        super().after_step(G, k, p, x, plan)

    def release(self, G: Guarded, k: Knobs, p: Params, x: SlotState, i: int) -> None:
        """Policy.release: the request's own blocks go back to the pool; its shared prefix
        blocks stay in the cache, which loses one reference (`unref_prefix`)."""
        ops = G.ops
        r = x.req[i]
        shared = ops.not_(r["shared_blocks"] == 0)
        # constant folding only: skip what cannot happen (without block reuse nothing is ever shared:
        # `donate_prefixes` alone sets shared_blocks, and only with reuse)
        if k.options.enable_block_reuse and ops.and_(G.guard, shared) is not False:
            for j, at in enumerate(homes(ops, p)[i]):
                with G.when(ops.and_(shared, at)):
                    G.add(x.req[j], "pc_refs", -1)
        super().release(G, k, p, x, i)
        G.set(r, "shared_blocks", 0)

    # -- acceleration ----------------------------------------------------------------------
    accelerates = True

    def accelerates_in(self, k: Knobs) -> bool:
        """No decode run is accelerated in the overlap loop (`decode_guard` is false there), so no search or proof
        there asks for acceleration or proves it."""
        return not overlap(k)

    def decode_guard(self, ops, k: Knobs, p: Params, s: SlotState, m):
        """The next m passes are identical pure-decode passes (the module docstring says why each
        condition is there). The capacity pass's own quantities are read from a `_Pass` built on
        s (building one changes nothing), so the guard and the step share their terms."""
        if overlap(k):
            return False     # no decode run is accelerated in the overlap loop
        o = k.options
        n = len(s)
        step = s.g["step"]
        pas = _Pass(self, Guarded(ops), k, p, s, Plan(n))
        conds = [ops.not_(s.g["error"]), m >= 1]
        dec = [ops.and_(pas.listed[i], pas.dec[i]) for i in range(n)]
        ctx = [ops.and_(pas.listed[i], ops.not_(pas.dec[i])) for i in range(n)]
        for i, (r, w) in enumerate(zip(s.req, p.slots)):
            # nothing arrives or is cancelled in [step, step + m) (a cancel after the end is a no-op)
            conds.append(ops.implies(w["present"], ops.or_(w["arrival"] < step, w["arrival"] >= step + m)))
            conds.append(ops.implies(ops.and_(w["present"], r["phase"] < FINISHED),
                                     ops.or_(w["cancel_at"] < step, w["cancel_at"] >= step + m)))
            # a decoder neither finishes nor stops in the window
            conds.append(ops.implies(dec[i], ops.and_(
                r["generated"] + m < w["max_new"], ops.or_(w["output_len"] <= 0, r["generated"] + m < w["output_len"]))))
            if o.enable_block_reuse:
                # nor would donate_prefixes hand its prefix to the cache (it holds shared blocks,
                # has no prefix, or its group has an entry): that changes blocks and the cache
                conds.append(ops.implies(dec[i], ops.or_(self.prefix_blocks(ops, k, p, i) == 0,
                                                         ops.not_(r["shared_blocks"] == 0),
                                                         ops.not_(self.entry(ops, p, s, i, "pc_blocks") == 0))))
            # every other unfinished request is a queued context, holding no KV
            conds.append(ops.implies(ctx[i], ops.and_(ops.or_(r["phase"] == WAITING, r["phase"] == PREEMPTED),
                                                      r["computed"] == 0)))
        count = ops.count(dec)
        conds += [count >= 1, count <= k.max_batch_size, count * (1 + o.draft_len) <= k.max_num_tokens,
                  ops.sum(ops.ite(dec[i], _growth(ops, k, o, s.req[i], m), 0) for i in range(n)) <= s.g["free_blocks"]]
        # the first queued context in L stays out at the first pass
        if o.capacity_scheduler_policy == GNE:
            # GuaranteedNoEvict: its worst case does not fit what the decoders' worst cases leave
            avail = pas.free_for_scheduling() - ops.sum(
                ops.ite(dec[i], pas.remaining_blocks_to_completion(i), 0) for i in range(n))
            blocked = [ops.or_(count >= k.max_batch_size, pas.remaining_blocks_to_completion(i) > avail)
                       for i in range(n)]
        else:
            # MaxUtilization: no context ahead of a decoder, and its first chunk does not fit
            # what the decoders' next blocks leave (then no started request is behind it: the
            # loop ends without a pause)
            conds += [ops.not_(ops.and_(ctx[i], dec[j])) for i in range(n) for j in range(i + 1, n)]
            used = ops.sum(ops.ite(dec[i], pas.needed_blocks_one_step(i), 0) for i in range(n))
            blocked = [ops.or_(count >= k.max_batch_size, used + pas.needed_blocks_one_step(i) > pas.free_for_scheduling())
                       for i in range(n)]
        if not k.chunked_prefill:
            # or, unchunked, the capacity pass admits it but the micro-batch stops at it: its whole
            # context does not fit the budget the decoders leave (and alone it does, or it would raise)
            for i in range(n):
                compute = pas.whole_context_compute(i)
                blocked[i] = ops.or_(blocked[i], ops.and_(compute <= k.max_num_tokens,
                                                          count * (1 + o.draft_len) + compute > k.max_num_tokens))
        kept_out, first = [], True
        for i in range(n):
            kept_out.append(ops.implies(ops.and_(ctx[i], first), blocked[i]))
            first = ops.and_(first, ops.not_(ctx[i]))
        kept_out = ops.and_(*kept_out)
        if k.chunked_prefill:
            # or, chunked, whatever the capacity pass admits gets a chunk of 0 (`chunk_fcfs`): the
            # budget the decoders leave is under one chunk unit and no context fits it whole
            left = k.max_num_tokens - count * (1 + o.draft_len)
            kept_out = ops.or_(kept_out, ops.and_(left < pas.unit, *[ops.implies(ctx[i], left < reuse_adjusted(
                ops, pas.rem[i], ops.min(pas.reuse_tokens[i], pas.rem[i]), pas.rem[i])) for i in range(n)]))
        conds.append(kept_out)
        return ops.and_(*conds)

    def decode_advance(self, ops, k: Knobs, p: Params, s: SlotState, m) -> SlotState:
        """m decode passes at once: each decoder m tokens further, its own blocks grown to cover
        the last one's allocation (computed + m + drafts); nothing else changes but the step."""
        x = s.copy()
        taken = []
        for r, w in zip(x.req, p.slots):
            dec = ops.and_(w["present"], unfinished(ops, r["phase"]), r["phase"] == DECODING)
            grow = ops.ite(dec, _growth(ops, k, k.options, r, m), 0)
            taken.append(grow)
            r["blocks"] = r["blocks"] + grow
            r["computed"] = ops.ite(dec, r["computed"] + m, r["computed"])
            r["generated"] = ops.ite(dec, r["generated"] + m, r["generated"])
        x.g["free_blocks"] = x.g["free_blocks"] - ops.sum(taken)
        x.g["step"] = x.g["step"] + m
        return x

    # -- prefix cache helpers (shared with _Pass) ----------------------------------------------
    @staticmethod
    def entry(ops, p: Params, x: SlotState, i: int, field: str):
        """A field of the cache entry of slot i's prefix group (0 without an entry)."""
        return ops.sum(ops.ite(at, x.req[j][field], 0) for j, at in enumerate(homes(ops, p)[i]))

    @staticmethod
    def prefix_blocks(ops, k: Knobs, p: Params, i: int):
        """prefix_blocks: full blocks of the shared prefix (the last prompt token is recomputed)."""
        w = p.slots[i]
        return ops.ite(w["prefix_group"] < 0, 0, ops.div(ops.min(w["prefix_len"], w["prompt"] - 1), k.block_size))

    def donate_prefixes(self, G: Guarded, k: Knobs, p: Params, x: SlotState) -> None:
        """donate_prefixes: in slot order, the first request of a group to hold its prefix's full
        blocks hands them to the cache (a new entry at the end of the eviction order, one ref)."""
        ops = G.ops
        n = len(x)
        for i in range(n):
            r = x.req[i]
            pb = self.prefix_blocks(ops, k, p, i)
            donates = ops.and_(ops.not_(pb == 0), r["shared_blocks"] == 0, unfinished(ops, r["phase"]),
                               r["computed"] >= pb * k.block_size, r["blocks"] >= pb,
                               self.entry(ops, p, x, i, "pc_blocks") == 0)
            entries = ops.count(ops.not_(x.req[g]["pc_blocks"] == 0) for g in range(n))
            with G.when(donates):
                for j, at in enumerate(homes(ops, p)[i]):
                    with G.when(at):
                        G.set(x.req[j], "pc_blocks", pb)
                        G.set(x.req[j], "pc_refs", 1)
                        G.set(x.req[j], "pc_rank", entries)
                G.set(r, "blocks", r["blocks"] - pb)
                G.set(r, "shared_blocks", pb)


def homes(ops, p: Params) -> list:
    """homes[i][j] (j <= i): slot j is the home of slot i's prefix group, the group's first slot,
    where its cache entry lives (none for i without a group). A function of the workload only,
    so it is kept on the Params object (per interpretation) rather than rebuilt at each use."""
    memo = p.__dict__.setdefault("_trtllm_v1_homes", {})
    if ops.symbolic not in memo:
        group = [w["prefix_group"] for w in p.slots]
        first = [ops.and_(*[ops.not_(group[h] == group[j]) for h in range(j)]) for j in range(len(group))]
        memo[ops.symbolic] = [[ops.and_(group[i] >= 0, first[j], group[j] == group[i]) for j in range(i + 1)]
                              for i in range(len(group))]
    return memo[ops.symbolic]


def _growth(ops, k: Knobs, o, r: dict, m):
    """The blocks a decoder takes over m passes: K's `add_token` each pass grows it to the blocks
    of computed + 1 + drafts, so after m passes to those of computed + m + drafts (never less
    than it holds, shared prefix blocks included)."""
    return ops.max(0, k.blocks_for(ops, r["computed"] + m + o.draft_len) - (r["blocks"] + r["shared_blocks"]))


def shifted_chunk(ops, prepopulated, chunk, context_len, block_size):
    """shifted_chunk (C++ `LlmRequest::setPrepopulatedPromptLen`), for prepopulated > 0: a chunk
    that then reaches the end of the context forwards the rest, a shorter one keeps its end on a
    block."""
    return ops.ite(prepopulated + chunk >= context_len, context_len - prepopulated,
                   ops.div(prepopulated + chunk, block_size) * block_size - prepopulated)


def reuse_adjusted(ops, chunk, reusable, remaining):
    """reuse_adjusted (S `_reuse_adjusted_compute`): a non-last chunk costs its size; a chunk that
    reaches the end of the context (with the reusable prefix) costs max(0, remaining - reusable)."""
    return ops.ite(ops.or_(reusable <= 0, reusable + chunk < remaining), chunk, ops.max(0, remaining - reusable))


class _Pass:
    """One call of `_Pass.run` (S `SimpleScheduler.schedule_request`, then E's pause, K's
    allocation and ME's token assert), over slots. The per-slot quantities the capacity and
    micro-batch schedulers read are computed once, on the state the pass starts from."""

    def __init__(self, core: TrtllmV1Core, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan):
        self.core, self.G, self.ops, self.k, self.o, self.p, self.x, self.plan = \
            core, G, G.ops, k, k.options, p, x, plan
        ops = self.ops
        n = self.n = len(x)
        self.unit = k.chunk_unit or k.block_size          # Policy.default_chunk_unit
        self.listed = [ops.and_(w["present"], unfinished(ops, r["phase"])) for w, r in zip(p.slots, x.req)]
        self.dec = [r["phase"] == DECODING for r in x.req]
        self.rem = [self.remaining_context(i) for i in range(n)]
        self.before = None    # before[h][g]: entry h precedes entry g in eviction order (`eviction_order`)
        self.reuse_blocks = [self.reusable_blocks(i) for i in range(n)]
        self.reuse_tokens = [rb * k.block_size if self.o.enable_block_reuse else 0 for rb in self.reuse_blocks]

    @property
    def env(self):
        """checkers/parametric/local.py's environment (one request among any number), or None."""
        return self.plan.env

    def seen(self, name: str, i, **running) -> tuple:
        """The running values of a loop over the requests as slot i's turn reads them (i None: once
        the loop is over), in the order given. They are the values themselves, except under an
        environment (checkers/parametric/local.py: one request among any number), where what the
        other requests made of them is the environment's."""
        if self.env is None:
            return tuple(running.values())
        return tuple(self.env.seen(f"{name}.{var}", value, i) for var, value in running.items())

    def seen_sum(self, name: str, summands: list):
        """The sum over the requests of one value each (`summands[i]` for slot i), as a loop's first
        value. Under an environment each request's summand is its own and the total the others'
        (checkers/parametric/local.py: the total is the summands' sum by this definition, for any n)."""
        total = self.ops.sum(summands)
        return total if self.env is None else self.env.seen_sum(name, summands, total)

    def capacity_outcome(self, fitting: list, paused: list) -> tuple[list, list]:
        """MAX_UTILIZATION's outcome; under an environment, any outcome of its shape (its loop is not
        one turn per request)."""
        if self.env is None:
            return fitting, paused
        return self.env.capacity(self, fitting, paused)

    # -- shared quantities ---------------------------------------------------------------
    def context_len(self, i: int):
        return self.p.slots[i]["prompt"] + self.x.req[i]["generated"]

    def remaining_context(self, i: int):
        return self.ops.ite(self.x.req[i]["phase"] == DECODING, 0, self.context_len(i) - self.x.req[i]["computed"])

    def is_context(self, i: int):
        ph = self.x.req[i]["phase"]
        return self.ops.or_(ph == WAITING, ph == PREFILLING, ph == PREEMPTED)

    def first_chunk(self, i: int):
        return self.ops.and_(self.is_context(i), self.x.req[i]["computed"] == 0)

    def started(self, i: int):
        """`_Pass.started` (S `is_started_request`)."""
        ops = self.ops
        return ops.or_(ops.and_(self.is_context(i), self.x.req[i]["computed"] > 0), self.dec[i])

    def reusable_blocks(self, i: int):
        """`_Pass.reusable_blocks`, on the current cache (allocation re-reads it: an earlier
        allocation of the batch may have evicted the entry)."""
        ops = self.ops
        if not self.o.enable_block_reuse:
            return 0
        e_blocks = TrtllmV1Core.entry(ops, self.p, self.x, i, "pc_blocks")
        pb = TrtllmV1Core.prefix_blocks(ops, self.k, self.p, i)
        return ops.ite(ops.and_(self.first_chunk(i), self.x.req[i]["shared_blocks"] == 0, ops.not_(e_blocks == 0)),
                       ops.min(e_blocks, pb), 0)

    def idle_cache_blocks(self):
        return self.ops.sum(self.ops.ite(r["pc_refs"] == 0, r["pc_blocks"], 0) for r in self.x.req)

    def free_for_scheduling(self):
        return self.x.g["free_blocks"] + self.idle_cache_blocks()

    def held(self, i: int):
        return self.x.req[i]["blocks"] + self.x.req[i]["shared_blocks"]

    def remaining_blocks_to_completion(self, i: int):
        ops, k, w = self.ops, self.k, self.p.slots[i]
        total = k.blocks_for(ops, w["prompt"] + w["max_new"] + self.o.draft_len)
        return ops.max(0, total - self.held(i) - self.reuse_blocks[i])

    def needed_blocks_one_step(self, i: int):
        ops, k, r, d = self.ops, self.k, self.x.req[i], self.o.draft_len
        decode = ops.max(0, k.blocks_for(ops, r["computed"] + 1 + d) - self.held(i))
        first = ops.max(0, k.blocks_for(ops, self.context_len(i) + d) - self.reuse_blocks[i])
        return ops.ite(self.dec[i], decode, ops.ite(self.first_chunk(i), first, 0))

    # -- the pass --------------------------------------------------------------------------
    def run(self) -> None:
        """`_Pass.run`."""
        ops, G, n = self.ops, self.G, self.n
        if self.o.capacity_scheduler_policy == GNE:
            fitting, paused = self.guaranteed_no_evict(), [False] * n
            # GNE's fitting list: the generation requests, then the contexts
            order = [(i, self.dec[i]) for i in range(n)] + [(i, ops.not_(self.dec[i])) for i in range(n)]
        else:
            fitting, paused = self.capacity_outcome(*self.max_utilization())
            order = [(i, True) for i in range(n)]
        error = self.micro_batch(fitting, order)
        with G.when(error):
            self.plan.raise_error(G, "crash")
        with G.when(ops.not_(error)):
            for i in range(n):
                if paused[i] is not False:   # constant folding only
                    with G.when(paused[i]):
                        self.pause(i)
            # the batch's order: the micro-batch appends generation requests and unchunked
            # contexts in fitting order, chunked contexts after them
            if self.k.chunked_prefill:
                order = [(i, self.dec[i]) for i in range(n)] + [(i, ops.not_(self.dec[i])) for i in range(n)]
            if self.o.enable_block_reuse:
                self.before, present = self.eviction_order()
            going = True
            allocated = [False] * n
            for i, pass_guard in order:
                going, x_free = self.seen("allocate", i, going=going, free_blocks=self.x.g["free_blocks"])
                self.x.g["free_blocks"] = x_free   # what the earlier allocations left (a view, not a write)
                turn = ops.and_(going, self.batched[i], pass_guard)
                if turn is False:   # constant folding only
                    continue
                with G.when(turn):
                    ok = self.allocate(i, self.drafts[i])
                    with G.when(ops.not_(ok)):
                        self.plan.raise_error(G, "crash")   # "Can't allocate new blocks"
                    allocated[i] = ops.or_(allocated[i], ops.and_(turn, ok))   # a slot may have two turns
                    going = ops.ite(G.guard, ok, going)
            if self.o.enable_block_reuse:
                self.close_up_ranks(present)
            going, = self.seen("allocate", None, going=going)
            with G.when(going):
                self.fit_token_budget(allocated)
            for i in range(n):
                if allocated[i] is not False:   # constant folding only
                    with G.when(allocated[i]):
                        self.plan.schedule(G, i, self.tokens[i], self.drafts[i], charge=self.charges[i])
            with G.when(going):
                self.check_forward_tokens()

    # -- capacity: S `GuaranteedNoEvictPolicy.schedule` -----------------------------------
    def guaranteed_no_evict(self) -> list:
        ops, k, n = self.ops, self.k, self.n
        avail = self.free_for_scheduling()
        count = 0
        fitting = [False] * n
        # generation requests: scheduled unconditionally, their worst case reserved; the loop
        # breaks once the batch is full (and then the context loop breaks at once too)
        for i in range(n):
            count, avail = self.seen("guaranteed_no_evict.generation", i, count=count, avail=avail)
            take = ops.and_(self.listed[i], self.dec[i], count < k.max_batch_size)
            fitting[i] = take
            count = ops.ite(take, count + 1, count)
            avail = ops.ite(take, avail - self.remaining_blocks_to_completion(i), avail)
        # contexts: the first whose worst case does not fit stops everything behind it
        going = True
        for i in range(n):
            going, count, avail = self.seen("guaranteed_no_evict.context", i, going=going, count=count, avail=avail)
            candidate = ops.and_(self.listed[i], ops.not_(self.dec[i]))
            need = self.remaining_blocks_to_completion(i)
            stop = ops.or_(count >= k.max_batch_size, need > avail)
            going = ops.and_(going, ops.not_(ops.and_(candidate, stop)))
            take = ops.and_(going, candidate)
            fitting[i] = ops.or_(fitting[i], take)
            count = ops.ite(take, count + 1, count)
            avail = ops.ite(take, avail - need, avail)
        return fitting

    # -- capacity: S `MaxUtilizationPolicy.schedule` --------------------------------------
    def max_utilization(self) -> tuple[list, list]:
        """The loop `while i < end` with a cursor `c` (a slot index) and `end`: each turn either
        schedules slot c, or pauses the last started request in [c, end) and moves `end` to it,
        or stops. Scheduled and paused slots are distinct listed slots and a stop changes nothing,
        so n turns suffice."""
        ops, k, n, x = self.ops, self.k, self.n, self.x
        avail = self.free_for_scheduling()
        used, count = 0, 0
        need = [self.needed_blocks_one_step(i) for i in range(n)]
        started = [ops.and_(self.listed[i], self.started(i)) for i in range(n)]
        # after[i]: the first listed slot >= i (n if none)
        after = [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            after[i] = ops.ite(self.listed[i], i, after[i + 1])
        c, end, live = after[0], n, True
        fitting, paused = [False] * n, [False] * n
        for _ in range(n):
            live = ops.and_(live, c < end)
            need_c = ops.sum(ops.ite(c == i, need[i], 0) for i in range(n))
            fits = ops.and_(count < k.max_batch_size, used + need_c <= avail)
            scheduled = ops.and_(live, fits)
            for i in range(n):
                fitting[i] = ops.or_(fitting[i], ops.and_(scheduled, c == i))
            used = ops.ite(scheduled, used + need_c, used)
            count = ops.ite(scheduled, count + 1, count)
            # the victim: the last started request in [c, end) (may be c itself)
            j = -1
            for i in range(n):
                j = ops.ite(ops.and_(started[i], c <= i, i < end), i, j)
            pause = ops.and_(live, ops.not_(fits), j >= 0)
            for i in range(n):
                victim = ops.and_(pause, j == i)
                paused[i] = ops.or_(paused[i], victim)
                avail = ops.ite(victim, avail + x.req[i]["blocks"], avail)   # shared blocks stay cached
            end = ops.ite(pause, j, end)
            c = ops.ite(scheduled, ops.sum(ops.ite(c == i, after[i + 1], 0) for i in range(n)), c)
            live = ops.and_(live, ops.or_(fits, j >= 0))
        return fitting, paused

    # -- micro-batch: S `PyMicroBatchScheduler.schedule` ----------------------------------
    def micro_batch(self, fitting: list, order: list):
        """Fills self.batched / tokens / drafts / charges per slot; returns the context-compute
        error (an unchunked context costing more than max_num_tokens)."""
        ops, k, n = self.ops, self.k, self.n
        M, d = k.max_num_tokens, self.o.draft_len
        self.batched, self.tokens, self.drafts, self.charges = [False] * n, [0] * n, [0] * n, [0] * n
        batch_tokens, count, going, error = 0, 0, True, False
        to_chunk = [False] * n
        chunked_compute, all_fit = 0, True
        for i, pass_guard in order:
            batch_tokens, count, going, error, chunked_compute, all_fit = self.seen(
                "micro_batch", i, batch_tokens=batch_tokens, count=count, going=going, error=error,
                chunked_compute=chunked_compute, all_fit=all_fit)
            here = ops.and_(going, fitting[i], pass_guard)
            if overlap(k):   # rule 2: GENERATION_TO_COMPLETE is outside the micro-batch's range: no seat, no tokens
                here = ops.and_(here, ops.not_(to_complete(ops, self.p, self.x, i)))
            dec = self.dec[i]
            t = 1 + d
            dec_over = batch_tokens + t > M
            take_dec = ops.and_(here, dec, ops.not_(dec_over))
            stop = ops.and_(here, dec, dec_over)
            ctx_here = ops.and_(here, ops.not_(dec))
            if not k.chunked_prefill:
                compute = self.whole_context_compute(i)
                too_big = ops.and_(ctx_here, compute > M)
                error = ops.or_(error, too_big)
                over = batch_tokens + compute > M
                take_ctx = ops.and_(ctx_here, ops.not_(compute > M), ops.not_(over))
                stop = ops.or_(stop, too_big, ops.and_(ctx_here, over))
                self.put(i, take_ctx, self.rem[i], d, compute)   # the whole context (K moves it past a reused prefix)
                batch_tokens = ops.ite(take_ctx, batch_tokens + compute, batch_tokens)
            else:
                compute = reuse_adjusted(ops, self.rem[i], self.reuse_tokens[i], self.rem[i]) + d
                all_fit = ops.and_(all_fit, ops.not_(ops.and_(ctx_here, compute > M)))
                chunked_compute = ops.ite(ctx_here, chunked_compute + ops.min(compute, M), chunked_compute)
                to_chunk[i] = ops.or_(to_chunk[i], ctx_here)
                take_ctx = ctx_here
            self.put(i, take_dec, 1, d, t)
            batch_tokens = ops.ite(take_dec, batch_tokens + t, batch_tokens)
            taken = ops.or_(take_dec, take_ctx)
            count = ops.ite(taken, count + 1, count)
            going = ops.and_(going, ops.not_(stop), ops.not_(ops.and_(taken, count >= k.max_batch_size)))
        batch_tokens, error, chunked_compute, all_fit = self.seen(
            "micro_batch", None, batch_tokens=batch_tokens, error=error, chunked_compute=chunked_compute,
            all_fit=all_fit)
        if k.chunked_prefill:
            all_fit = ops.and_(all_fit, ops.not_(chunked_compute > M - batch_tokens))
            capacity = M - batch_tokens
            chunks = self.chunk_fcfs(to_chunk, capacity)
            kept = self.fit_draft_tokens(to_chunk, chunks, capacity)
            for i in range(n):
                chunk = ops.ite(all_fit, self.rem[i], chunks[i])
                draft = ops.ite(chunk == self.rem[i], ops.ite(all_fit, d, kept[i]), 0)
                charge = reuse_adjusted(ops, chunk, self.reuse_tokens[i], self.rem[i]) + draft
                self.put(i, ops.and_(to_chunk[i], chunk > 0), chunk, draft, charge)
        return error

    def whole_context_compute(self, i: int):
        """What an unchunked context is charged: its context less the reused prefix, plus drafts."""
        ops = self.ops
        return ops.max(1, reuse_adjusted(ops, self.context_len(i), self.reuse_tokens[i], self.rem[i]) + self.o.draft_len)

    def put(self, i: int, cond, tokens, draft, charge) -> None:
        ops = self.ops
        self.batched[i] = ops.or_(self.batched[i], cond)
        self.tokens[i] = ops.ite(cond, tokens, self.tokens[i])
        self.drafts[i] = ops.ite(cond, draft, self.drafts[i])
        self.charges[i] = ops.ite(cond, charge, self.charges[i])

    def chunk_fcfs(self, to_chunk: list, capacity) -> list:
        """`_Pass.chunk_fcfs` (S `_chunk_fcfs`): in slot order, each takes what the compute
        capacity allows; a trimmed chunk is aligned down to the chunk unit."""
        ops, M, unit = self.ops, self.k.max_num_tokens, self.unit
        left = capacity
        chunks = [0] * self.n
        for i in range(self.n):
            left, = self.seen("chunk_fcfs", i, left=left)
            suggested = self.rem[i]
            reusable = ops.min(self.reuse_tokens[i], suggested)
            size = ops.ite(left < reuse_adjusted(ops, suggested, reusable, suggested), left, suggested)
            size = ops.ite(reuse_adjusted(ops, size, reusable, suggested) > M, ops.min(M, suggested), size)
            size = ops.ite(size < suggested, ops.div(size, unit) * unit, size)
            chunks[i] = size
            left = ops.ite(to_chunk[i], left - reuse_adjusted(ops, size, reusable, suggested), left)
        self.seen("chunk_fcfs", None, left=left)
        return chunks

    def fit_draft_tokens(self, to_chunk: list, chunks: list, capacity) -> list:
        """`_Pass.fit_draft_tokens` (S `_fit_draft_tokens`): a last chunk keeps drafts only in the
        free tail of its last chunk unit and within the compute capacity left."""
        ops, M, unit, d = self.ops, self.k.max_num_tokens, self.unit, self.o.draft_len
        if d == 0:
            return [0] * self.n
        used = self.seen_sum("fit_draft_tokens.start.used", [
            ops.ite(to_chunk[i], reuse_adjusted(ops, chunks[i], ops.min(self.reuse_tokens[i], self.rem[i]),
                                                self.rem[i]), 0) for i in range(self.n)])
        kept = [0] * self.n
        for i in range(self.n):
            used, = self.seen("fit_draft_tokens", i, used=used)
            chunk = chunks[i]
            last = ops.and_(to_chunk[i], chunk == self.rem[i])
            tail = chunk - ops.div(chunk, unit) * unit
            space = ops.max(0, ops.min(ops.ite(tail == 0, 0, unit - tail), M - chunk))
            fitted = ops.max(0, ops.min(d, ops.min(space, capacity - used)))
            kept[i] = ops.ite(last, fitted, 0)
            used = used + kept[i]
        self.seen("fit_draft_tokens", None, used=used)
        return kept

    # -- E `_pause_requests` ---------------------------------------------------------------
    def pause(self, i: int) -> None:
        """`_Pass.pause`: terminate (free KV), then `pause(max_input_len)`: generated tokens past
        max_input_len - prompt are dropped."""
        ops, G, r = self.ops, self.G, self.x.req[i]
        self.core.release(G, self.k, self.p, self.x, i)
        max_input_len = self.o.max_input_len or self.k.max_num_tokens
        cap = ops.max(0, max_input_len - self.p.slots[i]["prompt"])
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.set(r, "generated", ops.min(r["generated"], cap))
        G.set(r, "preemptions", r["preemptions"] + 1)
        self.plan.flag(G, "preempted", i)

    # -- K `KVCacheManager.prepare_resources` ----------------------------------------------
    def allocate(self, i: int, draft):
        """`_Pass.allocate`: a first context chunk first references the cached prefix; then the
        request grows to its context (+ drafts), or a decode to one more token (+ drafts).
        Returns whether the blocks were found."""
        ops, G, k, x = self.ops, self.G, self.k, self.x
        r = x.req[i]
        if self.o.enable_block_reuse:
            reused = self.reusable_blocks(i)
            with G.when(ops.not_(reused == 0)):
                for j, at in enumerate(homes(ops, self.p)[i]):
                    with G.when(at):
                        G.add(x.req[j], "pc_refs", 1)
                # `setPrepopulatedPromptLen`: the window moves right by the tokens reused now
                prepopulated = reused * k.block_size
                shifted = shifted_chunk(ops, prepopulated, self.tokens[i], self.context_len(i), k.block_size)
                self.tokens[i] = ops.ite(G.guard, shifted, self.tokens[i])
                G.set(r, "shared_blocks", reused)
                G.set(r, "computed", prepopulated)
        target = ops.ite(r["phase"] == DECODING, r["computed"] + 1 + draft, self.context_len(i) + draft)
        need = k.blocks_for(ops, target) - (r["blocks"] + r["shared_blocks"])
        ok = need <= 0
        with G.when(need > 0):
            room = self.make_room(need)
            with G.when(room):
                G.set(x.g, "free_blocks", x.g["free_blocks"] - need)
                G.set(r, "blocks", r["blocks"] + need)
            ok = ops.or_(ok, room)
        return ok

    def make_room(self, need):
        """`_Pass.make_room`: evict unreferenced entries in cache order while fewer than `need`
        blocks are free: an idle entry goes iff the free blocks plus the idle entries before it
        are still short (entries hold >= 1 block, so that sum only grows along the order)."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        free = x.g["free_blocks"]
        if not self.o.enable_block_reuse or ops.and_(G.guard, free < need) is False:
            return free >= need   # no cache, or (constant folding) no block short: nothing to evict
        c = [x.req[g] for g in range(n)]
        idle = [ops.and_(ops.not_(e["pc_blocks"] == 0), e["pc_refs"] == 0) for e in c]
        evicted = [ops.and_(idle[g], free + ops.sum(ops.ite(ops.and_(idle[h], self.before[h][g]), c[h]["pc_blocks"], 0)
                                                    for h in range(n) if h != g) < need) for g in range(n)]
        freed = ops.sum(ops.ite(evicted[g], c[g]["pc_blocks"], 0) for g in range(n))
        for g in range(n):
            with G.when(evicted[g]):
                G.set(c[g], "pc_blocks", 0)
                G.set(c[g], "pc_refs", 0)
        G.set(x.g, "free_blocks", free + freed)
        return free + freed >= need

    # -- the prefix cache's order ----------------------------------------------------------------
    # Entries are only added after the step (donate_prefixes), so while the batch allocates the
    # order of the surviving entries stays that of the pass's start: it is computed once, and the
    # ranks close up over the evicted entries once, after the batch.

    def eviction_order(self) -> tuple[list, list]:
        """before[h][g] (entry h is older than entry g), and which entries exist now."""
        ops, x, n = self.ops, self.x, self.n
        rank = [x.req[g]["pc_rank"] for g in range(n)]
        before = [[False if h == g else rank[h] < rank[g] for g in range(n)] for h in range(n)]
        return before, [ops.not_(x.req[g]["pc_blocks"] == 0) for g in range(n)]

    def close_up_ranks(self, present: list) -> None:
        """Each surviving entry moves up by the entries before it that the batch evicted."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        gone = [ops.and_(present[g], x.req[g]["pc_blocks"] == 0) for g in range(n)]
        ranks = [ops.ite(x.req[g]["pc_blocks"] == 0, 0, x.req[g]["pc_rank"] - ops.count(
            ops.and_(gone[h], self.before[h][g]) for h in range(n) if h != g)) for g in range(n)]
        for g in range(n):
            G.set(x.req[g], "pc_rank", ranks[g])

    def fit_token_budget(self, allocated: list) -> None:
        """`_Pass.fit_token_budget` (K `fit_token_budget`): over the budget with chunked prefill
        on, context chunks shrink, last chunks from the back of the batch first, then the others
        from the back, each to a block-aligned end and at least one block of progress. Contexts
        sit in the batch in slot order whatever the capacity policy, so "from the back" is
        descending slot order."""
        if not (self.o.token_budget_trim and self.k.chunked_prefill):
            return
        ops, k, n, x = self.ops, self.k, self.n, self.x
        bs = k.block_size
        guard = self.G.guard   # the pass allocated every request it scheduled (no trim after a failure)
        total = ops.sum(ops.ite(allocated[i], self.tokens[i] + self.drafts[i], 0) for i in range(n))
        total, = self.seen("fit_token_budget.start", None, total=total)
        excess = total - k.max_num_tokens
        contexts = [ops.and_(allocated[i], ops.not_(self.dec[i])) for i in range(n)]
        last = [ops.and_(contexts[i], x.req[i]["computed"] + self.tokens[i] >= self.context_len(i)) for i in range(n)]
        turns = [(i, last[i]) for i in reversed(range(n))] + \
                [(i, ops.and_(contexts[i], ops.not_(last[i]))) for i in reversed(range(n))]
        shed = 0
        for i, here in turns:
            shed, = self.seen("fit_token_budget", i, shed=shed)
            pos, cur = x.req[i]["computed"], self.tokens[i]
            end = ops.div(ops.max(0, pos + cur - (excess - shed)), bs) * bs
            new = ops.max(bs - (pos - ops.div(pos, bs) * bs), end - pos)
            shrink = ops.and_(guard, here, excess > 0, shed < excess, new < cur)
            shed = ops.ite(shrink, shed + cur - new, shed)
            self.tokens[i] = ops.ite(shrink, new, self.tokens[i])
            self.drafts[i] = ops.ite(shrink, 0, self.drafts[i])

    # -- ME `_prepare_tp_inputs` -------------------------------------------------------------
    def check_forward_tokens(self) -> None:
        """`_Pass.check_forward_tokens`: the tokens run, drafts included, must fit max_num_tokens."""
        total = self.ops.sum(self.plan.rec.tokens)
        with self.G.when(total > self.k.max_num_tokens):
            self.plan.raise_error(self.G, "crash")
