"""TensorRT-LLM `KVCacheV2Scheduler` as a core: model/policies/trtllm_v2.py over slots.

Every method re-expresses the method of the same name in model/policies/trtllm_v2.py (`_Pass`),
which cites the engine (TensorRT-LLM 1.4.0rc, scheduler_v2.py @00746ef9, kv_cache_manager_v2.py
@00439672, _storage_manager.py @00f6bd61). The list L of that module is the slots in order,
restricted to the requests unfinished when the pass starts; list indices become slot indices.

Covered: chunked prefill on/off, chunk unit, drafts, recompute pause on/off, fixes A, B (E
changes only the message), the resume utilisation gate, the stall detector, and a host tier
(`host_blocks` > 0, a number or a term): suspension moves a request's pages to the host tier
when it has room for all of them (M `suspend_request`), resumption brings them back when the
GPU has room and the gate allows it, suspended pages left on the GPU count as evictable in the
gate, `_try_evict_for_gen` retries the allocation after each suspension, the recompute-pause
ladder may take a request suspended this pass, and preemption for pages is off (S
`_try_preempt_for_pages`). The one configuration refused is the policy's own (`check_config`:
fix B with a host tier). Two steps of `_try_recompute_pause_for_gen` that never act in this
model are left out, with the argument in `recompute_pause_for_generation`.

Where `host_blocks` is the number 0 (the field report's design) the core is written without
the host tier, using what `host-blocks-conserved` proves there (no request ever holds a host
page), so those designs get the terms they had before the tier was covered: suspension frees
no page and the gate counts none as evictable, so in `_try_evict_for_gen` every retry fails as
the first did and is left out (the loop suspends every evictable request in (i, end) and moves
`end` to the lowest), and a resumption moves no page. The differential tests run both forms
against the policy (host_blocks = 0 and > 0 concretely; the Z3 relation with host_blocks a term).

Acceleration (`decode_guard` / `decode_advance`): k identical passes in which every unfinished
request decodes or is a context stopped at the head by the budget (the replay-over-budget
victim of #21826 is one), all decoders fit and get their pages, and nothing arrives, stops or
finishes. With a host tier the guard also asks that no request is suspended or holds host
pages (the invariants imply it; saying it keeps the proof independent of which invariants a
search could prove), so nothing is resumed, evicted or moved between tiers inside a run.
checkers/accel.py proves it equal to k single steps.

Both executor loops (model/policies/trtllm_overlap.py): `_executor_loop` (disable_overlap_scheduler), and
TensorRT-LLM's default, `_executor_loop_overlap`, as model/symbolic/overlap.py (`OverlapLoop`: the step's execute
is the launch of batch k, rule 4, then the landing of batch k-1, rule 5, with `paused_token_landed` below; the
per-slot `in_flight` field is batch k-1's sampling rows, rule 6). The pass reads GENERATION_TO_COMPLETE (rule 2,
`to_complete`) where the policy's does: skipped by the generation loop with no budget, never a recompute-pause
candidate (so never a victim of either ladder), not counted by the detector. In `_executor_loop` nothing reads or
writes `in_flight`. In the overlap loop no decode run is accelerated (`decode_guard` is false there), the
micro-steps are not used (they refuse it), and two invariants say where a launched decoder differs
(`decode_cursor`, `in-flight-decodes`).
"""

from __future__ import annotations

from fractions import Fraction

from ...config import ConfigError, EngineConfig
from ...policies import trtllm_v2 as _policy  # noqa: F401  (registers the policy: check_config)
from ...policies.trtllm_overlap import in_flight
from ...policy import POLICIES
from ..core import Core, Plan, register
from ..ops import Guarded
from ..overlap import FIELD as IN_FLIGHT
from ..overlap import OverlapLoop, in_flight_decodes, overlap, to_complete
from ..overlap import decode_cursor as overlap_decode_cursor
from . import trtllm_v2_micro as micro
from ..slots import (CANCELLED, DECODING, FAILED, FINISHED, PENDING, PREEMPTED, PREFILLING, REJECTED,
                     WAITING, Knobs, Params, SlotState, started, unfinished)


@register
class TrtllmV2Core(OverlapLoop, Core):
    policy = "trtllm_v2"
    # batch k-1's sampling requests in the overlap loop (model/symbolic/overlap.py); never read or written in the
    # other loop
    extra_req_fields = {IN_FLIGHT: bool}
    extra_global_fields = {"stalls": int}
    phases = (PENDING, WAITING, PREFILLING, DECODING, PREEMPTED, FINISHED, FAILED, REJECTED, CANCELLED)
    accelerates = True

    def unsupported(self, cfg: EngineConfig, params=None):
        try:
            POLICIES[self.policy].check_config(cfg)   # fix B only applies with host_blocks = 0
        except ConfigError as e:
            return (e.field, e.reason)
        return None

    def initial_req_extra(self, ops, k, p, i):
        return {IN_FLIGHT: False}

    def abstract_req_extra(self, cfg, state, rid):
        return {IN_FLIGHT: rid in in_flight(state)}

    def absent_req_extra(self, i):
        return {IN_FLIGHT: False}

    def initial_global_extra(self, ops, k, p):
        return {"stalls": 0}

    def abstract_global_extra(self, cfg, state):
        return {"stalls": state.sched.stalls}

    def core_invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        """What the V2 pass keeps true of the requests it handles (proved with the generic ones)."""
        inv = {"stalls": ops.and_(s.g["stalls"] >= 0,
                                  ops.or_(s.g["stalls"] < k.options.stall_limit, s.g["error"]))}
        tier = has_host_tier(k)
        for i, r in enumerate(s.req):
            ph = r["phase"]
            # pages the request's KV holds on either tier (on the GPU alone without a host tier)
            held = r["blocks"] + r["host_blocks"] if tier else r["blocks"]
            inv[f"r{i}.waiting-is-fresh"] = ops.implies(ph == WAITING, ops.and_(
                r["blocks"] == 0, r["computed"] == 0, r["generated"] == 0, r["preemptions"] == 0,
                ops.not_(r["suspended"]), r["host_blocks"] == 0 if tier else True))
            inv[f"r{i}.paused-holds-nothing"] = ops.implies(ph == PREEMPTED, ops.and_(
                r["blocks"] == 0, r["computed"] == 0, ops.not_(r["suspended"]), r["preemptions"] >= 1,
                r["host_blocks"] == 0 if tier else True))
            inv[f"r{i}.suspended-is-started"] = ops.implies(r["suspended"], ops.and_(
                started(ops, ph), held > 0))
            if tier:
                # M `suspend_request` moves all of a request's pages or none; only `resume` and
                # the releases bring them back, and they clear `suspended` with them
                inv[f"r{i}.host-pages-are-suspended"] = ops.implies(r["host_blocks"] > 0, ops.and_(
                    r["suspended"], r["blocks"] == 0))
            if isinstance(k.block_size, int):
                inv[f"r{i}.kv-has-pages"] = ops.implies(started(ops, ph), held * k.block_size >= r["computed"])
            # a decoder holds exactly the pages of its cursor plus drafts: the last context pass
            # sized it to context + drafts, each generation step to cursor + 1 + drafts, and
            # nothing else changes a decoder's pages (suspension keeps them, on either tier)
            inv[f"r{i}.decode-pages"] = ops.implies(ph == DECODING, held == k.blocks_for(
                ops, r["computed"] + k.options.draft_len))
            if k.chunked_prefill:
                # a chunk (not the last) is sized to the cursor exactly, the first from no pages
                inv[f"r{i}.prefill-pages"] = ops.implies(ph == PREFILLING, held == k.blocks_for(
                    ops, r["computed"]))
            if not k.chunked_prefill:
                # chunking off: a context is scheduled whole and completes in its step
                inv[f"r{i}.context-whole"] = ph != PREFILLING
            if overlap(k):
                inv[f"r{i}.in-flight-decodes"] = in_flight_decodes(ops, s, i)
        return inv

    def decode_cursor(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """overlap.decode_cursor in the overlap loop (a decoder in flight has one more token in its KV)."""
        if not overlap(k):
            return super().decode_cursor(ops, k, p, s, i)
        return overlap_decode_cursor(ops, p, s, i)

    def step(self, ops, k: Knobs, p: Params, s: SlotState, env=None):
        """Where the micro-steps cover the design (_executor_loop, chunked prefill off, no host tier:
        trtllm_v2_micro.py), the step is theirs, run on the slots: the proofs for every n (checkers/parametric) take
        apart this very step. Elsewhere `Core.step` with the pass below (and in the overlap loop, overlap.py's
        execute). The two are equal where both apply (the refinement checks of checkers/parametric/refinement.py,
        the differential tests)."""
        if micro.unsupported(k) is None:
            post, rec = micro.core_step(ops, k, p, s)
            for a, b in zip(post.req, s.req):
                if IN_FLIGHT in b:              # the other loop: never read or written (the array model's own
                    a[IN_FLIGHT] = b[IN_FLIGHT]  # slot views, checkers/parametric, have no such field)
            return post, rec
        return super().step(ops, k, p, s, env)

    def paused_token_landed(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, i: int, done) -> None:
        """The policy's `paused_token_landed` (E `_pause_recompute_paused_requests` resets only a victim that is not
        finished): a victim finished by its in-flight token ends (its KV is already freed); otherwise it replays
        prompt + every generated token, that one included."""
        with G.when(done):
            self.finish(G, k, p, x, i)
            plan.flag(G, "finished", i)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        _Pass(G, k, p, x, plan).run()

    # -- acceleration ----------------------------------------------------------------------
    def accelerates_in(self, k: Knobs) -> bool:
        """No decode run is accelerated in the overlap loop (`decode_guard` is false there), so no search or proof
        there asks for acceleration or proves it."""
        return not overlap(k)

    def decode_guard(self, ops, k: Knobs, p: Params, s: SlotState, n):
        """The next n passes are identical pure-decode passes (see the module docstring). Never in the overlap
        loop (no decode run is accelerated there: every step is a single step)."""
        if overlap(k):
            return False
        o = k.options
        step = s.g["step"]
        per = 1 + o.draft_len
        tier = has_host_tier(k)
        conds = [ops.not_(s.g["error"]), n >= 1]
        decoders = []
        need = []
        for i, (r, w) in enumerate(zip(s.req, p.slots)):
            live = ops.and_(w["present"], unfinished(ops, r["phase"]))
            dec = ops.and_(live, r["phase"] == DECODING)
            decoders.append(dec)
            # nothing arrives or is cancelled in [step, step + n)
            conds.append(ops.implies(w["present"], ops.or_(w["arrival"] < step, w["arrival"] >= step + n)))
            conds.append(ops.implies(ops.and_(w["present"], w["cancel_at"] >= 0),
                                     ops.or_(w["cancel_at"] < step, w["cancel_at"] >= step + n)))
            # a decoder is active, not suspended, and neither finishes nor stops in the window
            conds.append(ops.implies(dec, ops.and_(
                ops.not_(r["suspended"]), r["host_blocks"] == 0 if tier else True,
                r["generated"] + n < w["max_new"],
                ops.or_(w["output_len"] <= 0, r["generated"] + n < w["output_len"]))))
            need.append(ops.ite(dec, ops.max(k.blocks_for(ops, r["computed"] + n + o.draft_len) - r["blocks"], 0), 0))
        count = ops.count(decoders)
        conds += [count >= 1, count <= k.max_batch_size, count * per <= k.max_num_tokens,
                  ops.sum(need) <= s.g["free_blocks"]]
        # Every other unfinished request is a fresh or paused context (holding no page) and the
        # first of them in L is stopped by the budget before it allocates anything: with
        # chunking off, its whole remaining context does not fit what the decoders leave.
        first = True
        for i, (r, w) in enumerate(zip(s.req, p.slots)):
            live = ops.and_(w["present"], unfinished(ops, r["phase"]))
            ctx = ops.and_(live, r["phase"] != DECODING)
            conds.append(ops.implies(ctx, ops.and_(r["blocks"] == 0, r["computed"] == 0,
                                                   ops.not_(r["suspended"]), r["host_blocks"] == 0 if tier else True,
                                                   ops.or_(r["phase"] == WAITING, r["phase"] == PREEMPTED))))
            if k.chunked_prefill:
                conds.append(ops.not_(ctx))
                continue
            remaining = w["prompt"] + r["generated"]
            blocked = remaining + o.draft_len > k.max_num_tokens - count * per
            # the first context in L (no context before it) must be blocked
            conds.append(ops.implies(ops.and_(ctx, first), blocked))
            first = ops.and_(first, ops.not_(ctx))
        return ops.and_(*conds)

    def decode_advance(self, ops, k: Knobs, p: Params, s: SlotState, n) -> SlotState:
        o = k.options
        x = s.copy()
        taken = []
        for i, (r, w) in enumerate(zip(x.req, p.slots)):
            dec = ops.and_(w["present"], unfinished(ops, r["phase"]), r["phase"] == DECODING)
            grown = ops.max(k.blocks_for(ops, r["computed"] + n + o.draft_len), r["blocks"])
            taken.append(ops.ite(dec, grown - r["blocks"], 0))
            r["blocks"] = ops.ite(dec, grown, r["blocks"])
            r["computed"] = ops.ite(dec, r["computed"] + n, r["computed"])
            r["generated"] = ops.ite(dec, r["generated"] + n, r["generated"])
        x.g["free_blocks"] = x.g["free_blocks"] - ops.sum(taken)
        x.g["step"] = x.g["step"] + n
        x.g["stalls"] = 0
        return x


class _Pass:
    """One call of S `schedule_request` (model/policies/trtllm_v2.py `_Pass`), over slots.

    The victim loops (`evict_for_generation`, `recompute_pause_for_generation`, `preempt_for_pages`) skip a slot
    whose eligibility is the constant False: under that guard every assignment is `ite(False, new, old)`, which
    both `Concrete` and `Symbolic` fold to `old`, so the body changes nothing. On numbers most slots are not
    eligible, and their bodies were most of a pass's cost: a chunked-prefill scenario's run takes 0.37 of its
    former time (docs/benchmarks.md, "The cores on numbers"). On terms a guard is a constant only where it
    folded to one."""

    def __init__(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan):
        self.G, self.ops, self.k, self.o, self.p, self.x, self.plan = G, G.ops, k, k.options, p, x, plan
        ops = self.ops
        n = len(x)
        self.n = n
        self.in_list = [ops.and_(w["present"], unfinished(ops, r["phase"])) for w, r in zip(p.slots, x.req)]
        self.budget_tokens = 0
        self.budget_requests = 0
        self.end = n                  # slot index bound of the generation loop (S `end`)
        self.frontier = n             # S recompute_pause_state.frontier
        self.victims = [False] * n    # paused by the generation phase this pass
        self.evicted = [False] * n    # suspended this pass
        self.paused = [False] * n     # recompute-paused this pass
        self.gen_s = [False] * n
        self.ctx_s = [False] * n
        self.pending = [False] * n    # contexts collected by the generation loop
        self.preempted_ids = [False] * n
        util = Fraction(self.o.max_util_for_resume).limit_denominator(10 ** 6)
        self.util_num, self.util_den = util.numerator, util.denominator
        self.tier = has_host_tier(k)                       # the host-tier code is built at all
        self.overlap = overlap(k)                          # the overlap loop: GENERATION_TO_COMPLETE is read
        self.can_evict = k.host_blocks > 0 if self.tier else False   # M `can_evict`

    # -- small helpers -------------------------------------------------------------------
    def r(self, i: int) -> dict:
        return self.x.req[i]

    def w(self, i: int) -> dict:
        return self.p.slots[i]

    def setflag(self, flags: list, i: int) -> None:
        flags[i] = self.ops.or_(flags[i], self.G.guard)

    def setval(self, name: str, value) -> None:
        setattr(self, name, self.ops.ite(self.G.guard, value, getattr(self, name)))

    def requests_full(self):
        return self.budget_requests >= self.k.max_batch_size

    def to_complete(self, i: int):
        """trtllm_overlap.to_complete (rule 2) on slot i's current values; never in the other loop."""
        return to_complete(self.ops, self.p, self.x, i) if self.overlap else False

    def can_fit(self, tokens):
        return self.budget_tokens + tokens <= self.k.max_num_tokens

    def commit(self, tokens) -> None:
        self.setval("budget_tokens", self.budget_tokens + tokens)
        self.setval("budget_requests", self.budget_requests + 1)

    def context_len(self, i: int):
        return self.w(i)["prompt"] + self.r(i)["generated"]

    def remaining_context(self, i: int):
        return self.ops.ite(self.r(i)["phase"] == DECODING, 0, self.context_len(i) - self.r(i)["computed"])

    def run(self) -> None:
        before = self.x.g["free_blocks"] + self.ops.sum(r["blocks"] for r in self.x.req) if self.tier else None
        self.generation_phase()
        self.context_phase()
        self.detect_deadlock()
        self.check_forward_tokens()
        if self.tier:
            # Every page operation of the pass (grow, bring_back, a suspension to the host tier,
            # release) moves pages between the free pool and one request, so on every state the
            # free count after the pass is what was free or held before less what is held now.
            # Written so, the solver need not re-derive that conservation through every guarded
            # update: with a host tier `blocks-conserved` otherwise takes longer than a search's
            # per-lemma limit, and a search without it as a lemma is several times slower.
            self.x.g["free_blocks"] = before - self.ops.sum(r["blocks"] for r in self.x.req)

    # -- S `schedule_request`, first loop ----------------------------------------------
    def generation_phase(self) -> None:
        ops, G = self.ops, self.G
        going = True   # the loop has not broken
        for i in range(self.n):
            visit = ops.and_(going, self.in_list[i], i < self.end, ops.not_(self.victims[i]))
            with G.when(visit):
                full = self.requests_full()
                going = ops.ite(G.guard, ops.not_(full), going)
                # rule 2: a GENERATION_TO_COMPLETE request is outside the schedulable range: skipped, no budget
                with G.when(ops.and_(ops.not_(full), ops.not_(self.to_complete(i)))):
                    decoding = self.r(i)["phase"] == DECODING
                    with G.when(ops.not_(decoding)):
                        self.setflag(self.pending, i)
                    with G.when(decoding):
                        scheduled = self.try_generation(i)
                        going = ops.ite(G.guard, scheduled, going)
                        with G.when(scheduled):
                            self.setflag(self.gen_s, i)
                            self.plan.schedule(G, i, 1, self.o.draft_len)
                            self.commit(1 + self.o.draft_len)

    def try_generation(self, i: int):
        """S `_try_schedule_generation`; true when scheduled (false is STOP)."""
        ops, G = self.ops, self.G
        fits = self.can_fit(1 + self.o.draft_len)
        ok = False
        with G.when(fits):
            got = self.allocate_generation(i)
            ok = ops.ite(G.guard, got, ok)
            with G.when(ops.not_(got)):
                got = self.evict_for_generation(i)
                if got is not False:    # a retry can succeed only with a host tier
                    ok = ops.ite(G.guard, got, ok)
                if self.o.enable_recompute_pause:
                    with G.when(ops.not_(got)):
                        got = self.recompute_pause_for_generation(i)
                        ok = ops.ite(G.guard, got, ok)
            with G.when(ops.not_(ok)):
                r = self.r(i)
                with G.when(ops.and_(r["blocks"] > 0, ops.not_(r["suspended"]))):
                    self.suspend(i)   # self-eviction
        return ops.and_(fits, ok)

    def allocate_generation(self, i: int):
        """M `try_allocate_generation`: resume if suspended (may be refused), then grow."""
        ops, G = self.ops, self.G
        r = self.r(i)
        blocked = ops.and_(r["suspended"], ops.not_(self.resume_allowed(i)))
        ok = False
        with G.when(ops.not_(blocked)):
            if self.tier:
                with G.when(r["suspended"]):
                    self.bring_back(i)
            G.set(r, "suspended", False)
            need = self.k.blocks_for(ops, r["computed"] + 1 + self.o.draft_len) - r["blocks"]
            ok = ops.ite(G.guard, self.grow(i, need), ok)
        return ok

    def evict_for_generation(self, i: int):
        """S `_try_evict_for_gen`: suspend later started requests with active KV, newest first,
        each time moving `end` to it and retrying the allocation; true once a retry succeeds.
        Without a host tier suspension frees nothing and the gate counts nothing as evictable,
        so every retry fails as the first did: the retries are left out and the loop suspends
        every evictable request in (i, end)."""
        ops, G = self.ops, self.G
        new_end = self.end
        done = False
        for j in range(self.n - 1, i, -1):
            r = self.r(j)
            # j < end: each suspension moves end below every later candidate, so the scan
            # downwards from the old end visits exactly the policy's successive last_index picks
            evictable = ops.and_(ops.not_(done), self.in_list[j], j < self.end, started(ops, r["phase"]),
                                 r["blocks"] > 0, ops.not_(r["suspended"]))
            if evictable is False:
                continue   # changes nothing: see the class docstring
            with G.when(evictable):
                self.suspend(j)
                new_end = ops.ite(G.guard, j, new_end)
                if self.tier:
                    done = ops.ite(G.guard, self.allocate_generation(i), done)
        self.end = new_end
        return done

    def recompute_pause_for_generation(self, i: int):
        """S `_try_recompute_pause_for_gen`: victims newest first below the frontier, retrying
        the allocation after each; true once it succeeds. A request suspended this pass is a
        candidate only with a host tier (`can_evict`).

        Two parts of the engine's loop never act in this model and are left out (the
        differential tests hold the core to the policy, which has them):
        - the retry of `_try_evict_for_gen` after each pause (host tier only):
          `_try_schedule_generation` ran it for this request just before and it failed, so it
          suspended every evictable request in (i, end) and lowered `end` to the lowest of them;
          a pause makes no request evictable (it frees the victim's KV), so the retry finds
          none and fails;
        - the promotion of a request suspended this pass when no candidate is left below the
          frontier (host tier only): each pick is the newest candidate below the frontier and
          becomes the frontier, and no request becomes a candidate during the generation phase
          (a candidate is started, and only the context phase starts a request), so every
          candidate at or above the frontier is already a victim.
        What is left is one scan, newest first: each pick lowers the frontier below the next."""
        ops, G = self.ops, self.G
        done = False
        for j in range(self.n - 1, i, -1):
            eligible = ops.and_(ops.not_(done), self.in_list[j], j < self.frontier, ops.not_(self.victims[j]),
                                self.rp_candidate(j), ops.or_(self.can_evict, ops.not_(self.evicted[j])))
            if eligible is False:
                continue   # changes nothing: see the class docstring
            with G.when(eligible):
                self.recompute_pause(j)
                self.setflag(self.victims, j)
                self.setval("frontier", j)
                done = ops.ite(G.guard, self.allocate_generation(i), done)
        return done

    def rp_candidate(self, j: int):
        """S `_is_recompute_pause_candidate`; fix A [inferred]: the replay still fits the budget."""
        ops = self.ops
        ok = started(ops, self.r(j)["phase"])
        if self.overlap:   # rule 2: GENERATION_TO_COMPLETE is never a victim
            ok = ops.and_(ok, ops.not_(self.to_complete(j)))
        if self.o.fix_replay_fit and not self.k.chunked_prefill:
            ok = ops.and_(ok, self.context_len(j) + self.o.draft_len <= self.k.max_num_tokens)
        return ok

    # -- S `schedule_request`, second loop -------------------------------------------------
    def context_phase(self) -> None:
        ops, G = self.ops, self.G
        going = True
        for i in range(self.n):
            with G.when(ops.and_(going, self.pending[i])):
                full = self.requests_full()
                going = ops.ite(G.guard, ops.not_(full), going)
                visit = ops.not_(ops.or_(full, self.preempted_ids[i]))
                if self.k.chunked_prefill:
                    visit = ops.and_(visit, self.chunk_budget_left())
                with G.when(visit):
                    first_chunk = self.r(i)["computed"] == 0
                    act, tokens = self.try_context(i)
                    with G.when(ops.and_(first_chunk, act != SCHED)):
                        self.release(i)
                    going = ops.ite(G.guard, act != STOP, going)
                    with G.when(act == SCHED):
                        self.setflag(self.ctx_s, i)
                        draft = ops.ite(tokens == self.remaining_context(i), self.o.draft_len, 0)
                        self.plan.schedule(G, i, tokens, draft)
                        self.commit(tokens + draft)

    def try_context(self, i: int):
        return self.try_context_chunked(i) if self.k.chunked_prefill else self.try_context_full(i)

    def try_context_full(self, i: int):
        """S `_try_schedule_context_full`: (act, tokens)."""
        ops, G = self.ops, self.G
        d = self.o.draft_len
        remaining = self.remaining_context(i)
        act = STOP
        with G.when(self.prepare_context(i)):
            fits = ops.and_(self.can_fit(remaining + d), self.admissible_worst_case(i))
            with G.when(fits):
                grown = self.resize_context(i, remaining + d)
                act = ops.ite(ops.and_(G.guard, grown), SCHED, act)
                with G.when(ops.not_(grown)):
                    act = ops.ite(G.guard, ops.ite(self.preempt_for_pages(i), STOP, SKIP), act)
        return act, remaining

    def try_context_chunked(self, i: int):
        """S `_try_schedule_context_chunked`: (act, tokens)."""
        ops, G = self.ops, self.G
        k, d = self.k, self.o.draft_len
        left = k.max_num_tokens - self.budget_tokens
        remaining = self.remaining_context(i)
        act = SKIP
        chunk = ops.min(ops.min(left, remaining), k.max_num_tokens)
        unit = self.unit()
        chunk = ops.ite(chunk < remaining, ops.div(chunk, unit) * unit, chunk)
        with G.when(self.prepare_context(i)):
            with G.when(chunk > 0):
                last = chunk == remaining
                grown = self.resize_context(i, chunk + ops.ite(last, d, 0))
                act = ops.ite(ops.and_(G.guard, grown), SCHED, act)
                with G.when(ops.not_(grown)):
                    act = ops.ite(G.guard, ops.ite(self.preempt_for_pages(i), STOP, SKIP), act)
        return act, chunk

    def unit(self):
        return self.k.chunk_unit or self.k.block_size

    def chunk_budget_left(self):
        left = self.k.max_num_tokens - self.budget_tokens
        return self.ops.and_(left > 0, left >= self.unit())

    def prepare_context(self, i: int):
        """M `prepare_context_cache`: a new or suspended cache is resumed through the gate."""
        ops, G = self.ops, self.G
        r = self.r(i)
        needs_resume = ops.or_(r["blocks"] == 0, r["suspended"])
        ok = ops.or_(ops.not_(needs_resume), self.resume_allowed(i))
        with G.when(ops.and_(needs_resume, ok)):
            if self.tier:
                self.bring_back(i)
            G.set(r, "suspended", False)
        return ok

    def resize_context(self, i: int, tokens):
        r = self.r(i)
        return self.grow(i, self.k.blocks_for(self.ops, r["computed"] + tokens) - r["blocks"])

    def admissible_worst_case(self, i: int):
        """Fix B [inferred]: a fresh context that could outgrow its replay is admitted only if
        the worst-case pages of every such request plus the current pages of the others fit."""
        ops, k = self.ops, self.k
        if not self.o.fix_worst_case_admission or k.chunked_prefill:
            return True
        r = self.r(i)
        held = []
        for j in range(self.n):
            if j == i:
                continue
            o_ = self.r(j)
            counted = ops.and_(self.p.slots[j]["present"], unfinished(ops, o_["phase"]),
                               ops.not_(ops.and_(o_["blocks"] == 0, ops.not_(started(ops, o_["phase"])))))
            held.append(ops.ite(counted, ops.ite(self.reserved(j), self.worst_pages(j), o_["blocks"]), 0))
        fits = ops.sum(held) + self.worst_pages(i) <= k.num_blocks
        return ops.or_(self.can_evict, r["computed"] > 0, ops.not_(self.reserved(i)), fits)

    def reserved(self, j: int):
        """`_Pass.reserved`: those that can outgrow their replay; every request with B*."""
        return True if self.o.reserve_every_worst_case else self.outgrows(j)

    def outgrows(self, j: int):
        w = self.w(j)
        return w["prompt"] + w["max_new"] + self.o.draft_len > self.k.max_num_tokens

    def worst_pages(self, j: int):
        w = self.w(j)
        return self.k.blocks_for(self.ops, w["prompt"] + w["max_new"] + self.o.draft_len)

    def preempt_for_pages(self, i: int):
        """S `_try_preempt_for_pages`: one victim, newest first over the whole list, not
        scheduled this pass, a recompute-pause candidate with active KV."""
        ops, G = self.ops, self.G
        if not self.o.enable_recompute_pause:
            return False
        done = False
        for j in range(self.n - 1, -1, -1):
            if j == i:
                continue
            v = self.r(j)
            # only with no tier below the GPU
            eligible = ops.and_(ops.not_(self.can_evict), ops.not_(done), self.in_list[j],
                                ops.not_(self.gen_s[j]), ops.not_(self.ctx_s[j]),
                                self.rp_candidate(j), ops.not_(v["suspended"]), v["blocks"] > 0)
            if eligible is False:
                continue   # changes nothing, `done` included: see the class docstring
            with G.when(eligible):
                self.recompute_pause(j)
                self.setflag(self.preempted_ids, j)
            done = ops.or_(done, eligible)
        return done

    # -- KV operations -----------------------------------------------------------------
    def utilisation_allows_resume(self):
        """R `get_utilization` and `_KVCache.resume`: refused when unavailable / total pages
        exceeds max_util_for_resume, exactly in integers. With a host tier, suspended pages
        still on the GPU are evictable, so not unavailable."""
        ops = self.ops
        total = self.k.num_blocks
        unavailable = total - self.x.g["free_blocks"]
        if self.tier:
            evictable = ops.sum(ops.ite(r["suspended"], r["blocks"], 0) for r in self.x.req)
            unavailable = unavailable - ops.ite(self.can_evict, evictable, 0)
        return unavailable * self.util_den <= self.util_num * total

    def resume_allowed(self, i: int):
        """M `_KVCache.resume` succeeds: the gate allows it and the pages on the host tier (if
        any) fit the GPU's free pages. The resumption itself is `bring_back` plus clearing
        `suspended`, done by the caller where this holds."""
        ops = self.ops
        ok = self.utilisation_allows_resume()
        if self.tier:
            back = self.r(i)["host_blocks"]
            ok = ops.and_(ok, ops.or_(back == 0, back <= self.x.g["free_blocks"]))
        return ok

    def bring_back(self, i: int) -> None:
        """M `_KVCache.resume`: the request's pages on the host tier come back to the GPU."""
        G, r, g = self.G, self.r(i), self.x.g
        back = r["host_blocks"]
        G.set(g, "free_blocks", g["free_blocks"] - back)
        G.set(g, "free_host_blocks", g["free_host_blocks"] + back)
        G.set(r, "blocks", r["blocks"] + back)
        G.set(r, "host_blocks", 0)

    def grow(self, i: int, need):
        ops, G = self.ops, self.G
        ok = ops.or_(need <= 0, need <= self.x.g["free_blocks"])
        with G.when(ops.and_(need > 0, ok)):
            G.set(self.x.g, "free_blocks", self.x.g["free_blocks"] - need)
            G.set(self.r(i), "blocks", self.r(i)["blocks"] + need)
        return ok

    def suspend(self, i: int) -> None:
        """M `suspend_request`: the KV stays; its pages move to the host tier if there is one
        with room for all of them, and otherwise stay held on the GPU (the last tier)."""
        ops, G = self.ops, self.G
        r, g = self.r(i), self.x.g
        if self.tier:
            with G.when(ops.and_(self.can_evict, r["blocks"] <= g["free_host_blocks"])):
                G.set(g, "free_blocks", g["free_blocks"] + r["blocks"])
                G.set(g, "free_host_blocks", g["free_host_blocks"] - r["blocks"])
                G.set(r, "host_blocks", r["host_blocks"] + r["blocks"])
                G.set(r, "blocks", 0)
        G.set(r, "suspended", True)
        self.setflag(self.evicted, i)
        self.plan.flag(G, "offloaded", i)

    def recompute_pause(self, j: int) -> None:
        """S `_recompute_pause_request` + E `_pause_recompute_request`: free all KV, replay
        prompt + every generated token from cursor 0."""
        G = self.G
        # a victim suspended earlier in this pass is listed as paused only (see the policy)
        with G.when(self.evicted[j]):
            self.plan.unflag(G, "offloaded", j)
        self.evicted[j] = self.ops.and_(self.evicted[j], self.ops.not_(G.guard))
        self.release(j)
        r = self.r(j)
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.set(r, "preemptions", r["preemptions"] + 1)
        self.setflag(self.paused, j)
        self.plan.flag(G, "preempted", j)

    def release(self, i: int) -> None:
        ops, G = self.ops, self.G
        r = self.r(i)
        G.set(self.x.g, "free_blocks", self.x.g["free_blocks"] + r["blocks"])
        if self.tier:
            G.set(self.x.g, "free_host_blocks", self.x.g["free_host_blocks"] + r["host_blocks"])
            G.set(r, "host_blocks", 0)
        G.set(r, "computed", ops.ite(r["phase"] == DECODING, r["computed"], 0))
        G.set(r, "blocks", 0)
        G.set(r, "suspended", False)

    # -- ME `_prepare_tp_inputs` -------------------------------------------------------------
    def check_forward_tokens(self) -> None:
        """`_Pass.check_forward_tokens`: unless the detector raised, the tokens run (drafts
        included) must fit max_num_tokens. Only a chunked last chunk's drafts can break it."""
        ops, G = self.ops, self.G
        if (isinstance(self.o.draft_len, int) and self.o.draft_len == 0) or not self.k.chunked_prefill:
            return   # constant folding: the budget checks every other cost before committing it
        total = ops.sum(self.plan.rec.tokens)
        with G.when(ops.and_(ops.not_(self.plan.error), total > self.k.max_num_tokens)):
            self.plan.raise_error(G, "crash")

    # -- S `_detect_deadlock` ------------------------------------------------------------
    def detect_deadlock(self) -> None:
        ops, G, x = self.ops, self.G, self.x
        progress = ops.or_(*self.gen_s, *self.ctx_s, *self.evicted, *self.paused)
        # rule 2: GENERATION_TO_COMPLETE requests are not counted
        gens = ops.count(ops.and_(self.in_list[i], x.req[i]["phase"] == DECODING, ops.not_(self.to_complete(i)))
                         for i in range(self.n))
        ctxs = ops.count(ops.and_(self.pending[i], ops.not_(self.preempted_ids[i])) for i in range(self.n))
        idle = ops.or_(progress, ops.and_(gens == 0, ctxs == 0))
        G.set(x.g, "stalls", ops.ite(idle, 0, x.g["stalls"] + 1))
        with G.when(x.g["stalls"] >= self.o.stall_limit):
            self.plan.raise_error(G, "deadlock")


def has_host_tier(k: Knobs) -> bool:
    """False only where host_blocks is the number 0; a term may be positive (then `can_evict`,
    M `can_evict = len(cache_tiers) > 1`, is the term host_blocks > 0)."""
    return not (isinstance(k.host_blocks, int) and k.host_blocks == 0)


# The actions of a context attempt (S `_Act`), as ints so they can be terms.
SCHED, SKIP, STOP = 0, 1, 2
