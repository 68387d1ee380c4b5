"""Hugging Face transformers continuous batching as a core: model/policies/hf_cb.py over slots.

Mirrors model/policies/hf_cb.py (`HfCb` and `_Pass`), which cites transformers 5.19.0
generation/continuous_batching: `_Pass.run` is continuous_api.py `prepare_next_batch` :482-536,
`_Pass.schedule_batch` is scheduler.py `FIFOScheduler` / `PrefillFirstScheduler.schedule_batch`
(`_process_candidates` :196-280), `_Pass.offload_requests` is offloading_manager.py
`offload_requests` :156-242 (soft reset, `block_new_requests`), `HfCb.schedule` adds the
empty-batch crash (continuous_api.py `_generation_step` :635). Each method below names the one it
re-expresses.

Subset:
- no prefix sharing: every request has prefix_group = -1 (refused otherwise). With
  allow_block_sharing on, a request's own fully written blocks are still hashed and stay
  occupied as cached blocks after its finish / cancel (the anonymous `PrefixEntry`), until the
  safety-margin check or an offload evicts them; that is modelled (`hashed`, `cached`);
- host_blocks = 0 (the engine-checked policy refuses more too): every offload is a soft reset;
- both scheduler types (fifo, prefill_first), any safety_margin, allow_block_sharing on or off;
- num_blocks <= MAX_NUM_BLOCKS (2^15): the float safety-margin test is an exact comparison of
  small integers up to there (`margin_threshold`), which keeps 32-bit terms from overflowing.
The policy's own configuration checks (page size >= 4, chunked prefill on, chunk unit <= 1) are
refused here as they are there. A symbolic checker must also pin prefix_group = -1.

Slot fields added to the shared ones:
- `act` / `wait`: the request's index in SCH `active_requests` / `waiting_requests_order`
  (-1 when not in it). Between steps they are 0..len-1 as in `Sched.active` / `Sched.waiting`;
  inside a step they are only order keys (a removal leaves a gap, an append takes a key above
  all others) and `_compact` renumbers them at the end of `schedule` and `after_step`;
- `hashed`: `Sched.hashed` (full blocks hashed so far, -1 = no entry);
- globals `block_new` (`Sched.block_new`) and `cached` (blocks of the anonymous cache entry).

How `prepare_next_batch`'s loop "while schedule_batch returns None: offload" is unrolled. A call
that returns None scheduled nothing, so nothing it looked at changed: every candidate was
examined independently against the same free count, and every active request failed its
allocation (none is skipped by the read budget: a request's computed tokens fit in its own
blocks). So the call, and the offload after it, are closed forms (`probe`, `offload_requests`),
and the sequential fold over the candidates (`schedule_batch`) is needed only once, for the call
that does not return None. At most two calls return None: the first offload evicts every cached
block and either offloads until the remaining starved requests fit (the next call then
schedules its first candidate) or leaves one active request; so a second None is followed by an
offload that can neither evict nor offload (returns False): the fatal error. The differential
tests hold this to the engine-checked loop.

The offload loop (OM :183-199) pops the newest starved request while more than one request is
active and the starved requests' needs exceed the free blocks. Its condition only weakens as it
pops (fewer needs, more free blocks, fewer active), so a starved request is offloaded exactly
when the condition holds with it and every newer starved request popped: a closed form too.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Optional

from ...config import ConfigError, EngineConfig
from ...policies.hf_cb import ANON, DEFAULT_SAFETY_MARGIN
from ...policy import POLICIES
from ..core import Core, Plan, register
from ..ops import Guarded
from ..slots import DECODING, FAILED, PREEMPTED, PREFILLING, WAITING, Knobs, Params, SlotState


MAX_NUM_BLOCKS = 1 << 15   # the margin test below is exact up to this many blocks


@functools.lru_cache(maxsize=None)
def margin_threshold(margin: float, most: int = MAX_NUM_BLOCKS) -> tuple[int, int]:
    """`free / capacity >= margin` (SCH `_try_to_meet_safety_margin` :179-194), a float comparison,
    as `free * den >= num * capacity` with small integers, exact for every capacity <= `most`.

    The quotient of two Python ints is correctly rounded, so it is >= margin iff the exact quotient
    is >= t (or > t, on a tie that rounds down), t the midpoint between margin and the float below
    it. Those quotients with capacity <= most are an up-set of the fractions with denominator
    <= most, so they are exactly the ones >= their smallest member num / den, which is returned
    (den <= most keeps the products below 2^30: no overflow on 32-bit terms)."""
    below = math.nextafter(margin, -math.inf)
    t = (Fraction(below) + Fraction(margin)) / 2
    inclusive = float(t) >= margin
    best = (1, 1) if margin <= 1 else None
    for q in range(1, most + 1):
        p = -(-t.numerator * q // t.denominator) if inclusive else t.numerator * q // t.denominator + 1
        p = max(p, 0)
        if best is None or p * best[1] < best[0] * q:
            best = (p, q)
    return best


@register
class HfCbCore(Core):
    policy = "hf_cb"
    extra_req_fields = {"act": int, "wait": int, "hashed": int}
    extra_global_fields = {"block_new": bool, "cached": int}

    # -- what the core covers --------------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None):
        try:
            POLICIES[self.policy].check_config(cfg)   # page size, chunked prefill, chunk unit, host_blocks
        except ConfigError as e:
            return (e.field, e.reason)
        if cfg.num_blocks > MAX_NUM_BLOCKS:
            return ("engine.num_blocks", f"the symbolic hf_cb core's safety-margin test is exact up to "
                                         f"{MAX_NUM_BLOCKS} blocks")
        if params is not None:
            for w in params.slots:
                group = w["prefix_group"]
                if isinstance(group, int) and group >= 0:
                    return ("requests.prefix_group",
                            "the symbolic hf_cb core does not model prefix sharing between requests; "
                            "drop prefix_group (the simulator covers it)")
        return None

    # -- states --------------------------------------------------------------------------
    def initial_req_extra(self, ops, k, p, i):
        return self.absent_req_extra(i)

    def initial_global_extra(self, ops, k, p):
        return {"block_new": False, "cached": 0}

    def absent_req_extra(self, i):
        return {"act": -1, "wait": -1, "hashed": -1}

    def abstract_req_extra(self, cfg, state, rid):
        s = state.sched
        return {"act": s.active.index(rid) if rid in s.active else -1,
                "wait": s.waiting.index(rid) if rid in s.waiting else -1,
                "hashed": dict(s.hashed).get(rid, -1)}

    def abstract_global_extra(self, cfg, state):
        return {"block_new": state.sched.block_new,
                "cached": sum(e.blocks for e in state.prefix_cache if e.group == ANON)}

    def cached_blocks(self, ops, k, p, s):
        """Blocks of finished / cancelled requests kept as cached blocks (the anonymous entry)."""
        return s.g["cached"]

    def core_invariants(self, ops, k, p, s):
        """The queues match the phases (`Sched.active` holds the running requests, the waiting
        queue the queued ones; failed requests, only on a dead engine, keep their places), positions are
        distinct and compact, a queued request holds nothing, hashed blocks are held blocks."""
        inv = {}
        n = len(s)
        acts = [r["act"] for r in s.req]
        waits = [r["wait"] for r in s.req]
        n_act = ops.count(a >= 0 for a in acts)
        n_wait = ops.count(w >= 0 for w in waits)
        for i, r in enumerate(s.req):
            ph = r["phase"]
            running = ops.or_(ph == PREFILLING, ph == DECODING)
            queued = ops.or_(ph == WAITING, ph == PREEMPTED)
            in_act, in_wait = r["act"] >= 0, r["wait"] >= 0
            inv[f"r{i}.hf-queues"] = ops.and_(
                r["act"] >= -1, r["wait"] >= -1, r["act"] < n_act, r["wait"] < n_wait,
                ops.implies(running, ops.and_(in_act, ops.not_(in_wait))),
                ops.implies(queued, ops.and_(in_wait, ops.not_(in_act), r["blocks"] == 0, r["computed"] == 0)),
                ops.implies(ops.and_(ops.not_(running), ops.not_(queued), ph != FAILED),
                            ops.and_(ops.not_(in_act), ops.not_(in_wait))),
                ops.not_(ops.and_(in_act, in_wait)),
                ops.implies(ph == FAILED, s.g["error"]))     # only a dead engine fails requests
            inv[f"r{i}.hf-hashed"] = ops.and_(r["hashed"] >= -1, r["hashed"] <= r["blocks"],
                                              ops.implies(r["hashed"] >= 0, running))
            for j in range(i + 1, n):
                inv[f"r{i}.r{j}.hf-queue-order"] = ops.and_(ops.implies(in_act, r["act"] != acts[j]),
                                                            ops.implies(in_wait, r["wait"] != waits[j]))
        inv["hf-cached"] = s.g["cached"] >= 0
        return inv

    # -- hooks HfCb overrides ----------------------------------------------------------------
    def arrive(self, G, k, p, x, plan, i):
        """HfCb.arrive: appended to the waiting FIFO (SCH `add_waiting_request` :57-60); the
        arrivals of one step in slot order, after everything already waiting (ranks < n)."""
        super().arrive(G, k, p, x, plan, i)
        G.set(x.req[i], "wait", len(x) + i)

    def cancel(self, G, k, p, x, i):
        """HfCb.cancel (SCH `clear_cancelled_requests` :95-110): blocks released with caching, out of
        both queues; block_new_requests is left as it is."""
        super().cancel(G, k, p, x, i)
        self.forget(G, x, i)

    def finish(self, G, k, p, x, i):
        """HfCb.finish (API `update_batch` :567-569): released, out of the queues, block_new = False."""
        super().finish(G, k, p, x, i)
        self.forget(G, x, i)
        G.set(x.g, "block_new", False)

    def release(self, G, k, p, x, i, no_cache: bool = False):
        """hf_cb `_release` without shared blocks: the hashed blocks stay occupied as cached blocks
        (unless no_cache: offload, OM:198), the others go back to the pool; the hash entry goes."""
        ops = G.ops
        r = x.req[i]
        keep = 0 if no_cache else ops.min(ops.max(r["hashed"], 0), r["blocks"])
        G.set(x.g, "free_blocks", x.g["free_blocks"] + r["blocks"] - keep)
        if not no_cache:
            G.set(x.g, "cached", x.g["cached"] + keep)
        G.set(r, "hashed", -1)
        G.set(r, "blocks", 0)
        G.set(r, "host_blocks", 0)
        G.set(r, "suspended", False)

    def after_step(self, G, k, p, x, plan):
        """HfCb.after_step (API `update_batch` :564-574 -> C `mark_complete_blocks`): every scheduled
        request still running has its full blocks hashed (computed // page)."""
        ops = G.ops
        if k.options.allow_block_sharing:
            for i, r in enumerate(x.req):
                running = ops.or_(r["phase"] == PREFILLING, r["phase"] == DECODING)
                with G.when(ops.and_(plan.rec.flags["scheduled"][i], running)):
                    G.set(r, "hashed", ops.max(r["hashed"], ops.div(r["computed"], k.block_size)))
        self.compact(G, x, "act")    # finishes left gaps
        super().after_step(G, k, p, x, plan)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """HfCb.schedule: `_Pass.run`, then the empty-batch crash (API `_generation_step` :635)."""
        _Pass(self, G, k, p, x, plan).run()
        self.compact(G, x, "act")
        self.compact(G, x, "wait")

    # -- queue helpers -------------------------------------------------------------------------
    @staticmethod
    def forget(G, x, i):
        """hf_cb `_forget`: out of active_requests and the waiting queue."""
        G.set(x.req[i], "act", -1)
        G.set(x.req[i], "wait", -1)

    @staticmethod
    def compact(G, x, field):
        """Order keys back to positions 0..len-1 (a representation step; the engine state is the
        same ordered tuple)."""
        ops = G.ops
        keys = [r[field] for r in x.req]
        for i, r in enumerate(x.req):
            pos = ops.count(ops.and_(keys[j] >= 0, keys[j] < keys[i]) for j in range(len(keys)) if j != i)
            G.set(r, field, ops.ite(keys[i] >= 0, pos, -1))


class _Pass:
    """One call of API `prepare_next_batch` (model/policies/hf_cb.py `_Pass`), over slots."""

    def __init__(self, core: HfCbCore, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan):
        self.core = core
        self.G, self.ops, self.k, self.o, self.p, self.x, self.plan = G, G.ops, k, k.options, p, x, plan
        self.n = len(x)
        margin = self.o.safety_margin
        margin = DEFAULT_SAFETY_MARGIN[self.o.scheduler_type] if margin is None else margin
        self.margin_num, self.margin_den = margin_threshold(margin)
        # INIT `update_cb_config` :306: max_requests_per_batch = min(max_requests_per_batch, max_batch_tokens)
        self.max_requests = self.ops.min(k.max_batch_size, k.max_num_tokens)
        # Order keys of appended entries, above every key already in the queue: admissions to
        # active_requests n + candidate index; soft resets of the first offload 2n + key, of the
        # one after the batch 4n + key (keys of active requests are < 2n).
        self.wait_base = [2 * self.n, 4 * self.n]

    # -- small helpers -------------------------------------------------------------------
    def r(self, i: int) -> dict:
        return self.x.req[i]

    def length(self, i: int):
        """Query tokens the request asks for: 1 when decoding, else the rest of its context."""
        r = self.r(i)
        return self.ops.ite(r["phase"] == DECODING, 1, self.p.slots[i]["prompt"] + r["generated"] - r["computed"])

    def needs(self, comp, blocks, q):
        """FA `_compute_blocks_needed` :118-122: ceil((position_offset + q) / page) - blocks held."""
        return self.ops.max(0, self.ops.cdiv(comp + q, self.k.block_size) - blocks)

    def in_margin(self):
        """free / capacity >= margin, exactly as the float comparison (`margin_threshold`)."""
        return self.x.g["free_blocks"] * self.margin_den >= self.margin_num * self.k.num_blocks

    def candidates(self):
        """`_Pass.candidates` (R2/R3): (is a candidate, order key, is active) per slot. Active
        DECODING then the other active requests (prefill_first: the other way round), in
        active-dict order, then the waiting FIFO unless block_new_requests."""
        ops, n = self.ops, self.n
        dec_first = self.o.scheduler_type == "fifo"
        cand, key, active = [], [], []
        for r in self.x.req:
            act = r["act"] >= 0
            dec = r["phase"] == DECODING
            cls = ops.ite(dec, 0 if dec_first else 1, 1 if dec_first else 0)
            waiting = ops.and_(r["wait"] >= 0, ops.not_(self.x.g["block_new"]))
            cand.append(ops.or_(act, waiting))
            key.append(ops.ite(act, cls * n + r["act"], 2 * n + r["wait"]))
            active.append(act)
        return cand, key, active

    # -- API `prepare_next_batch` :482-536 -------------------------------------------------
    def run(self) -> None:
        """`_Pass.run`: nothing pending -> idle; up to two calls that return None, each followed by
        an offload (False => the fatal RuntimeError :509); then the call that schedules."""
        ops, G, x = self.ops, self.G, self.x
        pending = ops.or_(*[ops.or_(r["act"] >= 0, r["wait"] >= 0) for r in x.req])   # :495-496
        with G.when(pending):
            none1, starved, key, need = self.probe()
            ok1 = False
            with G.when(none1):
                ok1 = self.offload_requests(starved, key, need, self.wait_base[0])
            none2 = False
            with G.when(ops.and_(none1, ok1)):
                none2 = self.probe()[0]
            # the second offload can neither evict nor offload (module docstring): False
            dead = ops.and_(none1, ops.or_(ops.not_(ok1), none2))
            with G.when(dead):
                self.plan.raise_error(G, "deadlock")                         # :509
            with G.when(ops.not_(dead)):
                self.schedule_batch()

    def probe(self):
        """`_Pass.schedule_batch` when it returns None (R13): (returns None, starved, key, need).
        Nothing is scheduled then, so each candidate meets the same budgets and free count: it is
        skipped (read budget), fits, or fails; None iff none fits and one fails."""
        ops, k, x = self.ops, self.k, self.x
        self.meet_safety_margin()
        cand, key, active = self.candidates()
        read_budget = k.num_blocks * k.block_size
        free = x.g["free_blocks"]
        fits, fails, starved, need = [], [], [], []
        for i, r in enumerate(x.req):
            q = ops.min(self.length(i), k.max_num_tokens)
            nd = self.needs(r["computed"], r["blocks"], q)
            examined = ops.and_(cand[i], ops.not_(read_budget < r["computed"]))
            fits.append(ops.and_(examined, nd <= free))
            fails.append(ops.and_(examined, nd > free))
            starved.append(ops.and_(fails[-1], active[i]))
            need.append(nd)
        none = ops.and_(ops.not_(ops.or_(*fits)), ops.or_(*fails))
        return none, starved, key, need

    def schedule_batch(self) -> None:
        """`_Pass.schedule_batch` (SCH `_process_candidates` :196-280) when it does not return None,
        then the offload of the starved requests (API:519-520) and the empty-batch crash. The
        candidates are visited in order: position t is the candidate whose key has t below it."""
        ops, G, k, x, n = self.ops, self.G, self.k, self.x, self.n
        in_margin = self.meet_safety_margin()                                # :217
        cand, key, active = self.candidates()
        pos = [ops.count(ops.and_(cand[j], key[j] < key[i]) for j in range(n) if j != i) for i in range(n)]
        dec = [r["phase"] == DECODING for r in x.req]
        length = [self.length(i) for i in range(n)]
        token_budget = k.max_num_tokens                                      # API:499-501
        read_budget = k.num_blocks * k.block_size                            # C:228
        request_budget = self.max_requests                                   # :214
        stopped = False
        scheduled = False
        starved = [False] * n
        starved_need = [0] * n
        # The free count the loop sees, and each slot's allocation; the state takes them after the
        # loop, as free - sum(allocations), so block conservation is evident to a solver.
        free = x.g["free_blocks"]
        alloc = [0] * n
        for t in range(n):
            sel = [ops.and_(cand[i], pos[i] == t) for i in range(n)]

            def pick(vals):
                return ops.sum(ops.ite(sel[i], vals[i], 0) for i in range(n))

            live = ops.and_(ops.or_(*sel), ops.not_(stopped))
            is_dec = ops.or_(*[ops.and_(sel[i], dec[i]) for i in range(n)])
            margin_stop = ops.and_(live, ops.not_(in_margin), scheduled, ops.not_(is_dec))   # :221-222 (R6)
            stopped = ops.or_(stopped, margin_stop)
            live = ops.and_(live, ops.not_(margin_stop))
            comp = pick([r["computed"] for r in x.req])
            q = ops.min(pick(length), token_budget)                          # :227 (R7)
            examined = ops.and_(live, ops.not_(read_budget < comp))          # :237-238 (R12)
            need = self.needs(comp, pick([r["blocks"] for r in x.req]), q)
            fits = need <= free                                              # C:248-273 (R8)
            failed = ops.and_(examined, ops.not_(fits))
            ok = ops.and_(examined, fits)
            for i in range(n):                                               # :245-246 (R9)
                hit = ops.and_(failed, sel[i], active[i])
                starved[i] = ops.or_(starved[i], hit)
                starved_need[i] = ops.ite(hit, need, starved_need[i])
            free = ops.ite(ok, free - need, free)
            for i in range(n):
                with G.when(ops.and_(ok, sel[i])):
                    alloc[i] = ops.ite(G.guard, need, alloc[i])
                    self.admit(i, t)
                    self.plan.schedule(G, i, q)
            token_budget = ops.ite(ok, token_budget - q, token_budget)      # :257-259 (R10)
            read_budget = ops.ite(ok, read_budget - comp, read_budget)
            request_budget = ops.ite(ok, request_budget - 1, request_budget)
            scheduled = ops.or_(scheduled, ok)
            full = ops.or_(token_budget == 0, read_budget <= 0, request_budget <= 0)
            stopped = ops.or_(stopped, ops.and_(ok, full))                 # :275-276 (R11)
        self.allocate(alloc)
        # `run` :515-520: a non-empty batch with starved requests left offloads once more.
        with G.when(ops.and_(scheduled, ops.or_(*starved))):
            self.offload_requests(starved, key, starved_need, self.wait_base[1])
        # HfCb.schedule: a batch of zero query tokens crashes the forward pass.
        empty = ops.sum(self.plan.rec.tokens) == 0
        with G.when(ops.and_(scheduled, empty)):
            self.plan.raise_error(G, "crash")

    def admit(self, i: int, t: int) -> None:
        """`_Pass.allocate`, queues: a waiting request enters active_requests at the end and leaves
        the waiting queue."""
        G, r = self.G, self.r(i)
        with G.when(r["act"] < 0):
            G.set(r, "act", self.n + t)
            G.set(r, "wait", -1)

    def allocate(self, alloc: list) -> None:
        """`_Pass.allocate`, blocks (FA `allocate_cache_to_request` :129-135) of the whole batch."""
        G, x = self.G, self.x
        G.set(x.g, "free_blocks", x.g["free_blocks"] - self.ops.sum(alloc))
        for r, a in zip(x.req, alloc):
            G.set(r, "blocks", r["blocks"] + a)

    def meet_safety_margin(self):
        """`_Pass.meet_safety_margin` (SCH :179-194, R5): out of margin, every cached block is
        evicted and the margin looked at again. Evicting twice is a no-op, so a later call of it
        on the same state gives the same answer."""
        ops, G = self.ops, self.G
        before = self.in_margin()
        with G.when(ops.not_(before)):
            self.evict_cached_blocks()
        return ops.or_(before, self.in_margin())

    def evict_cached_blocks(self):
        """`_Pass.evict_cached_blocks` (C :359-369): all cached blocks back to the pool; true if any."""
        G, g = self.G, self.x.g
        evicted = g["cached"] > 0
        G.set(g, "free_blocks", g["free_blocks"] + g["cached"])
        G.set(g, "cached", 0)
        return evicted

    # -- OM `offload_requests` :156-242 (R16) ---------------------------------------------
    def offload_requests(self, starved, key, need, wait_base):
        """`_Pass.offload_requests`, closed form (module docstring): starved request i is offloaded
        iff, with every newer starved request already popped, more than one request is still
        active and the needs of i and the older starved requests exceed the free blocks plus the
        blocks the popped ones returned. Returns its truth value (evicted or offloaded)."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        evicted = self.evict_cached_blocks()                                 # :167
        free = x.g["free_blocks"]
        num_active = ops.count(r["act"] >= 0 for r in x.req)                 # :180
        off = []
        for i in range(n):
            newer = [ops.and_(starved[j], key[j] > key[i]) for j in range(n)]
            rest_need = ops.sum(ops.ite(ops.and_(starved[j], ops.not_(newer[j])), need[j], 0) for j in range(n))
            freed = ops.sum(ops.ite(newer[j], x.req[j]["blocks"], 0) for j in range(n))
            off.append(ops.and_(starved[i], num_active - ops.count(newer) > 1, rest_need > free + freed))
        for i in range(n):                                                   # :198, :209-234
            with G.when(off[i]):
                self.soft_reset(i, wait_base + key[i])
        offloaded = ops.or_(*off)
        with G.when(offloaded):
            G.set(x.g, "block_new", True)                                    # :236
        return ops.or_(evicted, offloaded)

    def soft_reset(self, i: int, wait_key) -> None:
        """`_Pass.soft_reset` (OM :230-234): blocks back without caching, restarted with prompt +
        generated as its prompt, at the end of the waiting queue (oldest first: by key)."""
        G, r = self.G, self.r(i)
        self.core.release(G, self.k, self.p, self.x, i, no_cache=True)
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.add(r, "preemptions", 1)
        G.set(r, "act", -1)
        G.set(r, "wait", wait_key)
        self.plan.flag(G, "preempted", i)
