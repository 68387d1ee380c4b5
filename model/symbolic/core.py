"""A policy core: one engine's scheduler step written once over `ops` and request slots.

`Core.step` mirrors `model.policy.Policy.step` (arrive -> cancel -> schedule -> execute, or
fail every request on an engine error); a core overrides `schedule` and the hooks its engine
changes, exactly where the engine-checked policy in model/policies/ overrides them. The
engine-checked policy stays the oracle: tests/symbolic/ run both on thousands of random
workloads and compare every field of every state (`abstract` maps a simulator State onto slots).

Acceleration: `decode_guard(s, k)` says that the next k steps are identical pure-decode steps
(no arrival, cancellation, stop, completion, admission, preemption, only the same decoders
advancing one token each), and `decode_advance(s, k)` is the state k steps later in closed form.
`checkers/accel.py` proves `guard(s, k) => step^k(s) == advance(s, k)` by induction on k.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from ..config import EngineConfig
from ..state import State
from .ops import Guarded
from .slots import (CANCELLED, DECODING, ERROR_KINDS, FAILED, FINISHED, PENDING, PREEMPTED, PREFILLING,
                    REJECTED, WAITING, Knobs, Params, SlotRecord, SlotState, select, select_record, unfinished)

REQ_FIELDS: dict[str, type] = {"phase": int, "computed": int, "generated": int, "blocks": int,
                               "host_blocks": int, "suspended": bool, "preemptions": int}
GLOBAL_FIELDS: dict[str, type] = {"step": int, "free_blocks": int, "free_host_blocks": int,
                                  "error": bool}


class Plan:
    """The schedule being built in one step (terms): tokens and flags per slot, the charge,
    and whether the engine raises."""

    def __init__(self, n: int):
        self.rec = SlotRecord.empty(n)
        self.own: list = [0] * n      # tokens of each slot's own context (drafts excluded)
        self.error: Any = False
        self.error_kind: Any = 0
        # the other requests as one request's step sees them (checkers/parametric/local.py), or None
        self.env: Any = None

    def schedule(self, G: Guarded, i: int, tokens, draft=0, charge=None) -> None:
        ops = G.ops
        rec = self.rec
        rec.tokens[i] = ops.ite(G.guard, tokens + draft, rec.tokens[i])
        self.own[i] = ops.ite(G.guard, tokens, self.own[i])
        rec.flags["scheduled"][i] = ops.or_(rec.flags["scheduled"][i], G.guard)
        add = tokens + draft if charge is None else charge
        rec.charged = ops.ite(G.guard, rec.charged + add, rec.charged)

    def flag(self, G: Guarded, name: str, i: int) -> None:
        self.rec.flags[name][i] = G.ops.or_(self.rec.flags[name][i], G.guard)

    def unflag(self, G: Guarded, name: str, i: int) -> None:
        self.rec.flags[name][i] = G.ops.and_(self.rec.flags[name][i], G.ops.not_(G.guard))

    # -- what one request's step reads of the others (checkers/parametric/local_sglang.py, local_hf.py):
    # each returns its input, or does nothing, unless an environment records or supplies the value
    def seen(self, name: str, value, i=None):
        """A value of the other requests that slot i (None: the pass) reads."""
        return value if self.env is None else self.env.seen(name, value, i)

    def at_turn(self, loop: str, pos: int, **running) -> tuple:
        """The running values of `loop`'s turn at position pos, in the order given (one request: its
        own turn's)."""
        if self.env is None:
            return tuple(running.values())
        return tuple(self.env.turn(f"{loop}.{var}", pos, value) for var, value in running.items())

    def decided(self, name: str, value):
        """A decision of the whole pass, which one request makes from its own values and its reads."""
        return value if self.env is None else self.env.decided(name, value)

    def note(self, name: str, value, i) -> None:
        """Slot i's own value `name`, for an environment that picks requests out by it."""
        if self.env is not None:
            self.env.note(name, value, i)

    def raise_error(self, G: Guarded, kind: str) -> None:
        ops = G.ops
        self.error = ops.or_(self.error, G.guard)
        self.error_kind = ops.ite(G.guard, ERROR_KINDS[kind], self.error_kind)


class Core:
    policy: ClassVar[str]                       # the engine-checked policy this core re-expresses
    extra_req_fields: ClassVar[dict[str, type]] = {}
    # The phases this engine's requests can be in (an invariant; OFFLOADED is HF's CPU swap only).
    phases: ClassVar[tuple[int, ...]] = tuple(range(PENDING, CANCELLED + 1))
    extra_global_fields: ClassVar[dict[str, type]] = {}

    # -- what the core covers ----------------------------------------------------------
    def unsupported(self, cfg: EngineConfig, params: Optional[Params] = None) -> Optional[tuple[str, str]]:
        """(field, reason) when the configuration uses something this core does not express."""
        return None

    def req_fields(self) -> dict[str, type]:
        return {**REQ_FIELDS, **self.extra_req_fields}

    def global_fields(self) -> dict[str, type]:
        return {**GLOBAL_FIELDS, **self.extra_global_fields}

    # -- states ------------------------------------------------------------------------
    def initial(self, ops, k: Knobs, p: Params) -> SlotState:
        req = [dict(phase=PENDING, computed=0, generated=0, blocks=0, host_blocks=0, suspended=False,
                    preemptions=0, **self.initial_req_extra(ops, k, p, i)) for i in range(len(p.slots))]
        g = dict(step=0, free_blocks=k.num_blocks, free_host_blocks=k.host_blocks, error=False,
                 **self.initial_global_extra(ops, k, p))
        return SlotState(req, g)

    def initial_req_extra(self, ops, k: Knobs, p: Params, i: int) -> dict:
        return {}

    def initial_global_extra(self, ops, k: Knobs, p: Params) -> dict:
        return {}

    def abstract(self, cfg: EngineConfig, state: State, n: int) -> SlotState:
        """A simulator state as a concrete slot state (slots past the workload are absent)."""
        req = []
        for r in state.requests:
            req.append(dict(phase=int(r.phase), computed=r.computed, generated=r.generated, blocks=r.blocks,
                            host_blocks=r.host_blocks, suspended=r.suspended, preemptions=r.preemptions,
                            **self.abstract_req_extra(cfg, state, r.rid)))
        for i in range(len(req), n):
            req.append(dict(phase=PENDING, computed=0, generated=0, blocks=0, host_blocks=0, suspended=False,
                            preemptions=0, **self.absent_req_extra(i)))
        g = dict(step=state.step, free_blocks=state.free_blocks, free_host_blocks=state.free_host_blocks,
                 error=state.error is not None, **self.abstract_global_extra(cfg, state))
        return SlotState(req, g)

    def abstract_req_extra(self, cfg: EngineConfig, state: State, rid: int) -> dict:
        return {}

    def absent_req_extra(self, i: int) -> dict:
        return {}

    def abstract_global_extra(self, cfg: EngineConfig, state: State) -> dict:
        return {}

    # -- the step: model.policy.Policy.step ---------------------------------------------
    def step(self, ops, k: Knobs, p: Params, s: SlotState, env: Any = None) -> tuple[SlotState, SlotRecord]:
        """One engine step. `env` (checkers/parametric/local.py; cores that support it read
        `plan.env`): the step of one request among any number, the others' share of what it reads
        given by `env` rather than computed."""
        G = Guarded(ops)
        x = s.copy()
        plan = Plan(len(s))
        plan.env = env
        step = s.g["step"]
        # Workload.env_at: the stops are decided on the state before the step.
        stops = [ops.and_(w["output_len"] > 0, s.req[i]["generated"] + 1 >= w["output_len"])
                 for i, w in enumerate(p.slots)]
        for i, w in enumerate(p.slots):
            with G.when(ops.and_(w["present"], x.req[i]["phase"] == PENDING, w["arrival"] == step)):
                self.arrive(G, k, p, x, plan, i)
        for i, w in enumerate(p.slots):
            with G.when(ops.and_(w["present"], w["cancel_at"] == step, unfinished(ops, x.req[i]["phase"]))):
                self.cancel(G, k, p, x, i)
        self.schedule(G, k, p, x, plan)
        # an error raised for any request fails every request: one request's step reads it of the others
        plan.error = plan.seen("step.error", plan.error)
        with G.when(plan.error):
            self.fail_all(G, k, p, x, plan)
        with G.when(ops.not_(plan.error)):
            self.execute(G, k, p, x, plan, stops)
        plan.rec.error = plan.error
        plan.rec.error_kind = ops.ite(plan.error, plan.error_kind, 0)
        dead = s.g["error"]
        # A dead engine does nothing (Policy.step returns the state unchanged).
        return select(ops, dead, s, x), select_record(ops, dead, SlotRecord.empty(len(s)), plan.rec)

    def arrive(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, i: int) -> None:
        """Policy.arrive: admit, or reject with the engine's validation (`refuse`)."""
        ops = G.ops
        refused = self.refuse(ops, k, p, x, i)
        with G.when(refused):
            G.set(x.req[i], "phase", REJECTED)
            plan.flag(G, "rejected", i)
        with G.when(ops.not_(refused)):
            G.set(x.req[i], "phase", WAITING)

    def refuse(self, ops, k: Knobs, p: Params, x: SlotState, i: int):
        return False

    def cancel(self, G: Guarded, k: Knobs, p: Params, x: SlotState, i: int) -> None:
        self.release(G, k, p, x, i)
        G.set(x.req[i], "phase", CANCELLED)

    def schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        raise NotImplementedError

    def execute(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, stops: list) -> None:
        """Policy.execute: scheduled contexts advance (the last context token samples one), decoders
        sample one token; drafts are all rejected; a finishing request is released."""
        ops = G.ops
        for i in range(len(x)):
            with G.when(plan.rec.flags["scheduled"][i]):
                sampled = self.forward(G, p, x, plan, i, sample=True)
                with G.when(ops.and_(sampled, self.finishes(ops, k, p, x, i, stops[i]))):
                    self.finish(G, k, p, x, i)
                    plan.flag(G, "finished", i)
        self.after_step(G, k, p, x, plan)

    def forward(self, G: Guarded, p: Params, x: SlotState, plan: Plan, i: int, sample: bool):
        """Scheduled slot i's forward pass (under the caller's guard): a decoder's KV grows by one, a context's
        cursor moves by its chunk and a last chunk turns it DECODING; with `sample` the row that reaches its last
        token appends the sampled one (the overlap loop's launch does not: its token lands a step later,
        model/symbolic/overlap.py). Returns whether the row samples a token (decoding, or its context completes)."""
        ops = G.ops
        r = x.req[i]
        decoding = r["phase"] == DECODING
        computed = r["computed"] + plan.own[i]
        context_len = p.slots[i]["prompt"] + r["generated"]
        completes = ops.and_(ops.not_(decoding), computed >= context_len)
        with G.when(decoding):
            G.set(r, "computed", r["computed"] + 1)
            if sample:
                G.set(r, "generated", r["generated"] + 1)
        with G.when(completes):
            G.set(r, "computed", context_len)
            if sample:
                G.set(r, "generated", r["generated"] + 1)
            G.set(r, "phase", DECODING)
        with G.when(ops.and_(ops.not_(decoding), ops.not_(completes))):
            G.set(r, "computed", computed)
            G.set(r, "phase", PREFILLING)
        return ops.or_(decoding, completes)

    def finishes(self, ops, k: Knobs, p: Params, x: SlotState, i: int, stop):
        return ops.or_(stop, x.req[i]["generated"] >= p.slots[i]["max_new"])

    def finish(self, G: Guarded, k: Knobs, p: Params, x: SlotState, i: int) -> None:
        self.release(G, k, p, x, i)
        G.set(x.req[i], "phase", FINISHED)

    def after_step(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        G.set(x.g, "step", x.g["step"] + 1)

    def release(self, G: Guarded, k: Knobs, p: Params, x: SlotState, i: int) -> None:
        r = x.req[i]
        G.set(x.g, "free_blocks", x.g["free_blocks"] + r["blocks"])
        G.set(x.g, "free_host_blocks", x.g["free_host_blocks"] + r["host_blocks"])
        G.set(r, "blocks", 0)
        G.set(r, "host_blocks", 0)
        G.set(r, "suspended", False)

    def fail_all(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """Policy.fail_all: every live request failed and released, the engine dead, the step counted."""
        self.fail_requests(G, k, p, x, plan)
        G.set(x.g, "step", x.g["step"] + 1)

    def fail_requests(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """`fail_all` but the step (a loop that has counted it already: vLLM's batch queue after a crash while
        processing a batch)."""
        ops = G.ops
        for i in range(len(x)):
            with G.when(ops.and_(p.slots[i]["present"], x.req[i]["phase"] < FINISHED)):
                self.release(G, k, p, x, i)
                G.set(x.req[i], "phase", FAILED)
                plan.flag(G, "failed", i)
        G.set(x.g, "error", True)

    # -- invariants -----------------------------------------------------------------------
    def invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        """Named conditions every reachable state satisfies, proved by induction over `step` (and
        `decode_advance`) in checkers/induction.py. The BMC assumes them at every depth, and
        the safety properties they imply need no unrolling. Cores add their own
        (`core_invariants`)."""
        inv: dict = {}
        conserve = []
        host = []
        for i, (w, r) in enumerate(zip(p.slots, s.req)):
            ph = r["phase"]
            pending = ph == PENDING
            conserve.append(r["blocks"])
            host.append(r["host_blocks"])
            inv[f"r{i}.absent-is-pending"] = ops.implies(ops.not_(w["present"]), ops.and_(
                pending, r["blocks"] == 0, r["host_blocks"] == 0, r["generated"] == 0, r["computed"] == 0))
            # arrivals are processed by the step numbered `arrival`; a dead engine failed the rest
            inv[f"r{i}.pending-until-arrival"] = ops.implies(w["present"], pending == ops.and_(
                ops.not_(s.g["error"]), s.g["step"] <= w["arrival"]))
            inv[f"r{i}.fields"] = ops.and_(ops.or_(*[ph == q for q in self.phases]), r["blocks"] >= 0, r["host_blocks"] >= 0,
                                           r["computed"] >= 0, r["generated"] >= 0, r["preemptions"] >= 0,
                                           r["generated"] <= self.max_generated(ops, k, p, s, i))
            inv[f"r{i}.live-owes-tokens"] = self.owes_tokens(ops, k, p, s, i)
            inv[f"r{i}.pending-holds-nothing"] = ops.implies(pending, ops.and_(
                r["blocks"] == 0, r["host_blocks"] == 0, r["generated"] == 0, r["computed"] == 0,
                ops.not_(r["suspended"]), r["preemptions"] == 0))
            inv[f"r{i}.done-holds-nothing"] = ops.implies(ph >= FINISHED, ops.and_(r["blocks"] == 0,
                                                                                   r["host_blocks"] == 0))
            inv[f"r{i}.decode-cursor"] = self.decode_cursor(ops, k, p, s, i)
            inv[f"r{i}.context-cursor"] = ops.implies(ops.or_(ph == WAITING, ph == PREFILLING, ph == PREEMPTED),
                                                      r["computed"] < w["prompt"] + r["generated"])
        inv["dead-engine-answered"] = ops.implies(s.g["error"], ops.and_(*[
            ops.implies(w["present"], r["phase"] >= FINISHED) for w, r in zip(p.slots, s.req)]))
        cached = self.cached_blocks(ops, k, p, s)
        inv["blocks-conserved"] = ops.and_(s.g["free_blocks"] >= 0,
                                           s.g["free_blocks"] + ops.sum(conserve) + cached == k.num_blocks)
        inv["host-blocks-conserved"] = ops.and_(s.g["free_host_blocks"] >= 0,
                                                s.g["free_host_blocks"] + ops.sum(host) == k.host_blocks)
        inv.update(self.core_invariants(ops, k, p, s))
        return inv

    def max_generated(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """The most tokens slot i ever has generated (part of `fields`): max_new, unless the core's loop lets a
        request take a token past it (model/symbolic/overlap.py, trtllm_v1)."""
        return p.slots[i]["max_new"]

    def owes_tokens(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """`live-owes-tokens` for slot i: a live request has neither reached max_new nor its early stop."""
        w, r = p.slots[i], s.req[i]
        live = ops.and_(r["phase"] >= WAITING, r["phase"] < FINISHED)
        return ops.implies(live, ops.and_(
            r["generated"] < w["max_new"], ops.or_(w["output_len"] <= 0, r["generated"] < w["output_len"])))

    def decode_cursor(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """`decode-cursor` for slot i: a decoder has sampled a token and its KV holds every token but the last
        sampled one. A core whose loop keeps a launched batch's tokens in flight says where that differs
        (model/symbolic/overlap.py)."""
        w, r = p.slots[i], s.req[i]
        return ops.implies(r["phase"] == DECODING, ops.and_(
            r["generated"] >= 1, r["computed"] == w["prompt"] + r["generated"] - 1))

    def core_invariants(self, ops, k: Knobs, p: Params, s: SlotState) -> dict:
        return {}

    def cached_blocks(self, ops, k: Knobs, p: Params, s: SlotState):
        """GPU blocks held by a prefix cache rather than by a request (SAFE-BLOCKS counts them)."""
        return 0

    def shared_blocks(self, ops, k: Knobs, p: Params, s: SlotState, i: int):
        """Prefix-cache blocks slot i references (`Request.shared_blocks`; SAFE-NO-LEAK: none once done)."""
        return 0

    def cache_refs(self, ops, k: Knobs, p: Params, s: SlotState):
        """Live references the prefix cache counts (`PrefixEntry.refs` summed; SAFE-NO-LEAK: none
        once every request is done)."""
        return 0

    # -- acceleration (cores opt in) ----------------------------------------------------
    accelerates: ClassVar[bool] = False

    def accelerates_in(self, k: Knobs) -> bool:
        """Whether decode runs are accelerated for a design with these knobs (a core may express a loop where it
        does not accelerate: the TensorRT-LLM cores' overlap executor, model/symbolic/overlap.py). Where not, no
        acceleration is proved or unrolled: every transition is one engine step."""
        return self.accelerates

    def decode_guard(self, ops, k: Knobs, p: Params, s: SlotState, n):
        raise NotImplementedError

    def decode_advance(self, ops, k: Knobs, p: Params, s: SlotState, n) -> SlotState:
        raise NotImplementedError


CORES: dict[str, Core] = {}


def register(cls: type) -> type:
    CORES[cls.policy] = cls()
    return cls
