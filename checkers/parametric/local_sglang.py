"""Any number of requests, one request at a time, for SGLang (radix cache off, chunked prefill off,
FCFS, ignore_eos requests): the step of one request with the others as an environment, and progress
from two distinguished requests (the first of the decode batch's preference order, and the head of
the waiting queue).

The sglang core's step (model/symbolic/cores/sglang.py) reads the other requests in named places
(`Plan.seen`, `Plan.at_turn`): the queue ranks it closes up (`wait.rank_start`, `wait.rank_end`,
the merged batch's `merge.rank_kept` / `merge.rank_member`); in the prefill pass the batch and
queue sizes, the free pool, one turn per waiting position (whether the pass is still going, the
admitted count, the two offsets, the input left) with, inside the turn, the candidate's own entry
in SGLang's finish-order list (`bs`, `freed`, `left_bs`) and whether another entry fails the
simulation (`others_bad`); after it,
whether the pool was short (`prefill.oom`, the core's only error) and whether anything was
admitted; in decode the batch size, whether every member fits, the request's preference rank, how
many are kept, whether the last is aborted and a retracted request's place in the queue. With an
`Environment` each is a fresh term (a count or a rank not negative), the prefill loop has one
turn, the request's own: `Core.step` on one slot is then the step of one request among any number.
`refines` checks that against the whole core for n = 1..3 (the reads recorded per loop position
and slot, `Recorder`; slot i's replayed, `Replay`); leaving a read to the one slot fails it.

On it, for every n:
- "local": per-request invariants P (the core's, at one slot, and that a dead engine has answered
  the request): true at the start and kept by the one request's step whatever the others give;
- "progress": a quiet state's unfinished request is queued or in a batch, only an unfinished batch
  member holds pages, the engine is alive; the first of the decode batch's preference order (rank
  0, some member kept) is decoded, aborted, or the pass admitted something, or the pool ran short;
  with no unfinished batch member, the head of waiting, reading the pass's start (nothing running,
  the pool free, the pass going, nothing admitted, no offsets, an empty list), is admitted or the
  pool ran short. `heads` checks on the core for n = 1..4 that those are what the distinguished
  requests read, and that an admission schedules a request; `concrete_disagreement` checks all of
  it on every state of concrete runs with any number of requests. docs/symbolic.md, "SGLang, one
  request at a time".

The step taken apart is event_loop_normal's (disable_overlap_schedule). The core also expresses SGLang's default
loop, event_loop_overlap (model/symbolic/overlap.py), whose pass and landing read the batch in flight, which no
named read covers: every entry point here refuses that loop (`unsupported`, as trtllm_v2_micro.unsupported refuses
TensorRT-LLM's overlap executor; `covers` says so in one line, and the core's step refuses an environment in it).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.symbolic.core import CORES
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import (FINISHED, PREEMPTED, WAITING, Knobs, Params, SlotState, terminal,
                                  unfinished)
from properties.symbolic import quiet

from .. import clock
from ..encode import fresh_state
from ..induction import workload_constraints
from . import local_vllm
from .local import (_solver, _status, _z3, differing_slot, for_each_n, fresh_params, same_for_every_slot,
                    slot_differences)
from .local_vllm import OneStep, Recorder, Replay, keeps
from .sealed import premise

# the modules the step runs whose code could tell one request from all (`sealed.mode_blind`)
MODULES = ("model/symbolic/core.py", "model/symbolic/cores/sglang.py")

SYM = local_vllm.SYM
CORE = "sglang"
# the core's per-request invariants the argument keeps (model/symbolic/core.py `invariants`,
# SglangCore.invariants and core_invariants), at one slot
LOCAL_INVARIANTS = ("fields", "live-owes-tokens", "pending-holds-nothing", "done-holds-nothing", "queued-iff-waiting",
                    "queued-holds-nothing", "decoding-in-a-batch", "batch-members-started", "cap")
# values of the others that are counts or ranks: never negative
COUNTS = ("wait.rank_start", "wait.rank_end", "merge.rank_kept", "merge.rank_member",
          "prefill.n_run", "prefill.n_wait", "prefill.count", "prefill.bs", "prefill.freed",
          "decode.n_run", "decode.rank", "decode.n_keep", "decode.requeue_rank")


def unsupported(k: Knobs) -> Optional[str]:
    """Why the one-request step does not stand for this design's step, or None."""
    if not k.options.disable_overlap_schedule:
        return ("engine.options.disable_overlap_schedule: the SGLang one-request argument covers event_loop_normal "
                "only (disable_overlap_schedule = true), not the default event_loop_overlap")
    return None


def _refuse(k: Knobs) -> None:
    """Refuse, never decide with the normal loop's semantics, a design this argument does not cover."""
    why = unsupported(k)
    if why is not None:
        raise ValueError(why)


class Environment(local_vllm.Environment):
    """The other requests, unknown. The sglang core's only error is the prefill pass's short pool,
    already a read of the others (`prefill.oom`), so `step.error` is passed on as the core made it."""
    counts = COUNTS

    def seen(self, name: str, value, i):
        if name == "step.error":
            return value
        return super().seen(name, value, i)


def _queued(r):
    return z3.Or(r["phase"] == WAITING, r["phase"] == PREEMPTED)


def _in_batch(r):
    return z3.Or(r["rpos"] >= 0, r["lpos"] >= 0)


def _member(w, r):
    """An unfinished request of a batch: after the step's merge, in the running batch."""
    return z3.And(w["present"], _in_batch(r), z3.Not(terminal(SYM, r["phase"])))


# -- what the argument keeps of each request ------------------------------------------------------
def _local(core, ops, k: Knobs, p: Params, s: SlotState, i: int = 0, names=LOCAL_INVARIANTS) -> dict:
    """P at slot i: the core's per-request invariants `names`, no host pages (SGLang has no host tier
    here), and that a dead engine has answered it."""
    inv = core.invariants(ops, k, p, s)
    out = {name: inv[name] for name in (f"r{i}.{x}" for x in names)}
    out[f"r{i}.no-host-pages"] = s.req[i]["host_blocks"] == 0
    out[f"r{i}.answered-when-dead"] = ops.implies(ops.and_(s.g["error"], p.slots[i]["present"]),
                                                  s.req[i]["phase"] >= FINISHED)
    return out


# -- the abstraction against the whole core ------------------------------------------------------
def refines(k: Knobs, cons: list, n: int, timeout: float, skip: tuple[str, ...] = ()) -> tuple[str, str]:
    """For n slots, every reachable pre-state (the core's invariants) and every slot i: the one-slot
    step with slot i's recorded reads gives slot i the n-slot step's fields and record entries."""
    _refuse(k)
    core = CORES[CORE]
    pre, params, differ = slot_differences(core, k, n, Recorder(), lambda rec, i: Replay(rec, i, skip))
    reachable = [c for c in core.invariants(SYM, k, params, pre).values() if c is not True]
    return same_for_every_slot(_solver(timeout, *cons, *workload_constraints(params), *reachable), differ)


def waiting_head_reads(k: Knobs, turn: Callable, seen: Callable, left) -> list[tuple]:
    """What the head of waiting reads with no batch member, as (read, value) pairs: first in the
    queue, nothing running, the pool free; at its turn the pass going, nothing admitted, no offsets,
    the whole input budget, and an empty list (its own entry the only one: bs 1, nothing before it)."""
    return [(seen("wait.rank_start"), 0), (seen("prefill.n_wait") >= 1, True), (seen("prefill.n_run"), 0),
            (seen("prefill.free"), k.num_blocks), (turn("prefill.going"), True), (turn("prefill.count"), 0),
            (turn("prefill.total_offset"), 0), (turn("prefill.current_offset"), 0),
            (turn("prefill.rem_input"), k.max_num_tokens), (turn("prefill.bs"), 1), (turn("prefill.freed"), 0),
            (turn("prefill.left_bs"), left), (turn("prefill.others_bad"), False)]


def decode_head_reads(seen: Callable) -> list[tuple]:
    """What the first of the decode batch's preference order reads: rank 0, a batch, some kept."""
    return [(seen("decode.rank"), 0), (seen("decode.n_run") >= 1, True), (seen("decode.n_keep") >= 1, True)]


def _recorded(rec: Recorder, i: int) -> tuple[Callable, Callable]:
    """Slot i's turn values and other reads in a recorded pass, by name."""
    replay = Replay(rec, i)
    per_slot = ("wait.rank_start", "decode.rank")
    return (lambda name: replay.turn(name, 0, None),
            lambda name: rec.taps[(name, i if name in per_slot else None)])


def _left(s: SlotState, i: int):
    return s.req[i]["cap"] - s.req[i]["generated"]


def head_env(k: Knobs, cons: list, n: int, timeout: float, invariants: Optional[Callable] = None) -> tuple[str, str]:
    """On the core for n slots, from its invariants, in a quiet state with the engine alive: with an
    unfinished batch member, some such member reads `decode_head_reads`; with none, the queued request
    of least rank reads `waiting_head_reads`; and an admission schedules a request."""
    _refuse(k)
    core = CORES[CORE]
    pre, params = fresh_state(core, n, "pre"), fresh_params(n)
    rec = Recorder()
    _, record = core.step(SYM, k, params, pre, env=rec)
    holds = lambda pairs: z3.And(*[_z3(read) == value for read, value in pairs])   # noqa: E731
    calm = z3.And(quiet(SYM, params, pre), z3.Not(pre.g["error"]))
    members = [_member(w, r) for w, r in zip(params.slots, pre.req)]
    facts = {"some batch member reads rank 0 with some kept": z3.And(calm, z3.Or(*members), z3.Not(z3.Or(*[
        z3.And(members[i], holds(decode_head_reads(_recorded(rec, i)[1]))) for i in range(n)])))}
    heads = []
    for i in range(n):
        r, live = pre.req[i], params.slots[i]["present"]
        head = z3.And(calm, z3.Not(z3.Or(*members)), live, _queued(r),
                      *[z3.Implies(z3.And(params.slots[j]["present"], _queued(pre.req[j])),
                                   r["wpos"] <= pre.req[j]["wpos"]) for j in range(n) if j != i])
        heads.append(z3.And(head, z3.Not(holds(waiting_head_reads(k, *_recorded(rec, i), _left(pre, i))))))
    facts["the head of waiting reads the pass's start"] = z3.Or(*heads)
    facts["an admission schedules a request"] = z3.And(calm, _z3(rec.taps[("prefill.prefilled", None)]),
                                                       z3.Not(z3.Or(*record.flags["scheduled"])))
    reachable = [c for c in core.invariants(SYM, k, params, pre).values() if c is not True]
    if invariants is not None:
        reachable += [c for c in invariants(SYM, k, params, pre).values() if c is not True]
    solver = _solver(timeout, *cons, *workload_constraints(params), *reachable)
    for name, bad in facts.items():
        r = solver.check(_z3(bad))
        if r == z3.sat:
            return "failed", f"not so: {name}"
        if r != z3.unsat:
            return "unknown", solver.reason_unknown()
    return "proved", ""


def concrete_disagreement(cfg, workload, skip: tuple[str, ...] = (), max_steps: int = 400) -> Optional[str]:
    """The abstraction and the distinguished requests' reads beyond the n the solver checks: on every
    state of one concrete run of the core (as many requests as the workload has). None, or the first
    difference."""
    core = CORES[CORE]
    k, p = Knobs.of(cfg), Params.of(workload)
    _refuse(k)
    for s in run_core(core, k, p, max_steps).states[:-1]:
        rec = Recorder()
        i = differing_slot(core, k, p, s, rec, lambda rec, i: Replay(rec, i, skip))
        if i is not None:
            return f"step {s.g['step']}, slot {i}: the one-request step differs from the core's"
        if not quiet(CONCRETE, p, s) or s.g["error"]:
            continue
        _, record = core.step(CONCRETE, k, p, s, env=(rec := Recorder()))
        if rec.taps[("prefill.prefilled", None)] and not any(record.flags["scheduled"]):
            return f"step {s.g['step']}: an admission scheduled nothing"
        live = [i for i, w in enumerate(p.slots) if w["present"]]
        members = [i for i in live if (s.req[i]["rpos"] >= 0 or s.req[i]["lpos"] >= 0)
                   and not terminal(CONCRETE, s.req[i]["phase"])]
        queued = [i for i in live if s.req[i]["phase"] in (WAITING, PREEMPTED)]
        if members:
            if not any(all(read == value for read, value in decode_head_reads(_recorded(rec, i)[1])) for i in members):
                return f"step {s.g['step']}: no batch member reads rank 0 with some kept"
        elif queued:
            h = min(queued, key=lambda i: s.req[i]["wpos"])
            pairs = waiting_head_reads(k, *_recorded(rec, h), _left(s, h))
            if any(read != value for read, value in pairs):
                return f"step {s.g['step']}: the head of waiting, slot {h}, reads {[read for read, _ in pairs]}"
    return None


# -- the argument on the one-request step ------------------------------------------------------
def _P(k: Knobs, names) -> Callable:
    return lambda p, s: _local(CORES[CORE], SYM, k, p, s, names=names)


def local_invariants(k: Knobs, cons: list, timeout: float, workload: Optional[Callable] = None,
                     names=LOCAL_INVARIANTS) -> list[tuple]:
    """P at the start, and kept by one request's step whatever the others do."""
    _refuse(k)
    return keeps(CORES[CORE], k, cons, timeout, _P(k, names), workload, Environment("one.env"))


def progress(k: Knobs, cons: list, timeout: float, workload: Optional[Callable] = None,
             names=LOCAL_INVARIANTS) -> list[tuple]:
    """In a quiet step: the first of the decode batch's preference order decodes (or is aborted, or
    the pass admitted, or the pool ran short); with no batch member, the head of waiting is admitted
    (or the pool ran short), given what `heads` shows they read."""
    _refuse(k)
    one = OneStep(CORES[CORE], k, _P(k, names), workload, Environment("one.env"))
    w, r, post = one.p.slots[0], one.pre.req[0], one.post.req[0]
    base = [*cons, *one.facts(), quiet(SYM, one.p, one.pre)]
    assume = lambda pairs: [_z3(read) == value for read, value in pairs]   # noqa: E731
    scheduled, error = one.record.flags["scheduled"][0], _z3(one.record.error)
    alive = z3.Not(one.pre.g["error"])
    obligations = [
        # what the case split rests on, at every request
        ("an unfinished request means the engine is alive", [],
         z3.Implies(unfinished(SYM, r["phase"]), alive)),
        ("unfinished work is queued or in a batch", [alive],
         z3.Implies(unfinished(SYM, r["phase"]), z3.Or(z3.And(_queued(r), r["wpos"] >= 0), _in_batch(r)))),
        ("only an unfinished batch member holds pages", [],
         z3.Implies(r["blocks"] != 0, _member(w, r))),
        ("the first of the decode order decodes", [alive, _member(w, r), *assume(decode_head_reads(one.read))],
         z3.Or(scheduled, error, _z3(one.read("prefill.prefilled")), post["phase"] != r["phase"])),
        ("the head of waiting is admitted", [alive, _queued(r), *assume(waiting_head_reads(k, one.read, one.read,
                                                                                           _left(one.pre, 0)))],
         z3.Or(scheduled, error)),
    ]
    out = []
    for name, facts, goal in obligations:
        t0 = time.monotonic()
        st = _status(_solver(timeout, *base, *facts), _z3(goal))
        out.append(("progress", name, st, time.monotonic() - t0, ""))
    return out


def covers(design, prop: str) -> Optional[str]:
    """Why this argument does not apply to a claim, or None."""
    if design.policy != CORE:
        return "the SGLang one-request argument covers sglang only"
    if prop != "LIVE-NO-PROGRESS":
        return "the SGLang one-request argument proves LIVE-NO-PROGRESS only"
    if not design.options.disable_overlap_schedule:
        return unsupported(Knobs.of(design))
    why = CORES[CORE].unsupported(design)
    return None if why is None else f"{why[0]}: {why[1]}"


def argument(design, k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
             workload: Optional[Callable] = None, refine_up_to: int = 3, heads_up_to: int = 4) -> list[tuple]:
    """The whole argument for one claim: the premise that makes the one-slot step the step of any request
    among any number (the core runs one code with or without an environment: checkers/parametric/
    sealed.py), then, only if it holds, the `obligations`; each part as (action, name, status, seconds,
    reason). This core's one-request step takes branches of its own, pinned to the pass only for
    n <= refine_up_to (`refines`, `heads`), so today the argument ends at the premise."""
    why = covers(design, "LIVE-NO-PROGRESS")
    if why:
        return [("refines", "applies", "failed", 0.0, why)]
    first = premise(MODULES)
    if first[2] != "proved":
        return [first]
    return [first] + obligations(design, k, cons, timeout, invariants, workload, refine_up_to, heads_up_to)


def obligations(design, k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
                workload: Optional[Callable] = None, refine_up_to: int = 3, heads_up_to: int = 4) -> list[tuple]:
    """The argument's obligations (what `argument` runs once its premise holds)."""
    _refuse(k)
    deadline = clock.now() + timeout
    left = lambda: max(0.001, clock.until(deadline))   # noqa: E731
    out = for_each_n("refines", refine_up_to, lambda n, t: refines(k, cons, n, t), left)
    out += for_each_n("heads", heads_up_to, lambda n, t: head_env(k, cons, n, t, invariants), left)
    out += local_invariants(k, cons, left(), workload)
    out += progress(k, cons, left(), workload)
    return out
