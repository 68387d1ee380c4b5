"""SGLang's scheduler as a core: model/policies/sglang.py over slots.

Every method re-expresses the method of the same name in model/policies/sglang.py (`_Iteration`,
`_Adder`), which cites the engine (sglang 0.5.23). The queues are ranks per slot: `wpos` in the
waiting queue, `rpos` in the running batch, `lpos` in the last prefill batch (-1: not there), kept
compact (0..len-1) so that they equal the positions of the policy's tuples.

Covered: designs with `ignore_eos` on (benchmarks set it; the running requests are then charged their
whole remaining output, and admission takes SGLang's ignore_eos path with its finish-order simulation)
and chunked prefill and the radix cache off. Refused with a reason: the radix cache on (its tree is not
expressed), ignore_eos off, whose admission reads new_token_ratio,
a float the engine decays by (init - min) / 600 every decode step (exact rounding matters at the integer
boundaries the budget compares against, so a real-valued ratio would not be the engine's), and chunked
prefill on (not expressed yet). Within that subset: FCFS admission with the first refusal stopping the
pass, the `batch_is_full` latch (set and cleared where the engine does), the arrival clip and the
input-length abort, decode retraction in "length" order with the last request aborted, cancellation of a
queued request and of one in flight (which ends at its next result).

Both event loops (model/policies/sglang_overlap.py): `event_loop_normal` (disable_overlap_schedule), where
`execute` lands the batch the step launched, and SGLang's default, `event_loop_overlap`, as model/symbolic/overlap.py
(`OverlapLoop`: launch batch k with `forward`, then `land` batch k-1, the rows in flight when the step began). Two
fields serve that loop only, neither read nor written in the other, so its terms are the ones it had before them:
`in_flight` per slot (the request has a row in `Sched.in_flight`: within this subset every row samples, and its
extend_end and `in_flight_extend` are read only by the radix cache's checkpoint) and the global `prefill_only`
(`Sched.prefill_only`, SB is_prefill_only). The pass reads them where the policy's pass does: `leave_finishing`
(SC _reqs_finishing_inflight, update_running_batch 4459-4474) and the prefill-only batch that is not decoded
(SC:3997); the merge keeps `prefill_only`. `land` is the policy's `land` (the BRP rules it cites). The loop's own
invariants are `overlap_invariants` and its `decode_cursor`. No decode run is accelerated in either loop.

What a request's step reads of the other requests is named (`seen`, `at_turn`): with `plan.env` None
each is its own value, so the core is as before; checkers/parametric/local_sglang.py records them
(n slots) or supplies them (one slot among any number of others), for `event_loop_normal` only: the step refuses an
environment in the overlap loop (`step`), and local_sglang.py refuses that loop's designs.
"""

from __future__ import annotations

from typing import Optional

from ...config import ConfigError, EngineConfig
from ...policies.sglang import CLIP_MAX_NEW_TOKENS, IGNORE_EOS_RESERVE_TOKENS
from ...policy import POLICIES
from ...state import State
from ..core import Core, Plan, register
from ..ops import Guarded
from ..overlap import FIELD as IN_FLIGHT
from ..overlap import OverlapLoop
from ..slots import (CANCELLED, DECODING, FAILED, FINISHED, PENDING, PREEMPTED, REJECTED, WAITING, Knobs,
                     Params, SlotState, terminal)


def overlap(k: Knobs) -> bool:
    """The design runs event_loop_overlap (disable_overlap_schedule false: SGLang's default, SC:6230-6231); always
    a concrete option."""
    return not k.options.disable_overlap_schedule


@register
class SglangCore(OverlapLoop, Core):
    policy = "sglang"
    # in_flight: the request has a row in the batch launched last iteration whose result is still queued (the
    # overlap loop's `Sched.in_flight`); prefill_only: running_batch.is_prefill_only (SB:2702, SC:3997), which only
    # the overlap loop can set. Neither is read or written in event_loop_normal.
    extra_req_fields = {"cap": int, "wpos": int, "rpos": int, "lpos": int, "to_finish": bool, "doomed": bool,
                        IN_FLIGHT: bool}
    extra_global_fields = {"full": bool, "prefill_only": bool}
    phases = (PENDING, WAITING, DECODING, PREEMPTED, FINISHED, FAILED, REJECTED, CANCELLED)

    # -- what the core covers --------------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None):
        try:
            POLICIES[self.policy].check_config(cfg)
        except ConfigError as e:
            return (e.field, e.reason)
        if not cfg.options.disable_radix_cache:
            return ("engine.options.disable_radix_cache", "the symbolic sglang core covers the radix cache off only "
                    "(disable_radix_cache = true): the cache's tree is not expressed symbolically")
        if not cfg.options.ignore_eos:
            return ("engine.options.ignore_eos", "the symbolic sglang core covers ignore_eos designs only: without "
                    "it admission reads new_token_ratio, a float the engine decays every decode step")
        if cfg.chunked_prefill:
            return ("engine.chunked_prefill", "the symbolic sglang core covers chunked prefill off only")
        if cfg.options.enable_priority_scheduling:
            return ("engine.options.enable_priority_scheduling", "the symbolic sglang core covers FCFS only")
        return None

    # -- states --------------------------------------------------------------------------
    def initial_req_extra(self, ops, k, p, i):
        return {**self.absent_req_extra(i), "cap": p.slots[i]["max_new"]}

    def initial_global_extra(self, ops, k, p):
        return {"full": False, "prefill_only": False}

    def absent_req_extra(self, i):
        return {"cap": 1, "wpos": -1, "rpos": -1, "lpos": -1, "to_finish": False, "doomed": False, IN_FLIGHT: False}

    def abstract_req_extra(self, cfg, state: State, rid):
        s, r = state.sched, state.req(rid)
        last = s.last_extend or ()
        return {"cap": dict(s.caps).get(rid, r.max_new), "wpos": s.waiting.index(rid) if rid in s.waiting else -1,
                "rpos": s.running.index(rid) if rid in s.running else -1,
                "lpos": last.index(rid) if rid in last else -1,
                "to_finish": rid in s.to_finish, "doomed": rid in s.doomed,
                IN_FLIGHT: any(row[0] == rid for row in s.in_flight)}

    def abstract_global_extra(self, cfg, state):
        return {"full": state.sched.batch_is_full, "prefill_only": state.sched.prefill_only}

    def overlaps(self, k: Knobs) -> bool:
        return overlap(k)

    def invariants(self, ops, k, p, s):
        """Core.invariants, with `live-owes-tokens` as ignore_eos makes it: an early stop (a stop token) ends
        nothing, so a live request owes tokens up to its clipped length only, and at least the one its prefill
        samples (a request clipped to 0 still gets it)."""
        inv = super().invariants(ops, k, p, s)
        for i, r in enumerate(s.req):
            live = ops.and_(r["phase"] >= WAITING, r["phase"] < FINISHED)
            inv[f"r{i}.live-owes-tokens"] = ops.implies(live, r["generated"] < ops.max(r["cap"], 1))
        return inv

    def core_invariants(self, ops, k, p, s):
        """The queues match the phases (a dead engine failed its requests where they stood), ranks are
        distinct and compact, a queued request holds nothing, a request in flight holds the pages of its KV,
        the clipped output never exceeds the asked one, an input-length abort is queued, and the latch is set only
        while a request is in a batch (the running one, or the last prefill), so a filter that empties the batches
        always clears it: in the normal loop the latch cannot outlast the requests that set it."""
        inv = {}
        dead = s.g["error"]
        in_a_batch = ops.or_(*[ops.or_(r["rpos"] >= 0, r["lpos"] >= 0) for r in s.req])
        inv["latch-only-with-a-batch"] = ops.implies(ops.and_(s.g["full"], ops.not_(dead)), in_a_batch)
        for field in ("wpos", "rpos", "lpos"):
            keys = [r[field] for r in s.req]
            size = ops.count(key >= 0 for key in keys)
            inv[f"{field}-compact"] = ops.and_(*[ops.implies(keys[i] >= 0, ops.and_(
                keys[i] < size, *[keys[j] != keys[i] for j in range(len(keys)) if j != i])) for i in range(len(keys))])
        for i, (w, r) in enumerate(zip(p.slots, s.req)):
            ph = r["phase"]
            queued = ops.or_(ph == WAITING, ph == PREEMPTED)
            inv[f"r{i}.one-place"] = ops.and_(ops.implies(r["wpos"] >= 0, ops.and_(r["rpos"] < 0, r["lpos"] < 0)),
                                              ops.implies(r["rpos"] >= 0, r["lpos"] < 0))
            inv[f"r{i}.queued-iff-waiting"] = ops.implies(ops.not_(dead), queued == (r["wpos"] >= 0))
            inv[f"r{i}.queued-holds-nothing"] = ops.implies(queued, ops.and_(r["blocks"] == 0, r["computed"] == 0))
            inv[f"r{i}.decoding-in-a-batch"] = ops.implies(ops.and_(ops.not_(dead), ph == DECODING),
                                                           ops.or_(r["rpos"] >= 0, r["lpos"] >= 0))
            inv[f"r{i}.batch-members-started"] = ops.implies(ops.or_(r["rpos"] >= 0, r["lpos"] >= 0), ops.or_(
                ph == DECODING, terminal(ops, ph)))
            inv[f"r{i}.kv-pages"] = ops.implies(ph == DECODING, r["blocks"] == k.blocks_for(ops, r["computed"]))
            inv[f"r{i}.cap"] = ops.and_(r["cap"] >= 0, r["cap"] <= w["max_new"])
            inv[f"r{i}.doomed-queued"] = ops.implies(r["doomed"], ops.or_(ph == WAITING, ops.and_(dead, ph == FAILED)))
        if overlap(k):
            inv.update(self.overlap_invariants(ops, k, p, s))
        return inv

    def overlap_invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        """event_loop_overlap only. An input-length abort is queued, or in flight with its 1-token prefill (it
        ends when that lands; a retraction while it is in flight re-queues it, and the last request's abort, SB
        retract_decode, fails it with the mark left, as the policy leaves it); a request in flight is DECODING
        (launched) or ended since its launch (an abort or the input-length abort landed the batch before, or a dead
        engine failed it), never queued: a retraction is in a pass, and the launch that follows it drops the row;
        a prefill-only running batch holds only requests that asked for no output (each in flight: one that is
        DECODING and not in flight has landed a token, `decode-cursor`, which its cap of 0 does not allow)."""
        inv = {}
        for i, r in enumerate(s.req):
            ph = r["phase"]
            inv[f"r{i}.doomed-queued"] = ops.implies(r["doomed"], ops.or_(
                ph == WAITING, ph == PREEMPTED, ops.and_(ph == DECODING, r[IN_FLIGHT]), ph == FAILED))
            inv[f"r{i}.in-flight-launched"] = ops.implies(r[IN_FLIGHT], ops.or_(ph == DECODING, terminal(ops, ph)))
        inv["prefill-only-asked-nothing"] = ops.implies(s.g["prefill_only"], ops.and_(*[
            ops.implies(r["rpos"] >= 0, r["cap"] == 0) for r in s.req]))
        return inv

    def decode_cursor(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """`decode-cursor` in event_loop_overlap (sglang_overlap.launch commits the KV at launch, land appends the
        token a step later): a request in flight has its whole context in its KV (computed = prompt + generated,
        the prompt the one token [0] for an input-length abort); one not in flight has landed its token, as in the
        normal loop. In event_loop_normal, Core's."""
        if not overlap(k):
            return super().decode_cursor(ops, k, p, s, i)
        w, r = p.slots[i], s.req[i]
        start = ops.ite(r["doomed"], 1, w["prompt"])
        return ops.implies(r["phase"] == DECODING, ops.ite(
            r[IN_FLIGHT], r["computed"] == start + r["generated"],
            ops.and_(r["generated"] >= 1, r["computed"] == w["prompt"] + r["generated"] - 1)))

    # -- arrival and abort ------------------------------------------------------------------
    @staticmethod
    def pool_tokens(k: Knobs):
        return k.num_blocks * k.block_size

    def max_req_len(self, ops, k: Knobs):
        pool = self.pool_tokens(k) - 1
        ctx = k.options.context_len
        return pool if ctx is None else ops.min(ctx - 1, pool)

    def arrive(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, i: int) -> None:
        """Sglang.arrive: an empty prompt refused, the arrival clip, the input-length abort, the tail of the queue."""
        ops = G.ops
        w, r = p.slots[i], x.req[i]
        page = k.block_size
        mrl = self.max_req_len(ops, k)
        cap = ops.max(0, ops.min(w["max_new"], mrl - w["prompt"] - 1))
        cap = ops.max(0, ops.min(cap, self.pool_tokens(k) - k.blocks_for(ops, w["prompt"]) * page - page - 1))
        empty = w["prompt"] <= 0                 # refused before the scheduler (io_struct.py:490-499)
        with G.when(empty):
            G.set(r, "phase", REJECTED)
            plan.flag(G, "rejected", i)
        with G.when(ops.not_(empty)):
            G.set(r, "cap", cap)
            G.set(r, "doomed", w["prompt"] >= mrl - 5)
            G.set(r, "wpos", ops.count(q["wpos"] >= 0 for q in x.req))   # a rank the next compaction reads
            G.set(r, "phase", WAITING)

    def cancel(self, G: Guarded, k: Knobs, p: Params, x: SlotState, i: int) -> None:
        """Sglang.cancel (no chunked request in this subset)."""
        ops = G.ops
        r = x.req[i]
        queued = r["wpos"] >= 0
        with G.when(queued):
            G.set(r, "wpos", -1)
            G.set(r, "phase", CANCELLED)
            G.set(r, "doomed", False)
        with G.when(ops.not_(queued)):
            G.set(r, "to_finish", True)

    # -- one iteration --------------------------------------------------------------------------
    def step(self, ops, k: Knobs, p: Params, s: SlotState, env=None):
        """`Core.step`. One request among any number (`env`: checkers/parametric/local_sglang.py) is the step of
        event_loop_normal only: its reads of the others are named for that loop's pass, so the overlap loop is
        refused here rather than taken with the normal loop's semantics."""
        if env is not None and overlap(k):
            raise ValueError("the sglang core's one-request step (checkers/parametric/local_sglang.py) covers "
                             "event_loop_normal only (disable_overlap_schedule = true)")
        return super().step(ops, k, p, s, env)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        ov = overlap(k)
        self.compact(G, plan, x, "wait.rank_start")       # cancellations left holes
        self.merge_last_batch(G, plan, x, ov)
        prefilled = self.prefill(G, k, p, x, plan)
        allowed = G.ops.and_(G.ops.not_(prefilled), G.ops.not_(plan.error))
        if ov:   # SC:3997: a prefill-only running batch is not decoded (only the overlap loop merges one)
            allowed = G.ops.and_(allowed, G.ops.not_(x.g["prefill_only"]))
        self.decode(G, k, p, x, plan, allowed, ov)


    @staticmethod
    def one_request(plan: Plan) -> bool:
        return plan.env is not None and plan.env.one_request

    def compact(self, G, plan: Plan, x, name: str):
        """The waiting queue's ranks closed up (0..len-1, order kept)."""
        ops = G.ops
        keys = [r["wpos"] for r in x.req]
        for i, r in enumerate(x.req):
            pos = ops.count(ops.and_(keys[j] >= 0, keys[j] < keys[i]) for j in range(len(keys)) if j != i)
            G.set(r, "wpos", ops.ite(keys[i] >= 0, plan.seen(name, pos, i), -1))

    def merge_last_batch(self, G: Guarded, plan: Plan, x: SlotState, ov: bool = False) -> None:
        """_Iteration.merge_last_batch: the last prefill batch's unfinished requests join the running batch
        at its tail (or become it); finished requests leave; either shrinking clears the latch. In the overlap loop
        (`ov`) the batch's is_prefill_only too: a batch that becomes the running batch brings its own (every
        request of it asked for no output, SB:2702), one merged into it keeps it only if both have it."""
        ops = G.ops
        n = len(x)
        term = [terminal(ops, r["phase"]) for r in x.req]
        inl = [r["lpos"] >= 0 for r in x.req]
        inr = [r["rpos"] >= 0 for r in x.req]
        member = [ops.and_(inl[i], ops.not_(term[i])) for i in range(n)]
        kept = [ops.and_(inr[i], ops.not_(term[i])) for i in range(n)]
        shrunk = ops.or_(*[ops.and_(inl[i], term[i]) for i in range(n)])
        replaced = ops.and_(ops.not_(ops.or_(*inr)), ops.or_(*member))
        filtered = ops.or_(*[ops.and_(inr[i], term[i]) for i in range(n)])
        nk = ops.count(kept)
        rpos = [x.req[i]["rpos"] for i in range(n)]
        lpos = [x.req[i]["lpos"] for i in range(n)]
        for i, r in enumerate(x.req):
            before_kept = ops.count(ops.and_(kept[j], rpos[j] < rpos[i]) for j in range(n) if j != i)
            before_member = ops.count(ops.and_(member[j], lpos[j] < lpos[i]) for j in range(n) if j != i)
            joined = plan.seen("merge.rank_member", nk + before_member, i)
            G.set(r, "rpos", ops.ite(kept[i], plan.seen("merge.rank_kept", before_kept, i),
                                     ops.ite(member[i], joined, -1)))
            G.set(r, "lpos", -1)
        G.set(x.g, "full", ops.and_(x.g["full"], ops.not_(shrunk), ops.not_(replaced), ops.not_(filtered)))
        if ov:
            last_only = ops.and_(*[ops.implies(inl[i], x.req[i]["cap"] == 0) for i in range(n)])
            G.set(x.g, "prefill_only", ops.ite(ops.or_(*member), ops.ite(
                ops.or_(*inr), ops.and_(x.g["prefill_only"], last_only), last_only), x.g["prefill_only"]))

    # -- prefill: _Iteration.prefill with _Adder.add_one_req_ignore_eos --------------------------
    def prefill(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan):
        """The waiting queue in order, one turn per position (one request: its own turn only)."""
        ops = G.ops
        n = len(x)
        one = self.one_request(plan)
        n_run = plan.seen("prefill.n_run", ops.count(r["rpos"] >= 0 for r in x.req), None)
        n_wait = plan.seen("prefill.n_wait", ops.count(r["wpos"] >= 0 for r in x.req), None)
        G.set(x.g, "full", ops.and_(x.g["full"], n_run > 0))
        gate = ops.and_(ops.not_(x.g["full"]), n_wait > 0)
        allocatable = k.max_batch_size - n_run
        with G.when(ops.and_(gate, allocatable <= 0)):
            G.set(x.g, "full", True)
        going = ops.and_(gate, allocatable > 0)
        free = plan.seen("prefill.free", x.g["free_blocks"], None)
        a = _Adder(self, ops, k, p, x, plan, free)
        if plan.env is not None and not one:
            plan.env.positions("prefill", [r["wpos"] for r in x.req])
        for j in range(1 if one else n):
            sel = [r["wpos"] >= 0 for r in x.req] if one else [r["wpos"] == j for r in x.req]
            at = x.req[0]["wpos"] if one else j
            a.turn = j
            going, a.count, a.total_offset, a.current_offset, a.rem_input = plan.at_turn(
                "prefill", j, going=going, count=a.count, total_offset=a.total_offset,
                current_offset=a.current_offset, rem_input=a.rem_input)
            other = ops.and_(ops.not_(a.no_token()), a.rem_input <= 0)
            going = ops.and_(going, at < n_wait, ops.not_(other))
            latch = ops.and_(going, a.count >= allocatable)
            with G.when(latch):
                G.set(x.g, "full", True)
            going = ops.and_(going, ops.not_(latch))
            res_no_token, res_continue = a.add_one_req_ignore_eos(sel, going)
            with G.when(ops.and_(going, res_no_token)):
                G.set(x.g, "full", ops.or_(a.count > 0, n_run > 0))
            going = ops.and_(going, res_continue)
        admitted = [a.adm[i] >= 0 for i in range(n)]
        need = ops.sum(ops.ite(admitted[i], k.blocks_for(ops, a.extend[i]), 0) for i in range(n))
        # the core's only error: plan.error is this read (local_sglang.Environment passes step.error on)
        oom = plan.seen("prefill.oom", ops.and_(a.count > 0, need > free), None)
        prefilled = plan.seen("prefill.prefilled", ops.and_(a.count > 0, ops.not_(oom)), None)
        with G.when(oom):
            plan.raise_error(G, "crash")
        for i, r in enumerate(x.req):
            with G.when(admitted[i]):
                G.set(r, "wpos", -1)
                with G.when(ops.not_(oom)):
                    blocks = k.blocks_for(ops, a.extend[i])
                    G.set(x.g, "free_blocks", x.g["free_blocks"] - blocks)
                    G.set(r, "blocks", blocks)
                    G.set(r, "lpos", a.adm[i])
                    plan.schedule(G, i, a.extend[i])
        self.compact(G, plan, x, "wait.rank_end")
        return prefilled

    # -- decode: _Iteration.decode and retract -------------------------------------------------------
    def decode_need(self, ops, k: Knobs, x: SlotState, members):
        """A page for each member whose KV ends on a page boundary."""
        return ops.sum(ops.ite(ops.and_(members[i], k.blocks_for(ops, r["computed"] + 1) >
                                        k.blocks_for(ops, r["computed"])), 1, 0) for i, r in enumerate(x.req))

    def decode(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, allowed, ov: bool = False):
        """The running batch decodes a token each, after retracting from its tail until the rest fit; what
        a request reads of the others: the batch's size, whether all fit, its own rank, how many are kept,
        whether the last one is aborted, and its place in the queue when retracted. In the overlap loop (`ov`)
        first `leave_finishing`: if some leave and the rest does not fit, nothing is decoded nor retracted."""
        ops = G.ops
        n = len(x)
        finishing = self.leave_finishing(G, x, allowed) if ov else False
        inr = [r["rpos"] >= 0 for r in x.req]
        n_run = plan.seen("decode.n_run", ops.count(inr), None)
        active = ops.and_(allowed, n_run > 0)
        free = x.g["free_blocks"]
        fits_all = plan.seen("decode.fits_all", free >= self.decode_need(ops, k, x, inr), None)
        if ov:   # SC:4469-4474
            active = ops.and_(active, ops.not_(ops.and_(finishing, ops.not_(fits_all))))
        # the preference rank: (outputs desc, prompt asc), ties in batch order
        gen = [r["generated"] for r in x.req]
        prompt = [p.slots[i]["prompt"] for i in range(n)]
        rpos = [r["rpos"] for r in x.req]

        def ahead(j, i):
            return ops.or_(gen[j] > gen[i], ops.and_(gen[j] == gen[i], prompt[j] < prompt[i]),
                           ops.and_(gen[j] == gen[i], prompt[j] == prompt[i], rpos[j] < rpos[i]))

        pr = [plan.seen("decode.rank", ops.count(ops.and_(inr[j], ahead(j, i)) for j in range(n) if j != i), i)
              for i in range(n)]
        # retract from the tail: the m-th retraction takes rank n_run - m; at least one, until the rest fit
        # or one is left
        retracted_upto = 0
        cont = True
        for m in range(1, n + 1):
            can = ops.and_(cont, n_run >= m + 1)
            retracted_upto = ops.ite(can, m, retracted_upto)
            kept_m = [ops.and_(inr[i], pr[i] < n_run - m) for i in range(n)]
            freed = ops.sum(ops.ite(ops.and_(inr[i], pr[i] >= n_run - m), x.req[i]["blocks"], 0) for i in range(n))
            cont = ops.and_(can, ops.not_(free + freed >= self.decode_need(ops, k, x, kept_m)))
        retracting = ops.and_(active, ops.not_(fits_all))
        n_keep = plan.seen("decode.n_keep", n_run - ops.ite(retracting, retracted_upto, 0), None)
        kept = [ops.and_(inr[i], pr[i] < n_keep) for i in range(n)]
        freed = ops.sum(ops.ite(ops.and_(inr[i], pr[i] >= n_keep), x.req[i]["blocks"], 0) for i in range(n))
        abort = plan.seen("decode.abort", ops.and_(retracting, n_keep <= 1, ops.not_(
            free + freed >= self.decode_need(ops, k, x, kept))), None)
        n_wait = ops.count(r["wpos"] >= 0 for r in x.req)
        for i, r in enumerate(x.req):
            with G.when(ops.and_(retracting, inr[i], pr[i] >= n_keep)):     # retracted: to the queue's tail
                self.release(G, k, p, x, i)
                G.set(r, "phase", PREEMPTED)
                G.set(r, "computed", 0)
                G.set(r, "preemptions", r["preemptions"] + 1)
                G.set(r, "rpos", -1)
                G.set(r, "wpos", plan.seen("decode.requeue_rank", n_wait + (n_run - 1 - pr[i]), i))
                plan.flag(G, "preempted", i)
            with G.when(ops.and_(abort, kept[i])):                            # the last one does not fit
                self.release(G, k, p, x, i)
                G.set(r, "phase", FAILED)
                G.set(r, "rpos", -1)
                plan.flag(G, "failed", i)
            with G.when(ops.and_(retracting, kept[i], ops.not_(abort))):      # filter_batch: preference order
                G.set(r, "rpos", pr[i])
        with G.when(retracting):
            G.set(x.g, "full", False)
        ran = ops.and_(active, ops.not_(abort))
        for i, r in enumerate(x.req):
            with G.when(ops.and_(ran, r["rpos"] >= 0)):
                blocks = k.blocks_for(ops, r["computed"] + 1)
                G.set(x.g, "free_blocks", x.g["free_blocks"] - (blocks - r["blocks"]))
                G.set(r, "blocks", blocks)
                plan.schedule(G, i, 1)
        return ran

    def leave_finishing(self, G: Guarded, x: SlotState, allowed):
        """_Iteration.finishing_in_flight and the top of decode (SC _reqs_finishing_inflight, update_running_batch
        4463-4467): the running requests whose queued result commits their last output by length (outputs + 1 >=
        the clipped max_new, outputs not yet counting that result) leave the running batch for good, the rest
        keeping their order, and the latch clears. Returns whether any left."""
        ops = G.ops
        n = len(x)
        inr = [r["rpos"] >= 0 for r in x.req]
        rpos = [r["rpos"] for r in x.req]
        fin = [ops.and_(allowed, inr[i], r[IN_FLIGHT], r["generated"] + 1 >= r["cap"]) for i, r in enumerate(x.req)]
        finishing = ops.or_(*fin)
        stays = [ops.and_(inr[i], ops.not_(fin[i])) for i in range(n)]
        with G.when(finishing):
            for i, r in enumerate(x.req):
                before = ops.count(ops.and_(stays[j], rpos[j] < rpos[i]) for j in range(n) if j != i)
                G.set(r, "rpos", ops.ite(stays[i], before, -1))
            G.set(x.g, "full", False)
        return finishing

    # -- the forward pass and its result ----------------------------------------------------------------
    def execute(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, stops: list) -> None:
        """Sglang.execute (event_loop_normal): every scheduled request samples a token (no chunks in this subset);
        an input-length abort ends REJECTED, an abort in flight ends CANCELLED, a request at its clipped length
        finishes. With ignore_eos a stop token ends nothing. event_loop_overlap: model/symbolic/overlap.py's
        `OverlapLoop.execute` (launch this step's batch with `forward`, then `land` the batch queued when the step
        began)."""
        if overlap(k):
            return OverlapLoop.execute(self, G, k, p, x, plan, stops)
        ops = G.ops
        for i, r in enumerate(x.req):
            doomed, to_finish = r["doomed"], r["to_finish"]
            with G.when(plan.rec.flags["scheduled"][i]):
                with G.when(doomed):
                    self.release(G, k, p, x, i)
                    G.set(r, "phase", REJECTED)
                    G.set(r, "computed", 0)
                    G.set(r, "doomed", False)
                    plan.flag(G, "rejected", i)
                with G.when(ops.not_(doomed)):
                    computed = r["computed"] + plan.own[i]
                    G.set(r, "computed", computed)
                    G.set(r, "generated", r["generated"] + 1)
                    G.set(r, "phase", DECODING)
                    G.set(r, "blocks", k.blocks_for(ops, computed))
                    with G.when(to_finish):
                        self.release(G, k, p, x, i)
                        G.set(r, "phase", CANCELLED)
                        G.set(r, "to_finish", False)
                    with G.when(ops.and_(ops.not_(to_finish), r["generated"] >= r["cap"])):
                        self.finish(G, k, p, x, i)
                        plan.flag(G, "finished", i)
        self.after_step(G, k, p, x, plan)

    def forward(self, G: Guarded, p: Params, x: SlotState, plan: Plan, i: int, sample: bool):
        """sglang_overlap.launch for scheduled slot i, as `OverlapLoop.launch` calls it (sample False: the token
        lands next iteration): the batch's KV is committed (kv_committed_len, AL:684-686 for a decode; its pages were
        taken by the pass) and the request is DECODING; every row samples (no chunked request in this subset), so
        the launch's `in_flight` is "scheduled". event_loop_normal's `execute` above is written out instead."""
        assert not sample, "the sglang core samples in `execute` (event_loop_normal) or `land` (event_loop_overlap)"
        r = x.req[i]
        G.set(r, "computed", r["computed"] + plan.own[i])
        G.set(r, "phase", DECODING)
        return True

    def land(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, queued: list, stops: list) -> None:
        """sglang_overlap.land (BRP process_batch_result_prefill / _decode) for the rows `queued`: a request ended
        since its launch, or retracted since (PREEMPTED, `is_retracted`), is skipped and the token sampled for it
        is lost (BRP:343-349, 1022-1027); an input-length abort with no abort since ends REJECTED (its 1-token
        prefill ran); otherwise the token is appended and update_finish_state runs: an abort received meanwhile
        (`to_finish`, SB:2011-2014) ends it CANCELLED (replacing an input-length abort's), the clipped length
        FINISHED; each released. With ignore_eos a stop token ends nothing (`stops` unread)."""
        ops = G.ops
        for i, r in enumerate(x.req):
            ph, doomed, to_finish = r["phase"], r["doomed"], r["to_finish"]
            lands = ops.and_(queued[i], ops.not_(terminal(ops, ph)), ph != PREEMPTED)
            rejects = ops.and_(doomed, ops.not_(to_finish))
            with G.when(ops.and_(lands, rejects)):
                self.release(G, k, p, x, i)
                G.set(r, "phase", REJECTED)
                G.set(r, "computed", 0)
                G.set(r, "doomed", False)
                plan.flag(G, "rejected", i)
            with G.when(ops.and_(lands, ops.not_(rejects))):
                G.set(r, "generated", r["generated"] + 1)
                with G.when(to_finish):
                    self.release(G, k, p, x, i)
                    G.set(r, "phase", CANCELLED)
                    G.set(r, "to_finish", False)
                    G.set(r, "doomed", False)
                with G.when(ops.and_(ops.not_(to_finish), r["generated"] >= r["cap"])):
                    self.finish(G, k, p, x, i)
                    plan.flag(G, "finished", i)


class _Adder:
    """_Adder over slots for one pass: the budget terms, and SGLang's list of (tokens left, tokens occupied)
    as a position per slot (`spos`, -1 when not in the list). With one request among others
    (`one_request`) the list is theirs: the candidate's own entry (`bs`, how many entries from its
    own to the list's end; `freed`, what the entries before it occupy; `left_bs`, its tokens left
    times bs) and whether another entry fails the simulation are read at its turn."""

    def __init__(self, core: SglangCore, ops, k: Knobs, p: Params, x: SlotState, plan: Plan, free):
        self.core, self.ops, self.k, self.p, self.x = core, ops, k, p, x
        self.plan, self.free, self.turn = plan, free, 0
        self.one = core.one_request(plan)
        n = len(x)
        self.page = k.block_size
        self.total_offset = ops.sum(ops.ite(r["rpos"] >= 0, ops.min(r["cap"] - r["generated"], CLIP_MAX_NEW_TOKENS), 0)
                                    for r in x.req)
        self.current_offset = 0
        self.rem_input = k.max_num_tokens
        self.count = 0
        self.adm = [-1] * n                   # position in can_run_list
        self.extend = [0] * n
        self.spos = [-1] * n
        self.size = 0
        self.initialised = False

    @property
    def available(self):
        return self.free * self.page

    def no_token(self):
        ops = self.ops
        return ops.not_(ops.and_(self.available - self.total_offset > 0, self.available - self.current_offset > 0))

    def paged(self, tokens):
        return self.k.blocks_for(self.ops, tokens) * self.page

    def context(self, i: int):
        r = self.x.req[i]
        return self.ops.ite(r["doomed"], 1, self.p.slots[i]["prompt"]) + r["generated"]

    def left(self, i: int):
        r = self.x.req[i]
        return r["cap"] - r["generated"]

    def add_one_req_ignore_eos(self, sel: list, going):
        """_Adder.add_one_req_ignore_eos for the slot `sel` marks, where `going`; returns (NO_TOKEN, CONTINUE)."""
        ops, x, n = self.ops, self.x, len(self.x)
        pick = lambda values: ops.sum(ops.ite(sel[i], values[i], 0) for i in range(n))   # noqa: E731
        ctx = [self.context(i) for i in range(n)]
        left = [self.left(i) for i in range(n)]
        cand, cap = pick(ctx), pick([r["cap"] for r in x.req])
        paged_input = self.paged(cand) + self.page
        fits = paged_input <= ops.min(self.available - self.current_offset, self.available - self.total_offset)
        act = ops.and_(going, fits)
        # the finish-order simulation over the list
        cur = self.available - self.current_offset - paged_input
        if self.one:
            bs, freed, left_bs, others_bad = self.plan.at_turn("prefill", self.turn, bs=1, freed=0,
                                                                left_bs=pick(left), others_bad=False)
            inset = ops.and_(act, pick(left) > 0)
            own_bad = ops.and_(inset, cur + freed - left_bs <= IGNORE_EOS_RESERVE_TOKENS * bs)
            any_bad = ops.or_(own_bad, others_bad)
        else:
            self.add_state(sel, left, act)
            occ = [self.context(i) for i in range(n)]
            bad, bs, freed, left_bs = [], [], [], []
            for i in range(n):
                bs.append(self.size - self.spos[i])
                freed.append(ops.sum(ops.ite(ops.and_(self.spos[j] >= 0, self.spos[j] < self.spos[i]), occ[j], 0)
                                     for j in range(n) if j != i))
                left_bs.append(ops.sum(ops.ite(bs[i] == b, left[i] * b, 0) for b in range(1, n + 1)))
                bad.append(ops.and_(self.spos[i] >= 0,
                                    cur + freed[i] - left_bs[i] <= IGNORE_EOS_RESERVE_TOKENS * bs[i]))
            if self.plan.env is not None:   # the candidate's entry, and the others', as its turn reads them
                self.plan.at_turn("prefill", self.turn, bs=pick(bs), freed=pick(freed),
                                  left_bs=pick(left_bs),
                                  others_bad=ops.or_(*[ops.and_(bad[i], ops.not_(sel[i])) for i in range(n)]))
            any_bad = ops.or_(*bad)
        admit = ops.and_(act, ops.not_(any_bad))
        charge = ops.min(cap, CLIP_MAX_NEW_TOKENS)
        self.total_offset = ops.ite(admit, self.total_offset + self.paged(cand) + self.page + charge,
                                    self.total_offset)
        self.current_offset = ops.ite(admit, self.current_offset + self.paged(cand) + self.page, self.current_offset)
        self.rem_input = ops.ite(admit, self.rem_input - self.paged(cand), self.rem_input)
        for i in range(n):
            self.adm[i] = ops.ite(ops.and_(admit, sel[i]), self.count, self.adm[i])
            self.extend[i] = ops.ite(ops.and_(admit, sel[i]), ctx[i], self.extend[i])
        self.count = ops.ite(admit, self.count + 1, self.count)
        state_no_token = self.no_token()
        state_other = self.rem_input <= 0
        no_token = ops.or_(ops.not_(fits), ops.and_(fits, any_bad), ops.and_(admit, state_no_token))
        cont = ops.and_(admit, ops.not_(state_no_token), ops.not_(state_other))
        return no_token, cont

    def add_state(self, sel: list, left: list, act) -> None:
        """_Adder.add_req_state: the first time, the request, then the running batch in order, stably sorted by
        tokens left; later, inserted where SGLang's scan puts it (before the first entry with at least as many
        tokens left, else before the last one). Requests with nothing left are not listed. A later call acts only
        after the first did: the pass goes on to a second request only if the first was admitted."""
        ops, x, n = self.ops, self.x, len(self.x)
        if not self.initialised:
            # an empty can_run_list at the first call: chunked prefill is off, so nothing was admitted before it
            member = [ops.and_(act, ops.or_(sel[i], x.req[i]["rpos"] >= 0), left[i] > 0) for i in range(n)]
            key = [ops.ite(sel[i], -1, x.req[i]["rpos"]) for i in range(n)]
            for i in range(n):
                before = ops.count(ops.and_(member[j], ops.or_(left[j] < left[i], ops.and_(left[j] == left[i],
                                                                                        key[j] < key[i])))
                                   for j in range(n) if j != i)
                self.spos[i] = ops.ite(member[i], before, self.spos[i])
            self.size = ops.ite(act, ops.count(member), self.size)
            self.initialised = True
            return
        insert = ops.and_(act, ops.or_(*[ops.and_(sel[i], left[i] > 0) for i in range(n)]))
        new_left = ops.sum(ops.ite(sel[i], left[i], 0) for i in range(n))
        first_match = self.size - 1
        for i in range(n):
            first_match = ops.ite(ops.and_(self.spos[i] >= 0, new_left <= left[i], self.spos[i] < first_match),
                                  self.spos[i], first_match)
        at = ops.ite(self.size == 0, 0, first_match)
        for i in range(n):
            shifted = ops.ite(ops.and_(self.spos[i] >= 0, self.spos[i] >= at), self.spos[i] + 1, self.spos[i])
            self.spos[i] = ops.ite(ops.and_(insert, sel[i]), at, ops.ite(insert, shifted, self.spos[i]))
        self.size = ops.ite(insert, self.size + 1, self.size)
