"""Hugging Face transformers continuous batching as a core: model/policies/hf_cb.py over slots.

Mirrors model/policies/hf_cb.py (`HfCb`, `_Pass` and the prefix-cache helpers `_hash_blocks`,
`_release`), which cites transformers 5.19.0 generation/continuous_batching: `_Pass.run` is
continuous_api.py `prepare_next_batch` :482-536, `_Pass.schedule_batch` is scheduler.py
`FIFOScheduler` / `PrefillFirstScheduler.schedule_batch` (`_process_candidates` :196-280),
`_Pass.match_prefix` is scheduler.py `_infer_request_tokens` :118-139 (cache.py `search_prefix_match`
:308-333), `_Pass.offload_requests` is offloading_manager.py `offload_requests` :156-242 (soft reset,
`block_new_requests`), `HfCb.after_step` is cache.py `mark_complete_blocks` :348-357 (cache_allocator.py
:290-311), `HfCb.schedule` adds the empty-batch crash (continuous_api.py `_generation_step` :635).
Each method below names the one it re-expresses.

Subset: everything of the engine-checked policy. Both scheduler types, any safety_margin,
allow_block_sharing on or off, prefix groups (`prefix_group`, `prefix_len`: any group ids and
lengths, concrete or symbolic) with matching, de-duplication, reference counts, cached blocks and
offloads that free nothing. Refused (`unsupported`), one line each:
- what the policy itself refuses (`HfCb.check_config`: page size < 4, chunked prefill off, chunk
  unit > 1, host_blocks > 0 -- the CPU offload pool is not modelled by the policy either, so every
  offload is a soft reset);
- num_blocks > MAX_NUM_BLOCKS (2^15): the float safety-margin test is an exact comparison of small
  integers up to there (`margin_threshold`), which keeps 32-bit terms from overflowing.

Slot fields added to the shared ones:
- `act` / `wait`: the request's index in SCH `active_requests` / `waiting_requests_order`
  (-1 when not in it). Between steps they are 0..len-1 as in `Sched.active` / `Sched.waiting`;
  inside a step they are only order keys (a removal leaves a gap, an append takes a key above
  all others: `_Pass.KEYS`) and `compact` renumbers them at the end of `schedule` and `after_step`;
- `hashed`: `Sched.hashed` (full blocks hashed so far, -1 = no entry);
- `shared_blocks`: `Request.shared_blocks` (prefix blocks of its group it references);
- `pc_blocks`: in the first slot of a prefix group (its home, `trtllm_v1.homes`), how many of the
  group's prefix blocks exist (the group's `PrefixEntry.blocks`); 0 elsewhere;
- globals `block_new` (`Sched.block_new`) and `cached` (blocks of the anonymous cache entry).

The prefix cache in one number per group. The policy keeps one reference count per prefix block
(`Sched.slots`: -1 = no hashed block, 0 = cached, else the requests referencing it); here they follow
from E = `pc_blocks` and the members' `shared_blocks`:
- a request references blocks 0 .. shared_blocks - 1 of its group (it acquires a matched run from
  block 0, and hashes its blocks in order), so block i's count is the number of members with
  shared_blocks > i: counts never grow along the blocks;
- the existing blocks are 0 .. E - 1: a block is registered only by a request that holds every
  block before it; eviction drops the unreferenced ones, and an offload's release those whose count
  falls to 0 -- each time a top run, as counts never grow along the blocks;
- so a group's cached blocks are E - M, M = the largest shared_blocks of its members (`top`), and
  releasing a set of members without caching frees E - M(the others): nothing when another member
  still holds every block the released ones held (seeds.md 1).
tests/symbolic/test_core_hf_cb.py rebuilds `Sched.slots` and the `PrefixEntry`s from the slots on every
state of random runs and finds the policy's own.

How `prepare_next_batch`'s loop "while schedule_batch returns None: offload" is unrolled. A call
that returns None scheduled nothing; what it changed is only that each waiting candidate with a
prefix match was moved to active_requests with its matched blocks (`match_prefix` runs before the
allocation check and persists). Matches do not change what any candidate is measured against (the
free count, the group's existing blocks, the budgets), so every candidate was examined independently
against the same free count, and every active request (the matched ones included) failed its
allocation (none is skipped by the read budget: a request's computed tokens fit in its own blocks).
So the call, and the offload after it, are closed forms (`probe`, `offload_requests`), and the
sequential fold over the candidates (`schedule_batch`) is needed only once, for the call that does
not return None. At most two calls return None: the first offload evicts every cached block and
either offloads until the remaining starved requests fit (the next call then schedules one of them)
or leaves one active request; so a second None is followed by an offload that can neither evict nor
offload (returns False): the fatal error. The differential tests hold this to the engine-checked loop.

The offload loop (OM :183-199) pops the newest starved request while more than one request is
active and the starved requests' needs exceed the free blocks. Its condition only weakens as it
pops (fewer needs, more free blocks: own blocks and the group blocks no one else holds), so a
starved request is offloaded exactly when the condition holds with it and every newer starved
request popped: a closed form too.

One request among any number (checkers/parametric/local_hf.py). What a request's step reads of the
others is named where it is read (`Plan.seen`, `Plan.at_turn`: the others' share of a closed form,
the scheduling loop's running values at the request's turn, ranks, a group's count in its home
slot); the pass's decisions (`Plan.decided`) and what the argument picks requests out by
(`Plan.note`) too.
With no environment these return their input (or do nothing), so the core is unchanged.

Acceleration (`decode_guard` / `decode_advance`): m identical pure-decode steps as one transition.
Every active request decodes, all of them fit the batch, the token budget, the read budget and
(their growth over the m steps) the free pool; none finishes or stops, none has prefix blocks left
to hash; nothing arrives or is cancelled; eviction changes nothing (no cached block, or in margin at
every step); and no waiting candidate is reached, or each one reached has no prefix match and does
not fit what the decoders leave at the first step, hence at every step (the free pool only shrinks).
checkers/accel.py proves it equal to m single steps.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Optional

from ...config import ConfigError, EngineConfig
from ...policies.hf_cb import ANON, DEFAULT_SAFETY_MARGIN
from ...policy import POLICIES
from ...state import State
from ..core import Core, Plan, register
from ..ops import Guarded
from ..slots import DECODING, FAILED, PREEMPTED, PREFILLING, WAITING, Knobs, Params, SlotState
from .trtllm_v1 import homes

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


def floor_div(ops, k: Knobs, t):
    """t // block_size for t >= -1, written with the page count (pages(t + 1) - 1) so that the
    acceleration proofs may leave page counts uninterpreted (ops.MonotonePages)."""
    return k.blocks_for(ops, t + 1) - 1


def running(ops, r: dict):
    return ops.or_(r["phase"] == PREFILLING, r["phase"] == DECODING)


@register
class HfCbCore(Core):
    policy = "hf_cb"
    extra_req_fields = {"act": int, "wait": int, "hashed": int, "shared_blocks": int, "pc_blocks": int}
    extra_global_fields = {"block_new": bool, "cached": int}
    accelerates = True

    # -- what the core covers --------------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None):
        try:
            POLICIES[self.policy].check_config(cfg)   # page size, chunked prefill, chunk unit, host_blocks
        except ConfigError as e:
            return (e.field, e.reason)
        if cfg.num_blocks > MAX_NUM_BLOCKS:
            return ("engine.num_blocks", f"the symbolic hf_cb core's safety-margin test is exact up to "
                                         f"{MAX_NUM_BLOCKS} blocks")
        return None

    # -- states --------------------------------------------------------------------------
    def initial_req_extra(self, ops, k, p, i):
        return self.absent_req_extra(i)

    def initial_global_extra(self, ops, k, p):
        return {"block_new": False, "cached": 0}

    def absent_req_extra(self, i):
        return {"act": -1, "wait": -1, "hashed": -1, "shared_blocks": 0, "pc_blocks": 0}

    def abstract_req_extra(self, cfg, state, rid):
        s = state.sched
        return {"act": s.active.index(rid) if rid in s.active else -1,
                "wait": s.waiting.index(rid) if rid in s.waiting else -1,
                "hashed": dict(s.hashed).get(rid, -1),
                "shared_blocks": state.req(rid).shared_blocks, "pc_blocks": 0}

    def abstract(self, cfg: EngineConfig, state: State, n: int) -> SlotState:
        """Core.abstract, then each group's existing prefix blocks in its home slot."""
        s = super().abstract(cfg, state, n)
        for group, counts in state.sched.slots:
            home = min(r.rid for r in state.requests if r.prefix_group == group)
            s.req[home]["pc_blocks"] = sum(1 for c in counts if c >= 0)
        return s

    def abstract_global_extra(self, cfg, state):
        return {"block_new": state.sched.block_new,
                "cached": sum(e.blocks for e in state.prefix_cache if e.group == ANON)}

    def cached_blocks(self, ops, k, p, s):
        """Blocks held by the cache rather than by one request: the anonymous entry (own blocks of
        finished / cancelled requests) and every existing prefix block (each counted once, however
        many requests reference it; `State.cached_blocks`)."""
        return s.g["cached"] + ops.sum(r["pc_blocks"] for r in s.req)

    def shared_blocks(self, ops, k, p, s, i):
        return s.req[i]["shared_blocks"]

    def cache_refs(self, ops, k, p, s):
        """`PrefixEntry.refs` summed: a group entry counts its members referencing a prefix block
        (`_set_slots`); the anonymous entry counts none."""
        return ops.count(r["shared_blocks"] > 0 for r in s.req)

    def core_invariants(self, ops, k, p, s):
        """The queues match the phases (`Sched.active` holds the running requests, the waiting
        queue the queued ones; failed requests, only on a dead engine, keep their places), positions are
        distinct and compact, a queued request holds nothing, hashed blocks are held blocks; a request
        references prefix blocks of its group only while running, as many as it has hashed (up to the
        prefix's full blocks), all of them existing; a group's count lives in its home slot. What of
        these holds of a request alone is `alone_invariants`."""
        inv = {}
        n = len(s)
        acts = [r["act"] for r in s.req]
        waits = [r["wait"] for r in s.req]
        n_act = ops.count(a >= 0 for a in acts)
        n_wait = ops.count(w >= 0 for w in waits)
        home = homes(ops, p)
        for i, r in enumerate(s.req):
            alone = self.alone_invariants(ops, k, p, s, i)
            inv[f"r{i}.hf-queues"] = ops.and_(alone[f"r{i}.hf-queue-places"], r["act"] < n_act, r["wait"] < n_wait)
            inv[f"r{i}.hf-hashed"] = alone[f"r{i}.hf-hashed"]
            inv[f"r{i}.hf-shared"] = ops.and_(alone[f"r{i}.hf-shared-own"],
                                              r["shared_blocks"] <= self.entry(ops, p, s, i))
            inv[f"r{i}.hf-home"] = ops.and_(r["pc_blocks"] >= 0, ops.implies(r["pc_blocks"] > 0, home[i][i]))
            in_act, in_wait = r["act"] >= 0, r["wait"] >= 0
            for j in range(i + 1, n):
                inv[f"r{i}.r{j}.hf-queue-order"] = ops.and_(ops.implies(in_act, r["act"] != acts[j]),
                                                            ops.implies(in_wait, r["wait"] != waits[j]))
        inv["hf-cached"] = s.g["cached"] >= 0
        return inv

    def alone_invariants(self, ops, k, p, s, i: int) -> dict:
        """The parts of `core_invariants` about request i alone (checkers/parametric/local_hf.py keeps
        them one request at a time): its queue places match its phase and a queued request holds
        nothing; its hashed count is within what it holds; it references prefix blocks only while
        running, exactly its hashed ones up to its prefix's full blocks."""
        r, ph = s.req[i], s.req[i]["phase"]
        run = running(ops, r)
        queued = ops.or_(ph == WAITING, ph == PREEMPTED)
        in_act, in_wait = r["act"] >= 0, r["wait"] >= 0
        return {
            f"r{i}.hf-queue-places": ops.and_(
                r["act"] >= -1, r["wait"] >= -1,
                ops.implies(run, ops.and_(in_act, ops.not_(in_wait))),
                ops.implies(queued, ops.and_(in_wait, ops.not_(in_act), r["blocks"] == 0, r["computed"] == 0)),
                ops.implies(ops.and_(ops.not_(run), ops.not_(queued), ph != FAILED),
                            ops.and_(ops.not_(in_act), ops.not_(in_wait))),
                ops.not_(ops.and_(in_act, in_wait)),
                ops.implies(ph == FAILED, s.g["error"])),    # only a dead engine fails requests
            f"r{i}.hf-hashed": ops.and_(r["hashed"] >= -1, r["hashed"] <= r["blocks"] + r["shared_blocks"],
                                        ops.implies(r["hashed"] >= 0, run)),
            f"r{i}.hf-shared-own": ops.and_(
                r["shared_blocks"] >= 0, ops.implies(r["shared_blocks"] > 0, run),
                ops.implies(run, r["shared_blocks"] == ops.min(ops.max(r["hashed"], 0),
                                                               self.prefix_blocks(ops, k, p, i))))}

    # -- the prefix cache ------------------------------------------------------------------
    @staticmethod
    def prefix_blocks(ops, k: Knobs, p: Params, i: int):
        """`shared_prefix_blocks`: full blocks of slot i's shared prefix (0 without a group, or
        with block sharing off)."""
        if not k.options.allow_block_sharing:
            return 0
        w = p.slots[i]
        return ops.ite(w["prefix_group"] < 0, 0, floor_div(ops, k, ops.min(w["prefix_len"], w["prompt"])))

    @staticmethod
    def entry(ops, p: Params, x: SlotState, i: int):
        """E of slot i's group: its existing prefix blocks (0 without a group)."""
        return ops.sum(ops.ite(at, x.req[h]["pc_blocks"], 0) for h, at in enumerate(homes(ops, p)[i]))

    @staticmethod
    def top(ops, p: Params, x: SlotState, h: int, keep=None):
        """M: the most prefix blocks a member of the group homed at slot h references, over the
        members with keep[j] (all by default); blocks above it have no reference."""
        home = homes(ops, p)
        m = 0
        for j in range(h, len(x)):
            member = home[j][h] if keep is None else ops.and_(home[j][h], keep[j])
            if member is not False:   # constant folding only
                m = ops.max(m, ops.ite(member, x.req[j]["shared_blocks"], 0))
        return m

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

    def release(self, G, k, p, x, i):
        """hf_cb `_release` with caching (finish, cancel, an engine error; CA `BlockLedger.release`
        :66-93, R23): its own hashed blocks stay occupied as cached blocks, the others go back to the
        pool; its prefix blocks lose a reference and stay where they are (cached when no one
        references them: E is unchanged). The release without caching of an offload is
        `_Pass.offload_requests`'s, which releases its requests at once."""
        ops = G.ops
        r = x.req[i]
        keep = ops.min(ops.max(r["hashed"] - r["shared_blocks"], 0), r["blocks"])
        G.set(x.g, "free_blocks", x.g["free_blocks"] + r["blocks"] - keep)
        G.set(x.g, "cached", x.g["cached"] + keep)
        G.set(r, "hashed", -1)
        G.set(r, "blocks", 0)
        G.set(r, "shared_blocks", 0)
        G.set(r, "host_blocks", 0)
        G.set(r, "suspended", False)

    def after_step(self, G, k, p, x, plan):
        """HfCb.after_step (API `update_batch` :564-574 -> `_hash_blocks`, C `mark_complete_blocks`
        :348-357, CA :290-311): every scheduled request still running has its full blocks hashed
        (upto = computed // page). Those of its group's prefix it had not hashed turn from its own
        into shared blocks: an existing block is adopted and the request's copy goes back to the pool,
        a new one is registered (E grows). The policy hashes the batch in order, a later request
        adopting what an earlier one registered; the outcome does not depend on the order: each
        request converts the same blocks, E ends at the largest prefix hashed, and the pool gets back
        every converted block but the newly registered ones."""
        ops = G.ops
        if k.options.allow_block_sharing:
            n = len(x)
            home = homes(ops, p)
            conv, reach = [0] * n, [0] * n
            for i, r in enumerate(x.req):
                hashing = ops.and_(plan.rec.flags["scheduled"][i], running(ops, r))
                upto = floor_div(ops, k, r["computed"])
                old = ops.max(r["hashed"], 0)
                kk = self.prefix_blocks(ops, k, p, i)
                converts = ops.and_(hashing, upto > old, old < kk)
                reach[i] = ops.ite(converts, ops.min(upto, kk), 0)
                conv[i] = ops.ite(converts, reach[i] - old, 0)
                with G.when(hashing):
                    G.set(r, "hashed", ops.max(r["hashed"], upto))
            grown = []
            for h in range(n):
                e = x.req[h]["pc_blocks"]
                new = e
                for j in range(h, n):
                    if home[j][h] is not False:   # constant folding only
                        new = ops.max(new, ops.ite(home[j][h], reach[j], 0))
                new = plan.seen("hash.pc", new, h)   # members' hashing grows a home's count
                grown.append(new - e)
                G.set(x.req[h], "pc_blocks", new)
            G.set(x.g, "free_blocks", x.g["free_blocks"] + ops.sum(conv) - ops.sum(grown))
            for r, c in zip(x.req, conv):
                G.set(r, "blocks", r["blocks"] - c)
                G.set(r, "shared_blocks", r["shared_blocks"] + c)
        self.compact(G, plan, x, "act", "after")    # finishes left gaps
        super().after_step(G, k, p, x, plan)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """HfCb.schedule: `_Pass.run`, then the empty-batch crash (API `_generation_step` :635)."""
        _Pass(self, G, k, p, x, plan).run()
        self.compact(G, plan, x, "act", "pass")
        self.compact(G, plan, x, "wait", "pass")

    # -- queue helpers -------------------------------------------------------------------------
    @staticmethod
    def forget(G, x, i):
        """hf_cb `_forget`: out of active_requests and the waiting queue."""
        G.set(x.req[i], "act", -1)
        G.set(x.req[i], "wait", -1)

    @staticmethod
    def compact(G, plan: Plan, x, field, when: str):
        """Order keys back to positions 0..len-1 (a representation step; the engine state is the
        same ordered tuple). A position counts the others' keys: read of them (`seen`)."""
        ops = G.ops
        keys = [r[field] for r in x.req]
        for i, r in enumerate(x.req):
            pos = ops.count(ops.and_(keys[j] >= 0, keys[j] < keys[i]) for j in range(len(keys)) if j != i)
            G.set(r, field, ops.ite(keys[i] >= 0, plan.seen(f"{when}.{field}_rank", pos, i), -1))


    # -- acceleration ----------------------------------------------------------------------
    def decode_guard(self, ops, k: Knobs, p: Params, s: SlotState, m):
        """The next m steps are identical pure-decode steps (the module docstring says why each
        condition is there). Quantities the step computes are taken from a `_Pass` on s (building
        one changes nothing), so guard and step share their terms."""
        n = len(s)
        step = s.g["step"]
        pas = _Pass(self, Guarded(ops), k, p, s, Plan(n))
        conds = [ops.not_(s.g["error"]), m >= 1]
        dec = []
        for i, (r, w) in enumerate(zip(s.req, p.slots)):
            d = ops.and_(w["present"], r["phase"] == DECODING)
            dec.append(d)
            conds.append(ops.implies(w["present"], ops.and_(
                ops.or_(w["arrival"] < step, w["arrival"] >= step + m),
                ops.or_(w["cancel_at"] < step, w["cancel_at"] >= step + m))))
            conds.append((r["act"] >= 0) == d)               # active_requests is the decoders
            conds.append(ops.implies(d, ops.and_(
                r["generated"] + m < w["max_new"],
                ops.or_(w["output_len"] <= 0, r["generated"] + m < w["output_len"]),
                ops.max(r["hashed"], 0) >= self.prefix_blocks(ops, k, p, i))))
        count = ops.count(dec)
        conds += [count >= 1, count <= pas.max_requests]
        # the read budget (C:228) holds every decoder at the last step, with room to spare (no break)
        conds.append(ops.sum(ops.ite(d, r["computed"] + m - 1, 0) for d, r in zip(dec, s.req))
                     < k.num_blocks * k.block_size)
        growth = self.growth(ops, k, s, dec, m)
        conds.append(growth <= s.g["free_blocks"])
        # eviction (when out of margin) would change the state: nothing to evict, or in margin
        # throughout (asked of the pool after the whole run, which is never larger)
        evictable = s.g["cached"] + ops.sum(s.req[h]["pc_blocks"] - self.top(ops, p, s, h) for h in range(n))
        conds.append(ops.or_(evictable == 0, pas.in_margin(s.g["free_blocks"] - growth)))
        # waiting candidates: none is reached (block_new_requests, the request budget spent, or
        # out of margin with nothing to evict), or each reached one neither matches nor fits
        budget = k.max_num_tokens - count
        conds.append(ops.or_(s.g["block_new"], count >= pas.max_requests,
                             ops.and_(evictable == 0, ops.not_(pas.in_margin(s.g["free_blocks"]))),
                             ops.and_(*[self.left_waiting(ops, k, p, s, i, budget) for i in range(n)])))
        return ops.and_(*conds)

    def left_waiting(self, ops, k: Knobs, p: Params, s: SlotState, i: int, budget):
        """Slot i, if waiting and reached after the decoders, changes nothing: it has no prefix match
        (`_Pass.view`: a match moves it to active_requests even when its allocation then fails), and
        its first chunk, within the token budget the decoders leave, does not fit the free pool even
        before the decoders take theirs (asked of the pool before the run, which is never smaller)."""
        r = s.req[i]
        context = p.slots[i]["prompt"] + r["generated"]
        no_match = ops.or_(self.entry(ops, p, s, i) <= 0, self.prefix_blocks(ops, k, p, i) <= 0,
                           floor_div(ops, k, context - 1) <= 0)
        need = k.blocks_for(ops, r["computed"] + ops.min(context - r["computed"], budget)) - r["blocks"] - r["shared_blocks"]
        return ops.implies(r["wait"] >= 0, ops.and_(no_match, need > s.g["free_blocks"]))

    @staticmethod
    def growth(ops, k: Knobs, s: SlotState, dec: list, m):
        """Blocks the decoders take over m steps: each grows to the pages of m more tokens."""
        return ops.sum(ops.ite(d, ops.max(k.blocks_for(ops, r["computed"] + m) - r["blocks"] - r["shared_blocks"], 0),
                               0) for d, r in zip(dec, s.req))

    def decode_advance(self, ops, k: Knobs, p: Params, s: SlotState, m) -> SlotState:
        """m decode steps at once: each decoder m tokens further, its own blocks grown to cover them,
        its hashed count up to its new full blocks (past its prefix: no block changes hands)."""
        x = s.copy()
        taken = []
        for r, w in zip(x.req, p.slots):
            d = ops.and_(w["present"], r["phase"] == DECODING)
            grown = ops.max(k.blocks_for(ops, r["computed"] + m) - r["shared_blocks"], r["blocks"])
            taken.append(ops.ite(d, grown - r["blocks"], 0))
            if k.options.allow_block_sharing:
                r["hashed"] = ops.ite(d, ops.max(r["hashed"], floor_div(ops, k, r["computed"] + m)), r["hashed"])
            r["blocks"] = ops.ite(d, grown, r["blocks"])
            r["computed"] = ops.ite(d, r["computed"] + m, r["computed"])
            r["generated"] = ops.ite(d, r["generated"] + m, r["generated"])
        x.g["free_blocks"] = x.g["free_blocks"] - ops.sum(taken)
        x.g["step"] = x.g["step"] + m
        return x


class _Pass:
    """One call of API `prepare_next_batch` (model/policies/hf_cb.py `_Pass`), over slots."""

    def __init__(self, core: HfCbCore, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan):
        self.core = core
        self.G, self.ops, self.k, self.o, self.p, self.x, self.plan = G, G.ops, k, k.options, p, x, plan
        self.n = n = len(x)
        margin = self.o.safety_margin
        margin = DEFAULT_SAFETY_MARGIN[self.o.scheduler_type] if margin is None else margin
        self.margin_num, self.margin_den = margin_threshold(margin)
        # INIT `update_cb_config` :306: max_requests_per_batch = min(max_requests_per_batch, max_batch_tokens)
        self.max_requests = self.ops.min(k.max_batch_size, k.max_num_tokens)
        # Order keys of the entries a pass appends, each batch of them above every key before it
        # (position < n in its own order): arrivals take wait keys n.. (HfCbCore.arrive); the
        # matches of a first call that returns None act keys 2n..; the soft resets of the first
        # offload wait keys 3n..; admissions and matches of the scheduling call act keys 5n..; the
        # soft resets of the offload after the batch wait keys 6n.. So act keys stay below 6n and
        # wait keys below 7n (`candidates`).
        self.KEYS = {"match1": 2 * n, "reset1": 3 * n, "admit": 5 * n, "reset2": 6 * n}
        # checkers/parametric/local_hf.py: `plan.env` records what the pass reads of the other
        # requests (n slots), or, with `env.one_request`, supplies it: the pass of one request
        # among any number, whose scheduling loop has one turn, its own
        self.env = plan.env
        self.one = self.env is not None and self.env.one_request

    # -- small helpers -------------------------------------------------------------------
    def r(self, i: int) -> dict:
        return self.x.req[i]

    def any_of(self, name: str, vals: list):
        """Whether vals holds at some slot: for one request, its own or the others' (`name`, read of
        them); on n slots, each slot's "the others'" is noted for it when an environment records."""
        ops = self.ops
        if self.one:
            return ops.or_(vals[0], self.plan.seen(name, False, 0))
        if self.env is not None:
            for i in range(self.n):
                self.plan.seen(name, ops.or_(*[v for j, v in enumerate(vals) if j != i]), i)
        return ops.or_(*vals)

    def sum_of(self, name: str, vals: list):
        """The sum of vals over the slots, as `any_of`: its own plus the others' (read of them)."""
        ops = self.ops
        if self.one:
            return vals[0] + self.plan.seen(name, 0, 0)
        if self.env is not None:
            for i in range(self.n):
                self.plan.seen(name, ops.sum(v for j, v in enumerate(vals) if j != i), i)
        return ops.sum(vals)

    def needs(self, comp, held, q):
        """FA `_compute_blocks_needed` :118-122: ceil((position_offset + q) / page) - blocks held."""
        return self.ops.max(0, self.k.blocks_for(self.ops, comp + q) - held)

    def in_margin(self, free=None):
        """free / capacity >= margin, exactly as the float comparison (`margin_threshold`)."""
        free = self.x.g["free_blocks"] if free is None else free
        return free * self.margin_den >= self.margin_num * self.k.num_blocks

    def view(self, i: int, when: str):
        """Slot i as `_process_candidates` sees it once `match_prefix` has run on it: (blocks
        matched, computed, blocks held, query tokens asked for). A queued request (WAITING or
        PREEMPTED) matches the longest run of its group's existing prefix blocks, over at most
        (context - 1) // page blocks (`_Pass.match_prefix`, R21); the run starts at block 0 and the
        existing blocks are 0 .. E - 1, so it is min(prefix blocks, (context - 1) // page, E)."""
        ops, k, r = self.ops, self.k, self.r(i)
        context = self.p.slots[i]["prompt"] + r["generated"]
        queued = ops.or_(r["phase"] == WAITING, r["phase"] == PREEMPTED)
        cap = ops.min(self.core.prefix_blocks(ops, k, self.p, i), floor_div(ops, k, context - 1))
        existing = self.plan.seen(f"{when}.E", self.core.entry(ops, self.p, self.x, i), i)   # E: the home's count
        matched = ops.ite(queued, ops.max(0, ops.min(cap, existing)), 0)
        some = matched > 0
        comp = ops.ite(some, matched * k.block_size, r["computed"])
        held = r["blocks"] + ops.ite(some, matched, r["shared_blocks"])
        length = ops.ite(r["phase"] == DECODING, 1, context - comp)
        return matched, comp, held, length

    def candidates(self, when: str):
        """`_Pass.candidates` (R2/R3): (is a candidate, order key, is active) per slot. Active
        DECODING then the other active requests (prefill_first: the other way round), in
        active-dict order, then the waiting FIFO unless block_new_requests."""
        ops, n = self.ops, self.n
        dec_first = self.o.scheduler_type == "fifo"
        cand, key, active = [], [], []
        block_new = self.plan.seen(f"{when}.block_new", self.x.g["block_new"])
        for r in self.x.req:
            act = r["act"] >= 0
            dec = r["phase"] == DECODING
            cls = ops.ite(dec, 0 if dec_first else 1, 1 if dec_first else 0)
            waiting = ops.and_(r["wait"] >= 0, ops.not_(block_new))
            cand.append(ops.or_(act, waiting))
            key.append(ops.ite(act, cls * 8 * n + r["act"], 16 * n + r["wait"]))
            active.append(act)
        pos = [self.plan.seen(f"{when}.pos",
                              ops.count(ops.and_(cand[j], key[j] < key[i]) for j in range(n) if j != i), i)
               for i in range(n)]
        return cand, pos, active

    # -- API `prepare_next_batch` :482-536 -------------------------------------------------
    def run(self) -> None:
        """`_Pass.run`: nothing pending -> idle; up to two calls that return None, each followed by
        an offload (False => the fatal RuntimeError :509); then the call that schedules.

        The two ways on from the first call (it returned None, or it is the batch) are built on
        copies of the state and joined field by field at the end, so that the batch of a step whose
        first call schedules is a term without the None path's updates inside it (a solver that
        knows which way a step goes drops the other at the top of each field)."""
        ops, G, x = self.ops, self.G, self.x
        pending = self.any_of("pass.pending", [ops.or_(r["act"] >= 0, r["wait"] >= 0) for r in x.req])   # :495-496
        with G.when(pending):
            none1, starved, pos, need, matched, examined, active = self.probe()
        ways = {}
        for way, cond in (("none", ops.and_(pending, none1)), ("batch", ops.and_(pending, ops.not_(none1)))):
            if cond is False:          # constant folding only (a concrete run takes one way)
                continue
            on = _Pass(self.core, Guarded(ops), self.k, self.p, x.copy(), _copy_plan(self.plan))
            if way == "none":
                on.after_none(starved, pos, need, matched, examined, active)
            else:
                on.schedule_batch("batch1")
            ways[way] = (cond, on)
        for cond, on in ways.values():
            self.join(cond, on)

    def join(self, cond, on: "_Pass") -> None:
        """This pass's state and plan := those of `on` (a pass over a copy) where cond holds."""
        G, x = self.G, self.x
        with G.when(cond):
            for r, r2 in zip(x.req, on.x.req):
                for f in r:
                    G.set(r, f, r2[f])
            for f in x.g:
                G.set(x.g, f, on.x.g[f])
            _join_plan(G, self.plan, on.plan)

    def after_none(self, starved, pos, need, matched, examined, active) -> None:
        """After a first call that returned None: its matches, the offload (:508), and the second
        call (:511-513). The second call examines the same candidates with the same needs, less the
        offloaded ones and, if any was offloaded (block_new_requests now set), the waiting ones:
        nothing was allocated, and no match is new (E only shrank). It returns None iff each of them
        fails against the free count the offload left; then the second offload can neither evict nor
        offload (module docstring): False, the fatal error (:509). Else the second call is the batch."""
        ops, G, x = self.ops, self.G, self.x
        self.apply_matches(matched, pos, self.KEYS["match1"])
        evicted, off = self.offload_requests(starved, pos, need, self.KEYS["reset1"], "offload1")
        offloaded = self.any_of("offload1.off", off)
        free = self.plan.seen("offload1.free", x.g["free_blocks"])
        again = [ops.and_(examined[i], ops.not_(off[i]), ops.or_(active[i], matched[i] > 0, ops.not_(offloaded)))
                 for i in range(self.n)]
        none2 = ops.and_(self.any_of("second.again", again),
                         ops.not_(self.any_of("second.fits", [ops.and_(a, nd <= free) for a, nd in zip(again, need)])))
        dead = self.plan.decided("offload1.dead", ops.or_(ops.not_(ops.or_(evicted, offloaded)), none2))
        with G.when(dead):
            self.plan.raise_error(G, "deadlock")                             # :509
        with G.when(ops.not_(dead)):
            self.schedule_batch("batch2")

    def probe(self):
        """`_Pass.schedule_batch` when it returns None (R13): (returns None, starved, candidate
        position, need, blocks matched, examined, active). Nothing is scheduled then, so each candidate
        meets the same budgets and free count after its match: it is skipped (read budget), fits, or
        fails; None iff none fits and one fails. The matches are made by `apply_matches` where it is
        None."""
        ops, k, x = self.ops, self.k, self.x
        self.meet_safety_margin("probe")
        cand, pos, active = self.candidates("probe")
        read_budget = k.num_blocks * k.block_size
        free = self.plan.seen("probe.free", x.g["free_blocks"])
        fits, fails, starved, need, matched = [], [], [], [], []
        for i in range(self.n):
            got, comp, held, length = self.view(i, "probe")
            q = ops.min(length, k.max_num_tokens)
            nd = self.needs(comp, held, q)
            examined = ops.and_(cand[i], ops.not_(read_budget < comp))
            fits.append(ops.and_(examined, nd <= free))
            fails.append(ops.and_(examined, nd > free))
            # a matched request is in active_requests when its allocation fails (:245-246)
            starved.append(ops.and_(fails[-1], ops.or_(active[i], got > 0)))
            need.append(nd)
            matched.append(ops.ite(cand[i], got, 0))
        none = self.plan.decided("probe.none", ops.and_(ops.not_(self.any_of("probe.fits", fits)),
                                                                   self.any_of("probe.fails", fails)))
        for i in range(self.n):
            self.plan.note("probe.failed", fails[i], i)
            self.plan.note("probe.starved", starved[i], i)
        examined = [ops.or_(a, b) for a, b in zip(fits, fails)]
        return none, starved, pos, need, matched, examined, active

    def apply_matches(self, matched, pos, base) -> None:
        """`_Pass.match_prefix`'s state change for every candidate of a call that returned None."""
        for i in range(self.n):
            with self.G.when(matched[i] > 0):
                self.match(i, matched[i], base + pos[i])

    def match(self, i: int, blocks, act_key) -> None:
        """`_Pass.match_prefix` (SCH `_infer_request_tokens` :118-139, CA `acquire_prefix_blocks`
        :282-288): the matched blocks are acquired (E unchanged: a cached one is referenced again),
        computed starts at matched * page, and the request moves to the end of active_requests as
        PREFILLING, even if its allocation then fails."""
        G, r = self.G, self.r(i)
        G.set(r, "phase", PREFILLING)
        G.set(r, "computed", blocks * self.k.block_size)
        G.set(r, "shared_blocks", blocks)
        G.set(r, "hashed", blocks)
        G.set(r, "act", act_key)
        G.set(r, "wait", -1)

    def schedule_batch(self, loop: str) -> None:
        """`_Pass.schedule_batch` (SCH `_process_candidates` :196-280) when it does not return None,
        then the offload of the starved requests (API:519-520) and the empty-batch crash. The
        candidates are visited in order: position t is the candidate with t candidates before it.
        `loop` names the call for what it reads of the others: "batch1" when the first call
        schedules, "batch2" after a first call that returned None."""
        ops, G, k, x, n = self.ops, self.G, self.k, self.x, self.n
        # :217 `_try_to_meet_safety_margin`: nothing is cached here (the probe's margin check ran on
        # this state, or the offload after a call that returned None evicted everything and soft
        # resets cache nothing), so it evicts nothing and is the margin test itself
        in_margin = self.plan.seen(f"{loop}.in_margin", self.in_margin())
        cand, pos, active = self.candidates(loop)
        if self.env is not None and not self.one:
            self.env.positions(loop, pos, cand)
        views = [self.view(i, loop) for i in range(n)]                   # E is fixed from here on
        dec = [r["phase"] == DECODING for r in x.req]
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
        mine = [False] * n     # scheduled by this call
        for t in range(n):
            # one request: one turn, at its own position, with the running values read there
            turn = pos[0] if self.one else t
            sel = [cand[0]] if self.one else [ops.and_(cand[i], pos[i] == t) for i in range(n)]
            stopped, scheduled, token_budget, read_budget, request_budget, free = self.plan.at_turn(
                loop, t, stopped=stopped, scheduled=scheduled, token_budget=token_budget,
                read_budget=read_budget, request_budget=request_budget, free=free)

            def pick(vals):
                return ops.sum(ops.ite(sel[i], vals[i], 0) for i in range(n))

            live = ops.and_(ops.or_(*sel), ops.not_(stopped))
            is_dec = ops.or_(*[ops.and_(sel[i], dec[i]) for i in range(n)])
            margin_stop = ops.and_(live, ops.not_(in_margin), scheduled, ops.not_(is_dec))   # :221-222 (R6)
            stopped = ops.or_(stopped, margin_stop)
            live = ops.and_(live, ops.not_(margin_stop))
            hit_match = [ops.and_(live, sel[i], views[i][0] > 0) for i in range(n)]          # :225 (R21)
            comp = pick([v[1] for v in views])
            q = ops.min(pick([v[3] for v in views]), token_budget)           # :227 (R7)
            examined = ops.and_(live, ops.not_(read_budget < comp))          # :237-238 (R12)
            need = self.needs(comp, pick([v[2] for v in views]), q)
            fits = need <= free                                              # C:248-273 (R8)
            failed = ops.and_(examined, ops.not_(fits))
            ok = ops.and_(examined, fits)
            for i in range(n):                                               # :245-246 (R9)
                hit = ops.and_(failed, sel[i], ops.or_(active[i], hit_match[i]))
                starved[i] = ops.or_(starved[i], hit)
                starved_need[i] = ops.ite(hit, need, starved_need[i])
            free = ops.ite(ok, free - need, free)
            for i in range(n):
                with G.when(hit_match[i]):
                    self.match(i, views[i][0], self.KEYS["admit"] + turn)
                with G.when(ops.and_(ok, sel[i])):
                    alloc[i] = ops.ite(G.guard, need, alloc[i])
                    mine[i] = ops.or_(mine[i], G.guard)
                    self.admit(i, turn)
                    self.plan.schedule(G, i, q)
            token_budget = ops.ite(ok, token_budget - q, token_budget)      # :257-259 (R10)
            read_budget = ops.ite(ok, read_budget - comp, read_budget)
            request_budget = ops.ite(ok, request_budget - 1, request_budget)
            scheduled = ops.or_(scheduled, ok)
            full = ops.or_(token_budget == 0, read_budget <= 0, request_budget <= 0)
            stopped = ops.or_(stopped, ops.and_(ok, full))                 # :275-276 (R11)
            if self.one:   # what its turn hands on to the next (local_hf.py: the loop's scan invariant)
                self.plan.note(f"{loop}.handed", dict(stopped=stopped, token_budget=token_budget,
                                                                 read_budget=read_budget,
                                                                 request_budget=request_budget), 0)
        self.allocate(alloc)
        # `run` :515-520: a non-empty batch with starved requests left offloads once more (on a
        # copy joined at the top of each field, as in `run`)
        scheduled = self.any_of(f"{loop}.scheduled", mine)
        again = ops.and_(scheduled, self.any_of(f"{loop}.starved", starved))
        if again is not False:         # constant folding only
            on = _Pass(self.core, Guarded(ops), k, self.p, x.copy(), _copy_plan(self.plan))
            on.offload_requests(starved, pos, starved_need, self.KEYS["reset2"], f"{loop}.offload")
            self.join(again, on)
        # HfCb.schedule: a batch of zero query tokens crashes the forward pass.
        for i in range(n):
            self.plan.note(f"{loop}.mine", mine[i], i)
        empty = self.sum_of(f"{loop}.tokens", self.plan.rec.tokens) == 0
        with G.when(self.plan.decided(f"{loop}.crash", ops.and_(scheduled, empty))):
            self.plan.raise_error(G, "crash")

    def admit(self, i: int, t: int) -> None:
        """`_Pass.allocate`, queues: a waiting request enters active_requests at the end and leaves
        the waiting queue (a matched one is there already, by the same key)."""
        G, r = self.G, self.r(i)
        with G.when(r["act"] < 0):
            G.set(r, "act", self.KEYS["admit"] + t)
            G.set(r, "wait", -1)

    def allocate(self, alloc: list) -> None:
        """`_Pass.allocate`, blocks (FA `allocate_cache_to_request` :129-135) of the whole batch."""
        G, x = self.G, self.x
        G.set(x.g, "free_blocks", x.g["free_blocks"] - self.ops.sum(alloc))
        for r, a in zip(x.req, alloc):
            G.set(r, "blocks", r["blocks"] + a)

    def meet_safety_margin(self, when: str) -> None:
        """`_Pass.meet_safety_margin` (SCH :179-194, R5): out of margin, every cached block is
        evicted. Its answer, the margin looked at again, matters only to a call that schedules, and
        `schedule_batch` asks it of the state after (evicting twice is a no-op)."""
        ops, G = self.ops, self.G
        before = self.plan.seen(f"{when}.in_margin", self.in_margin())
        with G.when(ops.not_(before)):
            self.evict_cached_blocks(when)

    def evict_cached_blocks(self, when: str):
        """`_Pass.evict_cached_blocks` (C :359-369, CA `evict_cached_blocks` :100-108): the anonymous
        cached blocks and every unreferenced prefix block (E - M per group) back to the pool at once;
        true if any."""
        ops, G, x = self.ops, self.G, self.x
        tops = [self.core.top(ops, self.p, x, h) for h in range(self.n)]
        freed = x.g["cached"] + ops.sum(r["pc_blocks"] - m for r, m in zip(x.req, tops))
        G.set(x.g, "free_blocks", x.g["free_blocks"] + freed)
        G.set(x.g, "cached", 0)
        for h, (r, m) in enumerate(zip(x.req, tops)):
            G.set(r, "pc_blocks", self.plan.seen(f"{when}.pc", m, h))   # the top over the group's members
        return freed > 0

    # -- OM `offload_requests` :156-242 (R16) ---------------------------------------------
    def offload_requests(self, starved, pos, need, reset_key, when: str):
        """`_Pass.offload_requests`, closed form (module docstring): starved request i is offloaded
        iff, with every newer starved request already popped, more than one request is still
        active and the needs of i and the older starved requests exceed the free blocks plus the
        blocks the popped ones returned: their own, and their groups' prefix blocks that no other
        member references (after the eviction E = M, so that is E - M(the others)). Returns
        whether the eviction freed anything and which were offloaded (its truth value is "either")."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        evicted = self.plan.seen(f"{when}.evicted", self.evict_cached_blocks(when))   # :167
        free = x.g["free_blocks"]
        num_active = ops.count(r["act"] >= 0 for r in x.req)                 # :180
        off = []
        for i in range(n):
            # what i's test reads of the others: the active requests left with every newer starved
            # one popped, the needs of the older starved ones, the free blocks with the popped ones'
            newer = [ops.and_(starved[j], pos[j] > pos[i]) for j in range(n)]
            left = self.plan.seen(f"{when}.active_left", num_active - ops.count(newer), i)
            older = self.plan.seen(f"{when}.older_need",
                                   ops.sum(ops.ite(ops.and_(starved[j], ops.not_(newer[j])), need[j], 0)
                                           for j in range(n) if j != i), i)
            room = self.plan.seen(f"{when}.room",
                                  free + ops.sum(ops.ite(newer[j], x.req[j]["blocks"], 0) for j in range(n))
                                  + self.prefix_freed([ops.not_(b) for b in newer]), i)
            off.append(ops.and_(starved[i], left > 1, need[i] + older > room))
            self.plan.note(f"{when}.off", off[i], i)
            self.plan.note(f"{when}.held", x.req[i]["blocks"] + x.req[i]["shared_blocks"], i)
        offloaded = ops.or_(*off)
        # :198 release(no_cache) of every offloaded request at once: own blocks, and the prefix
        # blocks no one else holds. Written as amounts moved (an ite per request, a difference per
        # group) so that the blocks are conserved whatever was offloaded, with no case split
        own = [ops.ite(o, r["blocks"], 0) for o, r in zip(off, x.req)]
        tops = [self.plan.seen(f"{when}.pc_kept", self.core.top(ops, self.p, x, h, [ops.not_(o) for o in off]), h)
                for h in range(n)]
        G.set(x.g, "free_blocks", x.g["free_blocks"] + ops.sum(own) +
              ops.sum(r["pc_blocks"] - m for r, m in zip(x.req, tops)))
        for r, m, b in zip(x.req, tops, own):
            G.set(r, "pc_blocks", m)
            G.set(r, "blocks", r["blocks"] - b)
        for i in range(n):                                                   # :209-234, oldest first
            with G.when(off[i]):
                self.soft_reset(i, reset_key + pos[i])
        with G.when(offloaded):
            G.set(x.g, "block_new", True)                                    # :236
        return evicted, off

    def prefix_freed(self, keep):
        """Prefix blocks released without caching when only the members with keep[j] still hold
        theirs (CA:81-83: a block whose count falls to 0 is unhashed back to the pool): E - M(kept)
        per group, given no cached prefix block (E = M, as after an eviction)."""
        ops, x = self.ops, self.x
        return ops.sum(x.req[h]["pc_blocks"] - self.core.top(ops, self.p, x, h, keep) for h in range(self.n))

    def soft_reset(self, i: int, wait_key) -> None:
        """`_Pass.soft_reset` (OM :230-234), its blocks released by `offload_requests`: restarted with
        prompt + generated as its prompt, at the end of the waiting queue (oldest first: by position)."""
        G, r = self.G, self.r(i)
        for f, v in (("hashed", -1), ("shared_blocks", 0), ("host_blocks", 0), ("suspended", False)):
            G.set(r, f, v)                                                   # the rest of `_release`
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.add(r, "preemptions", 1)
        G.set(r, "act", -1)
        G.set(r, "wait", wait_key)
        self.plan.flag(G, "preempted", i)


def _copy_plan(plan: Plan) -> Plan:
    out = Plan(len(plan.own))
    out.rec, out.own, out.error, out.error_kind = plan.rec.copy(), list(plan.own), plan.error, plan.error_kind
    out.env = plan.env
    return out


def _join_plan(G: Guarded, plan: Plan, other: Plan) -> None:
    """plan := other where G's guard holds (the way of `_Pass.run` that was taken)."""
    ops, rec = G.ops, plan.rec
    rec.tokens = [ops.ite(G.guard, b, a) for a, b in zip(rec.tokens, other.rec.tokens)]
    rec.flags = {f: [ops.ite(G.guard, b, a) for a, b in zip(v, other.rec.flags[f])] for f, v in rec.flags.items()}
    rec.charged = ops.ite(G.guard, other.rec.charged, rec.charged)
    plan.own = [ops.ite(G.guard, b, a) for a, b in zip(plan.own, other.own)]
    plan.error = ops.ite(G.guard, other.error, plan.error)
    plan.error_kind = ops.ite(G.guard, other.error_kind, plan.error_kind)
