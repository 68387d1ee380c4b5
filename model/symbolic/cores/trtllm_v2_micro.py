"""The trtllm_v2 step as micro-steps over arrays indexed by queue position, for any number n of requests;
and, on Python lists for a concrete n, the trtllm_v2 core's own step for the designs they cover
(`core_step`, which `TrtllmV2Core.step` runs): one definition for the slots and for the proofs.

The core's pass (model/symbolic/cores/trtllm_v2.py `_Pass`, which stays for chunked prefill and a host
tier) is a Python loop over slots, so n is fixed before Z3 sees it. Here every request field is an
array (a Z3 array over the integers with n a term, or a list), and the step is cut into micro-steps
that each read and write O(1) indices (a loop body at a cursor c, or an inner loop body at (c, j))
plus scalars. What the pass needs of all requests at once is kept in scalar ghosts, updated by every
write of one index:

- `S_blocks` = sum of `blocks` (the pool: `free_blocks + S_blocks = num_blocks`);
- `S_B` = the sum fix B checks before admitting (`_Pass.admissible_worst_case`: for each counted
  request, its worst case if it can outgrow its replay, else its pages; the sum over the others is
  `S_B - b(i)`);
- `S_R` = the reservation proper: the worst cases of the counted requests fix B reserves (S_B less
  the pages of the others: C3, where both kinds run, needs the two apart);
- `S_chg` = how many requests the pass has changed in phase or suspension since the arrivals (a
  pass scalar: the snapshot it compares with is taken after the arrivals, `snap`);
- `sched_any` / `prog_any`: some request was scheduled / the pass made progress (`detect_deadlock`'s
  `progress`); the flag arrays behind them are only ever set within a pass, never cleared.

A ghost is a sum (or an or) over indices 0..n-1: `put`, the one writer of an index, changes it by exactly
what that index changes (S' = S - f(old[k]) + f(new[k])), and the core's step starts each ghost at its sum.
checkers/parametric/refinement.py `tied` checks that `TrtllmV2Core.step` is, term for term, one pass of
these micro-steps, run in the order the proofs for every n take them (obligations.py `chain`); and
`refinement`, for n = 1..3, that a pass over Z3 arrays equals one over lists, ghosts included.

Covered: the options of class C1 and of the designs refuted inside it: chunked prefill off, no host
tier (`host_blocks` the number 0), any draft length, recompute pause on/off, fixes A and B on/off,
any resume gate and stall limit. Refused otherwise (`unsupported`).

The micro-steps, in program order (each cites the core method whose loop body it is):
  start                       reset the pass scratch (`_Pass.__init__`), `dead` = the engine's error
  arrive(c)        c < n      `Core.step`'s arrival and cancellation of slot c (they touch c only)
  snap                        no code: the snapshot `S_chg` compares with
  gen_a(c)         c < n      `generation_phase` at c, through `allocate_generation`; when that
                              succeeds or cannot run, the whole body (schedule, commit, `going`)
  evict(c, j)      j = n-1..c+1   `evict_for_generation`'s loop body (no retries without a host tier)
  rpause(c, j)     j = n-1..c+1   `recompute_pause_for_generation`'s loop body
  gen_b(c)                    the rest of the body after those loops (self-suspension, schedule)
  ctx_a(c)         c < n      `context_phase` at c through `try_context_full`'s resize; the whole
                              body when `preempt_for_pages` is not reached
  pfp(c, j)        j = n-1..0, j != c   `preempt_for_pages`' loop body
  ctx_b(c)                    the rest of the body after it
  det(c)           c < n      `detect_deadlock`'s two counts, as "some"
  det_end                     `detect_deadlock`: stalls, the engine's error
  fail(c), fail_end           `Core.fail_all` (under the plan's error)
  exec_(c), exec_end          `Core.execute` at c and `after_step` (without the error)
  finish_step                 `Core.step`'s last line: a dead engine returns the pre-state
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any, Optional

import z3

from ..ops import Guarded, num
from ..slots import (CANCELLED, DECODING, ERROR_KINDS, FAILED, FINISHED, PENDING, PREEMPTED,
                                  PREFILLING, WAITING, Knobs, Params, SlotRecord, SlotState, started, unfinished)

REQ = {"phase": int, "computed": int, "generated": int, "blocks": int, "host_blocks": int,
       "preemptions": int, "suspended": bool}
PARAMS = {"present": bool, "prompt": int, "max_new": int, "arrival": int, "output_len": int, "cancel_at": int}
# pass scratch (`_Pass`) and the step record (`Plan` / `SlotRecord`), per index
SCRATCH = {"in_list": bool, "victims": bool, "evicted": bool, "paused": bool, "gen_s": bool, "ctx_s": bool,
           "pending": bool, "preempted_ids": bool, "own": int,
           "tokens": int, "scheduled": bool, "preempted": bool, "offloaded": bool, "finished": bool,
           "failed": bool, "rejected": bool,
           # each request's phase and suspension at the start of the pass (sp0, ss0) and once the
           # arrivals are done (sp, ss): what `S_chg` compares with (the progress argument of C2 and C3)
           "sp0": int, "ss0": bool, "sp": int, "ss": bool}
RECORD_FLAGS = ("scheduled", "preempted", "offloaded", "finished", "failed", "rejected")
STATE_GLOBALS = {"step": int, "free_blocks": int, "free_host_blocks": int, "error": bool, "stalls": int}
GHOSTS = {"S_blocks": int, "S_B": int, "S_R": int}
# pass scalars: `_Pass` fields, the generation and context loops' `going`, the plan's error and charge,
# the pieces of one loop body that its inner loops read, the progress ghosts, the dead flag
PASS = {"budget_tokens": int, "budget_requests": int, "end": int, "frontier": int, "going": bool,
        "cgoing": bool, "perr": bool, "perr_kind": int, "charged": int, "sched_any": bool, "prog_any": bool,
        "det_gens": bool, "det_ctxs": bool, "dead": bool,
        "ev_active": bool, "rp_active": bool, "rp_done": bool,
        "pfp_active": bool, "pfp_done": bool, "cx_guard": bool, "cx_first": bool, "cx_remaining": int,
        "cx_act": int, "S_chg": int}
SCHED, SKIP, STOP = 0, 1, 2      # S `_Act`, as in the core


def sort_of(t: type):
    return z3.BoolSort() if t is bool else z3.IntSort()


def const(v: Any, t: type):
    if z3.is_expr(v):
        return v
    return z3.BoolVal(bool(v)) if t is bool else num(int(v))


FIELD_TYPES = {**REQ, **PARAMS, **SCRATCH}


@dataclasses.dataclass
class ArrayState:
    """Arrays (name -> Z3 array over Int, or a Python list of values for a concrete n: the core's own
    slots, `TrtllmV2Core.step`) and scalars (name -> term or value); n is an Int term or an int."""
    a: dict
    g: dict
    n: Any

    def copy(self) -> "ArrayState":
        return ArrayState(dict(self.a), dict(self.g), self.n)

    def cell(self, i) -> dict:
        # a list's element, or a Z3 array's select (ArrayRef's [] is z3.Select, the same term)
        return {f: arr[i] for f, arr in self.a.items()}


def fresh(tag: str, n=None, with_pass: bool = True) -> ArrayState:
    """A symbolic state: every array and scalar a fresh constant (n too unless given)."""
    a = {f: z3.Array(f"{tag}.{f}", z3.IntSort(), sort_of(t)) for f, t in FIELD_TYPES.items()}
    scal = {**STATE_GLOBALS, **GHOSTS, **(PASS if with_pass else {})}
    g = {f: (z3.Bool if t is bool else z3.Int)(f"{tag}.{f}") for f, t in scal.items()}
    return ArrayState(a, g, z3.Int(f"{tag}.n") if n is None else n)


# -- the ghost sums: each a function of one index's fields (and the knobs) ------------------------
def worst_pages(ops, k: Knobs, w: dict):
    return k.blocks_for(ops, w["prompt"] + w["max_new"] + k.options.draft_len)


def outgrows(k: Knobs, w: dict):
    return w["prompt"] + w["max_new"] + k.options.draft_len > k.max_num_tokens


def reserved(k: Knobs, w: dict):
    """Whose worst case fix B counts (`_Pass.reserved`): every request with B*."""
    return True if k.options.reserve_every_worst_case else outgrows(k, w)


def counted(ops, r: dict):
    """Whom fix B's sum counts: admitted and unfinished (`_Pass.admissible_worst_case`)."""
    return ops.and_(r["present"], unfinished(ops, r["phase"]),
                    ops.not_(ops.and_(r["blocks"] == 0, ops.not_(started(ops, r["phase"])))))


def b_part(ops, k: Knobs, r: dict):
    """What fix B counts for one request (`_Pass.admissible_worst_case`, the summand for j)."""
    return ops.ite(counted(ops, r), ops.ite(reserved(k, r), worst_pages(ops, k, r), r["blocks"]), 0)


def r_part(ops, k: Knobs, r: dict):
    """Its part of the reservation proper (proofs/claims.py `reservation`): the worst case of a
    counted request fix B reserves, else nothing."""
    return ops.ite(ops.and_(counted(ops, r), reserved(k, r)), worst_pages(ops, k, r), 0)


def changed(ops, r: dict):
    """Whether the pass has changed this request's phase or suspension since the arrivals."""
    return ops.or_(r["phase"] != r["sp"], r["suspended"] != r["ss"])


SUM_INPUTS = {"S_blocks": ("blocks",), "S_B": ("present", "phase", "blocks"), "S_R": ("present", "phase", "blocks"),
              "S_chg": ("phase", "suspended", "sp", "ss")}   # the fields each reads


def sums(ops, k: Knobs) -> dict:
    return {"S_blocks": lambda r: r["blocks"], "S_B": lambda r: b_part(ops, k, r), "S_R": lambda r: r_part(ops, k, r),
            "S_chg": lambda r: ops.ite(changed(ops, r), 1, 0)}


def resume_gate(k: Knobs) -> tuple[int, int]:
    """max_util_for_resume as a fraction (numerator, denominator)."""
    util = Fraction(k.options.max_util_for_resume).limit_denominator(10 ** 6)
    return util.numerator, util.denominator


def gate_allows(k: Knobs, st: "ArrayState", util: tuple[int, int]):
    """`utilisation_allows_resume`: the pages in use within the gate's fraction of the pool."""
    num, den = util
    return (k.num_blocks - st.g["free_blocks"]) * den <= num * k.num_blocks


class V2ArrayModel:
    """The micro-steps for one structure (`Knobs` with numeric knobs as terms, options concrete).

    `mutant` plants a known fault for the negative controls: "ghost-no-release" keeps `S_blocks`
    from ever going down (a ghost not decremented when pages are released); "chg-phase-only" keeps
    `S_chg` blind to suspensions (a progress measure that misses a change)."""

    def __init__(self, ops, k: Knobs, mutant: Optional[str] = None, fold: bool = False, lists: bool = False):
        self.ops, self.k, self.o, self.mutant, self.fold = ops, k, k.options, mutant, fold
        # `lists`: the state's arrays are Python lists (a concrete n: the core's own step) and its constants
        # Python values, which `ops` folds; else Z3 arrays and constants (the proofs for every n)
        self.lists = lists
        why = unsupported(k)
        if why:
            raise ValueError(why)
        self.util = resume_gate(k)
        self.sums = sums(ops, k)
        if mutant == "chg-phase-only":   # a change count blind to suspensions
            self.sums["S_chg"] = lambda r: ops.ite(r["phase"] != r["sp"], 1, 0)

    # -- writing one index --------------------------------------------------------------
    def put(self, st: ArrayState, i, old: dict, new: dict) -> None:
        """Store index i's new fields and move every ghost sum by what index i changed."""
        # each field compared once (the sums' inputs are fields of the cell), in the cell's order
        # (`is` first: a field the body left alone is its old object)
        changed = [f for f, v in new.items() if f in old and v is not old[f] and not _same(v, old[f])]
        for f in changed:
            if f in st.a:
                v = new[f]
                if isinstance(st.a[f], list):
                    st.a[f] = list(st.a[f])   # a copy: an earlier state may share the list
                    st.a[f][i] = v
                else:
                    st.a[f] = z3.Store(st.a[f], i, const(v, FIELD_TYPES[f]))
        moved = set(changed)
        for name, fn in self.sums.items():
            if moved.isdisjoint(SUM_INPUTS[name]):
                continue
            before, after = fn(old), fn(new)
            delta = after - before
            if self.mutant == "ghost-no-release" and name == "S_blocks":
                delta = self.ops.max(delta, 0)
            st.g[name] = st.g[name] + delta

    def _body(self, st: ArrayState, idx: tuple, body) -> ArrayState:
        """Run `body(G, st, cells)` over the cells of the given (distinct) indices, then write them back."""
        st = st.copy()
        G = Guarded(self.ops)
        olds = [st.cell(i) for i in idx]
        cells = [dict(c) for c in olds]
        body(G, st, *cells)
        for i, old, new in zip(idx, olds, cells):
            self.put(st, i, old, new)
        return st

    # -- helpers of `_Pass` over one or two cells ------------------------------------------
    def requests_full(self, st):
        return st.g["budget_requests"] >= self.k.max_batch_size

    def can_fit(self, st, tokens):
        return st.g["budget_tokens"] + tokens <= self.k.max_num_tokens

    def commit(self, G, st, tokens) -> None:
        G.set(st.g, "budget_tokens", st.g["budget_tokens"] + tokens)
        G.set(st.g, "budget_requests", st.g["budget_requests"] + 1)

    def schedule(self, G, st, r, tokens, draft) -> None:
        """`Plan.schedule` at one index, and the ghosts it feeds."""
        G.set(r, "tokens", tokens + draft)
        G.set(r, "own", tokens)
        G.set(r, "scheduled", True)
        G.set(st.g, "charged", st.g["charged"] + tokens + draft)
        G.set(st.g, "sched_any", True)

    def setflag(self, G, st, r, name: str) -> None:
        """A `_Pass` flag list set at one index; the progress ghost follows the four flags
        `detect_deadlock` ors together."""
        G.set(r, name, True)
        if name in ("gen_s", "ctx_s", "evicted", "paused"):
            G.set(st.g, "prog_any", True)

    def utilisation_allows_resume(self, st):
        return gate_allows(self.k, st, self.util)

    def resume(self, G, st, r):
        ok = self.utilisation_allows_resume(st)
        with G.when(ok):
            G.set(r, "suspended", False)
        return ok

    def grow(self, G, st, r, need):
        ops = self.ops
        ok = ops.or_(need <= 0, need <= st.g["free_blocks"])
        with G.when(ops.and_(need > 0, ok)):
            G.set(st.g, "free_blocks", st.g["free_blocks"] - need)
            G.set(r, "blocks", r["blocks"] + need)
        return ok

    def allocate_generation(self, G, st, r):
        ops = self.ops
        suspended = r["suspended"]
        resumed = True
        with G.when(suspended):
            resumed = self.resume(G, st, r)
        ok = False
        with G.when(ops.or_(ops.not_(suspended), resumed)):
            need = self.k.blocks_for(ops, r["computed"] + 1 + self.o.draft_len) - r["blocks"]
            ok = ops.ite(G.guard, self.grow(G, st, r, need), ok)
        return ok

    def suspend(self, G, st, r) -> None:
        G.set(r, "suspended", True)
        self.setflag(G, st, r, "evicted")
        G.set(r, "offloaded", True)

    def pass_release(self, G, st, r) -> None:
        """`_Pass.release` without a host tier."""
        G.set(st.g, "free_blocks", st.g["free_blocks"] + r["blocks"])
        G.set(r, "computed", self.ops.ite(r["phase"] == DECODING, r["computed"], 0))
        G.set(r, "blocks", 0)
        G.set(r, "suspended", False)

    def core_release(self, G, st, r) -> None:
        """`Core.release`."""
        G.set(st.g, "free_blocks", st.g["free_blocks"] + r["blocks"])
        G.set(st.g, "free_host_blocks", st.g["free_host_blocks"] + r["host_blocks"])
        G.set(r, "blocks", 0)
        G.set(r, "host_blocks", 0)
        G.set(r, "suspended", False)

    def recompute_pause(self, G, st, r) -> None:
        self.pass_release(G, st, r)
        G.set(r, "phase", PREEMPTED)
        G.set(r, "computed", 0)
        G.set(r, "preemptions", r["preemptions"] + 1)
        self.setflag(G, st, r, "paused")
        G.set(r, "preempted", True)

    def rp_candidate(self, r):
        ok = started(self.ops, r["phase"])
        if self.o.fix_replay_fit:
            ok = self.ops.and_(ok, r["prompt"] + r["generated"] + self.o.draft_len <= self.k.max_num_tokens)
        return ok

    def remaining_context(self, r):
        return self.ops.ite(r["phase"] == DECODING, 0, r["prompt"] + r["generated"] - r["computed"])

    # -- constants, as the state holds them ------------------------------------------------------
    def value(self, v):
        """A constant scalar: the Python value on lists (ops folds it), a Z3 constant on arrays."""
        return v if self.lists else const(v, type(v))

    def filled(self, st: ArrayState, v, t: type):
        """An array holding v at every index."""
        return [v] * st.n if self.lists else z3.K(z3.IntSort(), const(v, t))

    # -- the micro-steps -----------------------------------------------------------------
    def start(self, st: ArrayState) -> ArrayState:
        st = st.copy()
        for f, t in SCRATCH.items():
            st.a[f] = self.filled(st, False if t is bool else 0, t)
        v = self.value
        st.g.update(budget_tokens=v(0), budget_requests=v(0), end=st.n, frontier=st.n, going=v(True),
                    cgoing=v(True), perr=v(False), perr_kind=v(0), charged=v(0), sched_any=v(False),
                    prog_any=v(False), det_gens=v(False), det_ctxs=v(False), dead=st.g["error"],
                    ev_active=v(False), rp_active=v(False), rp_done=v(False), pfp_active=v(False),
                    pfp_done=v(False), cx_guard=v(False), cx_first=v(False), cx_remaining=v(0), cx_act=v(STOP))
        for f in ("sp0", "sp"):
            st.a[f] = st.a["phase"]
        for f in ("ss0", "ss"):
            st.a[f] = st.a["suspended"]
        st.g["S_chg"] = v(0)
        return st

    def snap(self, st: ArrayState) -> ArrayState:
        """The arrivals are done: `S_chg` counts the changes from here on (no code of the core)."""
        st = st.copy()
        st.a["sp"], st.a["ss"] = st.a["phase"], st.a["suspended"]
        st.g["S_chg"] = self.value(0)
        return st

    def arrive(self, st: ArrayState, c) -> ArrayState:
        """`Core.step`: `arrive` (no refusal in this core: `Core.refuse`), then `cancel`, at c."""
        ops = self.ops

        def body(G, st, r):
            step = st.g["step"]
            with G.when(ops.and_(r["present"], r["phase"] == PENDING, r["arrival"] == step)):
                G.set(r, "phase", WAITING)
            with G.when(ops.and_(r["present"], r["cancel_at"] == step, unfinished(ops, r["phase"]))):
                self.core_release(G, st, r)
                G.set(r, "phase", CANCELLED)
            r["in_list"] = ops.and_(r["present"], unfinished(ops, r["phase"]))   # `_Pass.__init__`
        return self._body(st, (c,), body)

    def gen_a(self, st: ArrayState, c) -> ArrayState:
        """`generation_phase` at c and `try_generation` through `allocate_generation`. When the
        allocation succeeds (or is not tried) the evict and pause loops do nothing and the body is
        finished here; otherwise `ev_active` / `rp_active` run them and `gen_b` finishes it."""
        ops = self.ops

        def body(G, st, r):
            visit = ops.and_(st.g["going"], r["in_list"], c < st.g["end"], ops.not_(r["victims"]))
            full = self.requests_full(st)
            act = ops.and_(visit, ops.not_(full), r["phase"] == DECODING)
            with G.when(visit):
                G.set(st.g, "going", ops.not_(full))
                with G.when(ops.and_(ops.not_(full), r["phase"] != DECODING)):
                    self.setflag(G, st, r, "pending")
            fits = self.can_fit(st, 1 + self.o.draft_len)
            got = False
            with G.when(ops.and_(act, fits)):
                got = ops.ite(G.guard, self.allocate_generation(G, st, r), False)
            done_here = ops.and_(act, ops.or_(ops.not_(fits), got))
            with G.when(done_here):
                G.set(st.g, "going", got)
                with G.when(got):
                    self.setflag(G, st, r, "gen_s")
                    self.schedule(G, st, r, 1, self.o.draft_len)
                    self.commit(G, st, 1 + self.o.draft_len)
            st.g["ev_active"] = ops.and_(act, fits, ops.not_(got))
            st.g["rp_active"] = ops.and_(st.g["ev_active"], self.o.enable_recompute_pause)
            st.g["rp_done"] = self.value(False)
        return self._body(st, (c,), body)

    def evict(self, st: ArrayState, c, j) -> ArrayState:
        """`evict_for_generation`'s body at j > c: without a host tier a suspension frees nothing,
        so every retry fails and the loop suspends each evictable later request, moving `end` to
        it (the scan goes down, so `end` read here equals the core's `self.end` for this j)."""
        ops = self.ops

        def body(G, st, r):
            ev = ops.and_(st.g["ev_active"], r["in_list"], j < st.g["end"], started(ops, r["phase"]),
                          r["blocks"] > 0, ops.not_(r["suspended"]))
            with G.when(ev):
                self.suspend(G, st, r)
                G.set(st.g, "end", j)
        return self._body(st, (j,), body)

    def rpause(self, st: ArrayState, c, j) -> ArrayState:
        """`recompute_pause_for_generation`'s body at j > c (victims newest first below the
        frontier, the allocation of c retried after each)."""
        ops = self.ops

        def body(G, st, rc, rj):
            eligible = ops.and_(st.g["rp_active"], ops.not_(st.g["rp_done"]), rj["in_list"], j < st.g["frontier"],
                                ops.not_(rj["victims"]), self.rp_candidate(rj), ops.not_(rj["evicted"]))
            with G.when(eligible):
                self.recompute_pause(G, st, rj)
                G.set(rj, "victims", True)
                G.set(st.g, "frontier", j)
                G.set(st.g, "rp_done", self.allocate_generation(G, st, rc))
        return self._body(st, (c, j), body)

    def gen_b(self, st: ArrayState, c) -> ArrayState:
        """The rest of the generation body when the allocation failed: self-suspension, or the
        schedule when a pause made room."""
        ops = self.ops

        def body(G, st, r):
            ok = ops.and_(st.g["rp_active"], st.g["rp_done"])
            with G.when(st.g["ev_active"]):
                with G.when(ops.and_(ops.not_(ok), r["blocks"] > 0, ops.not_(r["suspended"]))):
                    self.suspend(G, st, r)
                G.set(st.g, "going", ok)
                with G.when(ok):
                    self.setflag(G, st, r, "gen_s")
                    self.schedule(G, st, r, 1, self.o.draft_len)
                    self.commit(G, st, 1 + self.o.draft_len)
            st.g["ev_active"] = self.value(False)
            st.g["rp_active"] = self.value(False)
        return self._body(st, (c,), body)

    def admissible_worst_case(self, st, r):
        """Fix B with the sum over the other requests as `S_B - b(c)`."""
        ops, k = self.ops, self.k
        if not self.o.fix_worst_case_admission:
            return True
        held = st.g["S_B"] - b_part(ops, k, r)
        fits = held + worst_pages(ops, k, r) <= k.num_blocks
        return ops.or_(r["computed"] > 0, ops.not_(reserved(k, r)), fits)

    def ctx_a(self, st: ArrayState, c) -> ArrayState:
        """`context_phase` at c through `try_context_full`'s resize (`prepare_context`, the budget,
        fix B, `resize_context`). When the resize fails, `pfp_active` runs `preempt_for_pages`."""
        ops = self.ops
        d = self.o.draft_len

        def body(G, st, r):
            enter = ops.and_(st.g["cgoing"], r["pending"])
            full = self.requests_full(st)
            with G.when(enter):
                G.set(st.g, "cgoing", ops.not_(full))
            gv = ops.and_(enter, ops.not_(full), ops.not_(r["preempted_ids"]))
            first = r["computed"] == 0
            remaining = self.remaining_context(r)
            act = STOP
            pfp = False
            with G.when(gv):
                needs = ops.or_(r["blocks"] == 0, r["suspended"])
                resumed = True
                with G.when(needs):
                    resumed = self.resume(G, st, r)
                with G.when(ops.or_(ops.not_(needs), resumed)):
                    fits = ops.and_(self.can_fit(st, remaining + d), self.admissible_worst_case(st, r))
                    with G.when(fits):
                        grown = self.grow(G, st, r, self.k.blocks_for(ops, r["computed"] + remaining + d) - r["blocks"])
                        act = ops.ite(ops.and_(G.guard, grown), SCHED, act)
                        if self.o.enable_recompute_pause:
                            pfp = ops.and_(G.guard, ops.not_(grown))
                        else:
                            act = ops.ite(ops.and_(G.guard, ops.not_(grown)), SKIP, act)
            st.g.update(cx_guard=gv, cx_first=first, cx_remaining=remaining, cx_act=act,
                        pfp_active=pfp, pfp_done=False)
            # the rest of the body, unless preempt_for_pages has to run first
            with G.when(ops.and_(gv, ops.not_(pfp))):
                self._ctx_rest(G, st, r)
        return self._body(st, (c,), body)

    def pfp(self, st: ArrayState, c, j) -> ArrayState:
        """`preempt_for_pages`' body at j != c: one victim, newest first over the whole list."""
        ops = self.ops

        def body(G, st, r):
            eligible = ops.and_(st.g["pfp_active"], ops.not_(st.g["pfp_done"]), j != c, r["in_list"],
                                ops.not_(r["gen_s"]), ops.not_(r["ctx_s"]), self.rp_candidate(r),
                                ops.not_(r["suspended"]), r["blocks"] > 0)
            with G.when(eligible):
                self.recompute_pause(G, st, r)
                G.set(r, "preempted_ids", True)
            st.g["pfp_done"] = ops.or_(st.g["pfp_done"], eligible)
        return self._body(st, (j,), body)

    def ctx_b(self, st: ArrayState, c) -> ArrayState:
        ops = self.ops

        def body(G, st, r):
            with G.when(st.g["pfp_active"]):
                st.g["cx_act"] = ops.ite(G.guard, ops.ite(st.g["pfp_done"], STOP, SKIP), st.g["cx_act"])
                self._ctx_rest(G, st, r)
            st.g["pfp_active"] = self.value(False)
        return self._body(st, (c,), body)

    def _ctx_rest(self, G, st, r) -> None:
        """The end of the context body (under its guard): release a refused first chunk, break on
        STOP, schedule on SCHED."""
        ops = self.ops
        act = st.g["cx_act"]
        with G.when(ops.and_(st.g["cx_first"], act != SCHED)):
            self.pass_release(G, st, r)
        G.set(st.g, "cgoing", act != STOP)
        with G.when(act == SCHED):
            self.setflag(G, st, r, "ctx_s")
            tokens = st.g["cx_remaining"]
            draft = ops.ite(tokens == self.remaining_context(r), self.o.draft_len, 0)
            self.schedule(G, st, r, tokens, draft)
            self.commit(G, st, tokens + draft)

    def det(self, st: ArrayState, c) -> ArrayState:
        ops = self.ops

        def body(G, st, r):
            st.g["det_gens"] = ops.or_(st.g["det_gens"], ops.and_(r["in_list"], r["phase"] == DECODING))
            st.g["det_ctxs"] = ops.or_(st.g["det_ctxs"], ops.and_(r["pending"], ops.not_(r["preempted_ids"])))
        return self._body(st, (c,), body)

    def det_end(self, st: ArrayState) -> ArrayState:
        ops = self.ops
        st = st.copy()
        G = Guarded(ops)
        idle = ops.or_(st.g["prog_any"], ops.and_(ops.not_(st.g["det_gens"]), ops.not_(st.g["det_ctxs"])))
        st.g["stalls"] = ops.ite(idle, 0, st.g["stalls"] + 1)
        with G.when(st.g["stalls"] >= self.o.stall_limit):
            G.set(st.g, "perr", True)
            G.set(st.g, "perr_kind", ERROR_KINDS["deadlock"])
        return st

    def fail(self, st: ArrayState, c) -> ArrayState:
        ops = self.ops

        def body(G, st, r):
            with G.when(ops.and_(st.g["perr"], r["present"], r["phase"] < FINISHED)):
                self.core_release(G, st, r)
                G.set(r, "phase", FAILED)
                G.set(r, "failed", True)
        return self._body(st, (c,), body)

    def fail_end(self, st: ArrayState) -> ArrayState:
        st = st.copy()
        G = Guarded(self.ops)
        with G.when(st.g["perr"]):
            G.set(st.g, "error", True)
            G.set(st.g, "step", st.g["step"] + 1)
        return st

    def exec_(self, st: ArrayState, c) -> ArrayState:
        """`Core.execute` at c; the early stop is decided on generated before the step (execute is
        the first thing in the step to change generated at c)."""
        ops = self.ops

        def body(G, st, r):
            stop = ops.and_(r["output_len"] > 0, r["generated"] + 1 >= r["output_len"])
            with G.when(ops.and_(ops.not_(st.g["perr"]), r["scheduled"])):
                decoding = r["phase"] == DECODING
                computed = r["computed"] + r["own"]
                context_len = r["prompt"] + r["generated"]
                completes = ops.and_(ops.not_(decoding), computed >= context_len)
                with G.when(decoding):
                    G.set(r, "computed", r["computed"] + 1)
                    G.set(r, "generated", r["generated"] + 1)
                with G.when(completes):
                    G.set(r, "computed", context_len)
                    G.set(r, "generated", r["generated"] + 1)
                    G.set(r, "phase", DECODING)
                with G.when(ops.and_(ops.not_(decoding), ops.not_(completes))):
                    G.set(r, "computed", computed)
                    G.set(r, "phase", PREFILLING)
                sampled = ops.or_(decoding, completes)
                with G.when(ops.and_(sampled, ops.or_(stop, r["generated"] >= r["max_new"]))):
                    self.core_release(G, st, r)
                    G.set(r, "phase", FINISHED)
                    G.set(r, "finished", True)
        return self._body(st, (c,), body)

    def exec_end(self, st: ArrayState) -> ArrayState:
        st = st.copy()
        G = Guarded(self.ops)
        with G.when(self.ops.not_(st.g["perr"])):
            G.set(st.g, "step", st.g["step"] + 1)
        return st

    def finish_step(self, pre: ArrayState, st: ArrayState) -> ArrayState:
        """A dead engine does nothing: the state is the pre-state (scratch and record aside)."""
        out = st.copy()
        dead = st.g["dead"]
        for f in REQ:
            out.a[f] = ([self.ops.ite(dead, a, b) for a, b in zip(pre.a[f], st.a[f])] if self.lists else
                        z3.If(dead, pre.a[f], st.a[f]))
        for f in (*STATE_GLOBALS, *GHOSTS):
            out.g[f] = self.ops.ite(dead, pre.g[f], st.g[f])
        return out

    # -- one whole pass for a concrete n (refinement, replay) ------------------------------
    def step(self, st: ArrayState, n: int) -> ArrayState:
        """The micro-steps in program order for a concrete n. With `fold` (a concrete state, for
        replay) every term is simplified to a value after each micro-step."""
        pre = st
        run = self._folded if self.fold else (lambda f, *a: f(*a))
        st = run(self.start, st)
        for c in range(n):
            st = run(self.arrive, st, c)
        st = run(self.snap, st)
        for c in range(n):
            st = run(self.gen_a, st, c)
            if not self._idle(st, "ev_active"):
                for j in range(n - 1, c, -1):
                    st = run(self.evict, st, c, j)
            if not self._idle(st, "rp_active", "rp_done"):
                for j in range(n - 1, c, -1):
                    st = run(self.rpause, st, c, j)
            st = run(self.gen_b, st, c)
        for c in range(n):
            st = run(self.ctx_a, st, c)
            if not self._idle(st, "pfp_active", "pfp_done"):
                for j in range(n - 1, -1, -1):
                    st = run(self.pfp, st, c, j)
            st = run(self.ctx_b, st, c)
        for c in range(n):
            st = run(self.det, st, c)
        st = run(self.det_end, st)
        if not self._idle(st, "perr"):
            for c in range(n):
                st = run(self.fail, st, c)
        st = run(self.fail_end, st)
        for c in range(n):
            st = run(self.exec_, st, c)
        st = run(self.exec_end, st)
        return self.finish_step(pre, st)

    def _idle(self, st: ArrayState, active: str, done: Optional[str] = None) -> bool:
        """On numbers (`Concrete` ops: the core's own step in a simulation), whether a loop is a no-op: each of
        its bodies (evict, rpause, pfp, fail) changes a field or scalar only under `active` and not `done`, and
        with that off writes back what it read. Such a loop is skipped: the same state, without the O(n) bodies
        (most of a pass's micro-steps; the differential tests run millions). On terms every body runs: the
        proofs and `refinement.tied` take the pass apart micro-step by micro-step."""
        if self.ops.symbolic:
            return False
        return not st.g[active] or (done is not None and bool(st.g[done]))

    @staticmethod
    def _folded(f, *args) -> ArrayState:
        st = f(*args)
        return ArrayState({k: z3.simplify(v) for k, v in st.a.items()},
                          {k: z3.simplify(v) if z3.is_expr(v) else v for k, v in st.g.items()}, st.n)


# -- the core's own step: the micro-steps on its slots -------------------------------------------
def core_step(ops, k: Knobs, p: Params, s: SlotState) -> tuple[SlotState, SlotRecord]:
    """`TrtllmV2Core.step` for a design the micro-steps cover (`unsupported`): the slots and the workload as
    lists, each ghost its sum over them, one pass of `V2ArrayModel.step`, and the slots and record read back
    (a dead engine's step records nothing, as `Core.step`). So the step the proofs for every n take apart is
    the core's own, not a second definition of it."""
    n = len(s)
    model = V2ArrayModel(ops, k, lists=True)
    a = {f: [s.req[i][f] for i in range(n)] for f in REQ}
    a.update({f: [p.slots[i][f] for i in range(n)] for f in PARAMS})
    st = ArrayState(a, {f: s.g[f] for f in STATE_GLOBALS}, n)
    for name in GHOSTS:
        st.g[name] = ops.sum(model.sums[name](st.cell(i)) for i in range(n))
    post = model.step(st, n)
    live = ops.not_(post.g["dead"])
    failed = ops.and_(live, post.g["perr"])
    record = SlotRecord([ops.ite(live, post.a["tokens"][i], 0) for i in range(n)],
                        {f: [ops.and_(live, post.a[f][i]) for i in range(n)] for f in RECORD_FLAGS},
                        ops.ite(live, post.g["charged"], 0), failed, ops.ite(failed, post.g["perr_kind"], 0))
    return SlotState([{f: post.a[f][i] for f in REQ} for i in range(n)], {f: post.g[f] for f in STATE_GLOBALS}), record


_PLAIN = (int, bool)


def _same(a, b) -> bool:
    """Whether a field's new value is its old one: the same term, or the same number of the same type. The plain
    numbers of concrete runs are answered first: called ~20 M times in the differential tests' concrete runs,
    which this makes about 25% faster (z3.is_expr is a Python isinstance chain)."""
    ta, tb = type(a), type(b)
    if ta in _PLAIN or tb in _PLAIN:
        return ta is tb and a == b
    if z3.is_expr(a) and z3.is_expr(b):
        return a.eq(b)
    if not z3.is_expr(a) and not z3.is_expr(b):
        return a == b and type(a) is type(b)
    return False


def unsupported(k: Knobs) -> Optional[str]:
    if not k.options.disable_overlap_scheduler:
        return "the overlap executor: the array model covers _executor_loop (disable_overlap_scheduler) only"
    if k.chunked_prefill:
        return "chunked prefill: the array model covers chunking off only"
    if not (isinstance(k.host_blocks, int) and k.host_blocks == 0):
        return "a host tier: the array model covers host_blocks = 0 only"
    if not isinstance(k.options.draft_len, int):
        return "draft_len must be a number"
    return None


def initial(ops, k: Knobs, tag: str = "init", n=None) -> ArrayState:
    """`Core.initial` as arrays: every request pending and empty; params free; ghosts 0 (a sum of zeros)."""
    st = fresh(tag, n, with_pass=False)
    for f, t in REQ.items():
        st.a[f] = z3.K(z3.IntSort(), const(PENDING if f == "phase" else (False if t is bool else 0), t))
    st.g.update(step=num(0), free_blocks=k.num_blocks if z3.is_expr(k.num_blocks) else num(k.num_blocks),
                free_host_blocks=num(0), error=z3.BoolVal(False), stalls=num(0), S_blocks=num(0), S_B=num(0),
                S_R=num(0))
    return st


