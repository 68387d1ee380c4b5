"""Any number of requests, one request at a time: the step of one request with the others as an
environment (trtllm_v1's token-budget claims).

The slot core's pass is a chain of loops over the requests (`_Pass` in
model/symbolic/cores/trtllm_v1.py). A loop's turn for request i reads request i and the loop's
running values (the tokens batched so far, the capacity left, ...), and nothing else of the others.
The core names those running values (`_Pass.seen`), so the step of one request among any number is
`Core.step` on one slot with an environment that supplies them (`Environment`): every running value
a fresh term. MAX_UTILIZATION's capacity loop is the exception (its cursor visits a request more
than once and picks victims behind it): there the environment gives the request any outcome of
the shape below. That step has every behaviour request i can have among n others, for every n:
the abstraction (environment abstraction: one distinguished request, the others summed up in what
it reads; Clarke, Talupur and Veith 2006). `refines` checks it for n = 1..3 against the whole
core: with the running values the n-slot pass had at slot i's turns (`Replay`), the one-slot step
gives slot i exactly what the n-slot step gives it; leaving one running value to the one slot
(`Replay.skip`, a deliberately unsound view) fails it. `concrete_disagreement` checks the same on
every state of a concrete run with any number of requests.

On it, for every n:
- "local": per-request invariants P (init; step of the one request from any environment);
  then every reachable state of any number of requests has P at every request;
- "scan": each loop's invariant over its running values (from its first value; each turn, of
  any request satisfying P, keeps it), so it holds at every turn and at the end;
- "bound": each request's tokens in the step are at most its share `a` of the running values,
  the shares being the turns' increments (so the sum of all shares telescopes to end minus start);
- "sum": the shares' sum is at most max_num_tokens, from the scan invariants at the end.
So no step of any reachable state runs more than max_num_tokens (SAFE-BUDGET). docs/symbolic.md,
"Any number of requests, one request at a time".

MAX_UTILIZATION's outcome (fitting, paused) for a request: fitting only if listed (unfinished),
paused only if listed and started and not fitting. `capacity_shape_any_n` proves it for every n on
the loop over arrays (the cursor moves past every slot it schedules, `end` moves down to every
victim, which it picks in [cursor, end)); `capacity_shape` checks it on the core's own loop for
n = 1..5.
"""

from __future__ import annotations

import time
from typing import Optional

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.policies.trtllm_v1 import GNE
from model.symbolic.core import CORES
from model.symbolic.ops import Symbolic
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import Knobs, Params, SlotState

from .. import clock
from ..encode import fresh_params_slots, fresh_state
from ..induction import workload_constraints
from .sealed import MAX_BOUND, PhantomReads, handoffs, layout, outputs, premise, structure_bound, uniform

SYM = Symbolic()
# what the token-budget argument needs of every request (model/symbolic/core.py `invariants`):
# fields in range, a queued or prefilling request short of its context, a live one owing tokens,
# no OFFLOADED phase (V1 has none), nothing held before arrival; and, block reuse off, no cached
# prefix (`_local`)
LOCAL_INVARIANTS = ("fields", "context-cursor", "live-owes-tokens", "not-offloaded", "pending-holds-nothing")


def _fresh_like(name: str, value):
    if isinstance(value, bool) or (z3.is_expr(value) and z3.is_bool(value)):
        return z3.Bool(name)
    return z3.Int(name)


# the running values `budget` reads of the request's turns (what they hand on, the loop's first value),
# and the sums over the requests whose summand it reads (`_Pass.seen_sum`)
RUNNING = ("micro_batch.batch_tokens", "micro_batch.chunked_compute", "micro_batch.all_fit", "chunk_fcfs.left",
           "fit_draft_tokens.used")
SUMMED = ("fit_draft_tokens.start.used",)


class Environment:
    """The other requests, unknown: each running value a fresh term (`sealed.PhantomReads` names
    them: the request's own reads and the loops' ends by name and occurrence, a read at another
    request's turn a phantom constant). `own`: the request's slot among phantom requests
    (`sealed.layout`; 0 alone). `taps[(name, 0)]` / `taps[(name, None)]` list, per read of the
    request / at a loop's end, (the value passed in, the term read instead); a `seen_sum` tap holds
    the request's own summand."""

    def __init__(self, tag: str = "env", own: int = 0):
        self.tag, self.own, self.taps = tag, own, {}
        self.reads = PhantomReads(tag, own)

    def seen(self, name: str, value, i):
        term = self.reads.fresh(name, value, i, _fresh_like)
        if i is None or i == self.own:
            self.taps.setdefault((name, None if i is None else 0), []).append((value, term))
        return term

    def seen_sum(self, name: str, summands: list, total):
        """A sum over the requests: the total is the environment's, the request's summand its own."""
        mine = summands[self.own]
        term = self.reads.fresh(name, mine, None, _fresh_like)
        self.taps.setdefault((name, None), []).append((mine, term))
        return term

    def capacity(self, pas, fitting: list, paused: list) -> tuple[list, list]:
        """MAX_UTILIZATION's outcome for the request: any of the shape's three."""
        ops, o = pas.ops, self.own
        fit = ops.and_(pas.listed[o], z3.Bool(f"{self.tag}.fitting"))
        pause = ops.and_(pas.listed[o], pas.started(o), ops.not_(fit), z3.Bool(f"{self.tag}.paused"))
        return ([fit if i == o else f for i, f in enumerate(fitting)],
                [pause if i == o else q for i, q in enumerate(paused)])


class Recorder:
    """The whole core's pass, unchanged, with every running value noted per (name, slot), and in
    program order (`handed_on`)."""

    def __init__(self):
        self.taps, self.fitting, self.paused, self.sequence = {}, None, None, []

    def seen(self, name: str, value, i):
        self.taps.setdefault((name, i), []).append(value)
        self.sequence.append((name, i, value))
        return value

    def handed_on(self, i: int) -> dict:
        """What slot i's turns hand on of the running values the argument reads (`RUNNING`)."""
        return {key: v for key, v in handoffs(self.sequence, i).items() if key.startswith("handoff.")
                and key.split(".", 1)[1].rsplit(".", 1)[0] in RUNNING}

    def seen_sum(self, name: str, summands: list, total):
        return self.seen(name, total, None)

    def capacity(self, pas, fitting: list, paused: list) -> tuple[list, list]:
        self.fitting, self.paused = list(fitting), list(paused)
        self.listed, self.started = list(pas.listed), [pas.started(i) for i in range(pas.n)]
        return fitting, paused


class Replay:
    """Slot `i` of a recorded pass: its running values and capacity outcome as the n-slot pass had
    them. `skip` names running values left to the one slot (a deliberately unsound view, for tests)."""

    def __init__(self, rec: Recorder, i: int, skip: tuple[str, ...] = ()):
        self.rec, self.i, self.skip, self.read, self.sequence = rec, i, skip, {}, []

    def seen(self, name: str, value, i):
        key = (name, self.i if i is not None else None)
        k = self.read.get(key, 0)
        self.read[key] = k + 1
        self.sequence.append((name, i, value))
        return value if name in self.skip else self.rec.taps[key][k]

    def handed_on(self) -> dict:
        """What the one slot's turns hand on (its running values after each of its turns), as
        `Recorder.handed_on`: to equal the n-slot pass's at slot i."""
        return {key: v for key, v in handoffs(self.sequence, 0).items() if key.startswith("handoff.")
                and key.split(".", 1)[1].rsplit(".", 1)[0] in RUNNING}

    def seen_sum(self, name: str, summands: list, total):
        return self.seen(name, total, None)

    def capacity(self, pas, fitting: list, paused: list) -> tuple[list, list]:
        return [self.rec.fitting[self.i]], [self.rec.paused[self.i]]


def one_slot(state: SlotState, params: Params, i: int) -> tuple[SlotState, Params]:
    return SlotState([state.req[i]], state.g), Params([params.slots[i]])


def _status(solver: z3.Solver, goal) -> str:
    """Whether the solver's facts imply `goal`: proved, failed (a counterexample exists) or unknown."""
    r = solver.check(z3.Not(goal) if z3.is_expr(goal) else z3.BoolVal(not goal))
    return "proved" if r == z3.unsat else "failed" if r == z3.sat else "unknown"


def _solver(timeout: float, *facts) -> z3.Solver:
    s = z3.Solver()
    clock.limit(s, timeout)
    s.add(*[f for f in facts if f is not True])
    return s


def _local(core, ops, k: Knobs, p: Params, s: SlotState, i: int = 0, names=LOCAL_INVARIANTS) -> dict:
    """P at slot i: the core's per-request invariants `names`, and with block reuse off no cache entry
    and no shared prefix block (`r{i}.no-cache`: the cache's fields live in request slots)."""
    inv = core.invariants(ops, k, p, s)
    return {name: inv[name] for name in (f"r{i}.{x}" for x in (*names, "no-cache"))}


# -- the abstraction against the whole core ------------------------------------------------------
def fresh_params(n: int, tag: str = "w", pin: Optional[dict] = None) -> Params:
    """A fresh workload of n slots, the fields in `pin` fixed to the values given."""
    return Params([{**w, **(pin or {})} for w in fresh_params_slots(n, tag)])


def slot_differences(core, k: Knobs, n: int, rec, replay, pin: Optional[dict] = None) -> tuple[SlotState, Params, list]:
    """The n-slot step from a fresh pre-state with `rec` noting what it reads, and for every slot i
    the one-slot step with `replay(rec, i)`: (pre-state, workload, the terms "slot i's phase,
    counters, blocks or record entries differ"). `pin`: workload fields fixed (`fresh_params`)."""
    pre, params = fresh_state(core, n, "pre"), fresh_params(n, pin=pin)
    post, record = core.step(SYM, k, params, pre, env=rec)
    differ = []
    for i in range(n):
        s1, p1 = one_slot(pre, params, i)
        one = replay(rec, i)
        post1, record1 = core.step(SYM, k, p1, s1, env=one)
        for f, v in post1.req[0].items():
            differ.append(v != post.req[i][f])
        differ.append(record1.tokens[0] != record.tokens[i])
        differ += [record1.flags[f][0] != record.flags[f][i] for f in record.flags]
        differ += [_z3(v) != _z3(w) for v, w in handed_on_pairs(rec, one, i)]
    return pre, params, [_z3(d) for d in differ if d is not False]


def handed_on_pairs(rec, one, i: int) -> list[tuple]:
    """(what the one slot's turns hand on, what slot i's turns hand on in the n-slot pass), for a recorder
    that notes them (trtllm_v1's): the running values after each turn, not only the request's own fields."""
    if not hasattr(rec, "handed_on"):
        return []
    mine, theirs = one.handed_on(), rec.handed_on(i)
    return [(mine[key], theirs[key]) for key in mine if key in theirs]


def same_for_every_slot(solver: z3.Solver, differ: list) -> tuple[str, str]:
    """`refines`' verdict: no slot differs under the solver's facts."""
    r = solver.check(z3.Or(*differ))
    if r == z3.unsat:
        return "proved", ""
    return ("failed", "the one-slot step differs from the core") if r == z3.sat else ("unknown", solver.reason_unknown())


def differing_slot(core, k: Knobs, p: Params, s: SlotState, rec, replay) -> Optional[int]:
    """On one concrete state of any number of requests: the n-slot step with `rec` noting what it
    reads, then each slot's one-slot step with `replay(rec, i)`; the first slot whose fields,
    tokens or flags differ, or None."""
    post, record = core.step(CONCRETE, k, p, s, env=rec)
    for i in range(len(s)):
        s1, p1 = one_slot(s, p, i)
        one = replay(rec, i)
        post1, record1 = core.step(CONCRETE, k, p1, s1, env=one)
        if (post1.req[0], record1.tokens[0], {f: v[0] for f, v in record1.flags.items()}) != \
                (post.req[i], record.tokens[i], {f: v[i] for f, v in record.flags.items()}):
            return i
        if any(v != w for v, w in handed_on_pairs(rec, one, i)):
            return i
    return None


def concrete_disagreement(cfg, workload, skip: tuple[str, ...] = (), max_steps: int = 400) -> Optional[str]:
    """The abstraction beyond the n `refines` checks: on every state of one concrete run of the core
    (as many requests as the workload has), each slot's one-slot step with its recorded running
    values is the n-slot step's. None, or the first difference."""
    core = CORES["trtllm_v1"]
    k, p = Knobs.of(cfg), Params.of(workload)
    for s in run_core(core, k, p, max_steps).states[:-1]:
        i = differing_slot(core, k, p, s, Recorder(), lambda rec, i: Replay(rec, i, skip))
        if i is not None:
            return f"step {s.g['step']}, slot {i}: the one-request step differs from the core's"
    return None


def refines(k: Knobs, cons: list, n: int, timeout: float, skip: tuple[str, ...] = ()) -> tuple[str, str]:
    """For n slots, every pre-state and every slot i: the one-slot step with slot i's recorded
    running values gives slot i the n-slot step's phase, counters, blocks and record entries."""
    core = CORES["trtllm_v1"]
    pre, params, differ = slot_differences(core, k, n, Recorder(), lambda rec, i: Replay(rec, i, skip))
    reachable = [c for i in range(n) for c in _local(core, SYM, k, params, pre, i).values()]
    return same_for_every_slot(_solver(timeout, *cons, *workload_constraints(params), *reachable), differ)


def capacity_shape(k: Knobs, cons: list, n: int, timeout: float) -> tuple[str, str]:
    """MAX_UTILIZATION: the capacity pass's outcome per slot has the environment's shape (fitting =>
    listed; paused => listed, started, not fitting), on the core's pass for n slots."""
    core = CORES["trtllm_v1"]
    pre, params = fresh_state(core, n, "pre"), Params(fresh_params_slots(n))
    rec = Recorder()
    core.step(SYM, k, params, pre, env=rec)
    bad = []
    for i in range(n):
        fit, pause = rec.fitting[i], rec.paused[i]
        bad.append(SYM.and_(fit, SYM.not_(rec.listed[i])))
        bad.append(SYM.and_(pause, SYM.or_(SYM.not_(rec.listed[i]), SYM.not_(rec.started[i]), fit)))
    bad = [b for b in bad if b is not False]
    if not bad:
        return "proved", ""
    solver = _solver(timeout, *cons, *workload_constraints(params))
    r = solver.check(z3.Or(*bad))
    if r == z3.unsat:
        return "proved", ""
    return ("failed", "a capacity outcome outside the shape") if r == z3.sat else ("unknown", solver.reason_unknown())


def capacity_shape_any_n(timeout: float, mutant: str = "") -> list[tuple]:
    """The same shape for every n: `_Pass.max_utilization`'s loop over arrays, n symbolic. Its
    state: the cursor c (the first listed slot not yet scheduled; `after[x]` = the first listed slot
    >= x, or n), `end`, and per slot `fitting`, `paused`. A turn schedules c if it fits (any outcome
    of the sums: `fits` is free), or pauses a victim j, a started slot in [c, end) (any: the last
    one in the core), and moves `end` to it. The loop invariant, at a Skolem slot g: fitting[g] =>
    listed[g], g < c, g < end; paused[g] => started[g], g >= end (so never both). Its facts of
    `after` are proved first, by the recursion that defines it. `mutant` "victim-anywhere" lets
    the victim be any started slot (not only in [c, end)): the turn must then fail (tests)."""
    n, x, c, end, j, g = z3.Ints("n x c end j g")
    listed, started = z3.Array("listed", z3.IntSort(), z3.BoolSort()), z3.Array("started", z3.IntSort(), z3.BoolSort())
    after = z3.Array("after", z3.IntSort(), z3.IntSort())
    fitting, paused = z3.Array("fitting", z3.IntSort(), z3.BoolSort()), z3.Array("paused", z3.IntSort(), z3.BoolSort())
    live, fits = z3.Bools("live fits")
    A = lambda y: z3.And(y <= after[y], after[y] <= n, z3.Implies(after[y] < n, listed[after[y]]))
    scalar = lambda c_, e_: z3.And(c_ >= 0, z3.Or(c_ == n, z3.And(c_ < n, listed[c_])), e_ >= 0, e_ <= n)
    per = lambda f, p, c_, e_, y: z3.And(z3.Implies(f[y], z3.And(listed[y], y < c_, y < e_)),
                                         z3.Implies(p[y], z3.And(started[y], y >= e_)))
    # started slots are listed (`max_utilization`: started[i] = listed and `_Pass.started`)
    sl = lambda y: z3.Implies(started[y], listed[y])
    live1 = z3.And(live, c < end)
    scheduled = z3.And(live1, fits)
    victim = z3.Or(j == -1, z3.And(started[j], c <= j, j < end) if mutant != "victim-anywhere" else started[j])
    pause = z3.And(live1, z3.Not(fits), j >= 0)
    fitting1 = z3.If(scheduled, z3.Store(fitting, c, True), fitting)
    paused1 = z3.If(pause, z3.Store(paused, j, True), paused)
    end1 = z3.If(pause, j, end)
    c1 = z3.If(scheduled, after[c + 1], c)
    empty = z3.K(z3.IntSort(), z3.BoolVal(False))
    obligations = [
        ("after[n]", [n >= 0, after[n] == n], A(n)),
        ("after[x]", [n >= 0, x >= 0, x < n, A(x + 1), after[x] == z3.If(listed[x], x, after[x + 1])], A(x)),
        ("start", [n >= 0, A(0)], z3.And(scalar(after[0], n), per(empty, empty, after[0], n, g))),
        ("turn", [n >= 0, scalar(c, end), per(fitting, paused, c, end, g), per(fitting, paused, c, end, c),
                  per(fitting, paused, c, end, j), z3.Implies(c < n, A(c + 1)), victim, sl(g), sl(j)],
         z3.And(scalar(c1, end1), per(fitting1, paused1, c1, end1, g))),
        ("shape", [per(fitting, paused, c, end, g), sl(g)],
         z3.And(z3.Implies(fitting[g], listed[g]), z3.Implies(paused[g], z3.And(listed[g], started[g])),
                z3.Not(z3.And(fitting[g], paused[g])))),
    ]
    out = []
    for name, facts, goal in obligations:
        t0 = time.monotonic()
        st = _status(_solver(timeout, *facts), goal)
        out.append(("capacity", f"any n: {name}", st, time.monotonic() - t0, ""))
    return out


# -- the argument on the one-request step ------------------------------------------------------
class _Step:
    """One request's step with an `Environment`, alone or (`before`, `after`) among phantom requests
    (`sealed.layout`), and what its turns read and hand on."""

    def __init__(self, k: Knobs, tag: str = "one", names=LOCAL_INVARIANTS, before: int = 0, after: int = 0):
        self.core = CORES["trtllm_v1"]
        self.k, self.names = k, names
        lay = layout(self.core, before, after, tag)
        self.p, self.pre, self.own = lay.params, lay.state, lay.own
        self.env = Environment(f"{tag}.env", lay.own)
        self.post, self.record = self.core.step(SYM, k, self.p, self.pre, env=self.env)
        self.handoffs = self.env.reads.handoffs()

    def outputs(self) -> dict:
        """What `sealed.uniform` holds equal at every layout: the request's fields and record, and of
        its turns what `budget` reads (what they hand on, the loops' first values, its summand)."""
        summands = {f"summand.{name}": taps[0][0] for (name, i), taps in self.env.taps.items()
                    if i is None and name in SUMMED}
        return outputs(self.post, self.record, self.own, self.env.reads, RUNNING, summands)

    def facts(self) -> list:
        """The request is one of the n present; it satisfies P before the step."""
        w = self.p.slots[self.own]
        return [*workload_constraints(Params([w])), w["present"],
                *_local(self.core, SYM, self.k, self.p, self.pre, self.own, names=self.names).values()]

    def has(self, name: str) -> bool:
        return (name, 0) in self.env.taps

    def turns(self, name: str) -> list[tuple]:
        """(value read at the turn, value the turn hands on to the next read of it) per turn of the request."""
        return [(t, self.handoffs[f"handoff.{name}.{j}"]) for j, (_, t) in enumerate(self.env.taps[(name, 0)])]

    def start(self, name: str):
        """The loop's first value (what its first turn, whoever's, is handed)."""
        return self.handoffs[f"start.{name}"]

    def end(self, name: str):
        return self.env.taps[(name, None)][0][1]

    def delta(self, name: str):
        """What the request's turns added to a running value."""
        return z3.Sum([out - t for t, out in self.turns(name)])


def _z3(v):
    return v if z3.is_expr(v) else (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v))


def local_invariants(k: Knobs, cons: list, timeout: float, names=LOCAL_INVARIANTS) -> list[tuple]:
    """P at the start, and kept by one request's step whatever the others do."""
    core = CORES["trtllm_v1"]
    out = []
    p = Params(fresh_params_slots(1, "init.w"))
    init = core.initial(SYM, k, p)
    goals = _local(core, SYM, k, p, init, names=names)
    for name, goal in goals.items():
        t0 = time.monotonic()
        st = _status(_solver(timeout, *cons, *workload_constraints(p)), _z3(goal))
        out.append(("local", f"init {name}", st, time.monotonic() - t0, ""))
    one = _Step(k, names=names)
    solver = _solver(timeout, *cons, *one.facts())
    for name, goal in _local(core, SYM, k, one.p, one.post, names=names).items():
        t0 = time.monotonic()
        st = _status(solver, _z3(goal))
        out.append(("local", f"step {name}", st, time.monotonic() - t0, ""))
    return out


def budget(k: Knobs, cons: list, timeout: float, names=LOCAL_INVARIANTS) -> list[tuple]:
    """SAFE-BUDGET for any number of requests: scan invariants, each request's bound by its share,
    the shares' sum (module docstring). `names`: P (fewer than needed, for tests)."""
    one = _Step(k, names=names)
    M = k.max_num_tokens
    bt, cc, af = "micro_batch.batch_tokens", "micro_batch.chunked_compute", "micro_batch.all_fit"
    left, used, used0 = "chunk_fcfs.left", "fit_draft_tokens.used", "fit_draft_tokens.start.used"
    chunked, drafts = one.has(left), one.has(used)
    mb_inv = lambda b, c: z3.And(b >= 0, b <= M, c >= 0)
    # the chunking's capacity, as the pass computes it (max_num_tokens less the batched tokens at the end)
    cap = _z3(one.start(left)) if chunked else None
    # the scan invariants at every turn's read and at the end (what the "scan" obligations prove)
    at_ends = [mb_inv(one.end(bt), one.end(cc))]
    at_reads = [mb_inv(b, c) for (b, _), (c, _) in zip(one.turns(bt), one.turns(cc))]
    af_final = z3.And(one.end(af), z3.Not(one.end(cc) > M - one.end(bt)))
    if chunked:
        at_ends.append(one.end(left) >= 0)
        at_reads += [t >= 0 for t, _ in one.turns(left)]
        if drafts:
            at_ends += [one.end(used) <= cap, one.env.taps[(used0, None)][0][1] == cap - one.end(left)]
            at_reads += [t <= cap for t, _ in one.turns(used)]
    # all_fit only ever turns false, so at the end it implies its value after each turn
    monotone = [z3.Implies(one.end(af), _z3(out)) for _, out in one.turns(af)]
    base = [*cons, *one.facts()]
    out = []

    def prove(action: str, name: str, facts: list, goal) -> None:
        t0 = time.monotonic()
        st = _status(_solver(timeout, *facts), _z3(goal))
        out.append((action, name, st, time.monotonic() - t0, ""))

    # scan: each loop's invariant from its start, kept by every turn
    prove("scan", "micro_batch start", base, mb_inv(_z3(one.start(bt)), _z3(one.start(cc))))
    for ((b, b2), (c, c2), (a, a2)) in zip(one.turns(bt), one.turns(cc), one.turns(af)):
        prove("scan", "micro_batch turn", base + [mb_inv(b, c)],
              z3.And(mb_inv(_z3(b2), _z3(c2)), z3.Implies(_z3(a2), a)))
    if chunked:
        prove("scan", "chunk_fcfs start", base + at_ends[:1], z3.And(cap >= 0, cap == M - one.end(bt)))
        for t, after in one.turns(left):
            prove("scan", "chunk_fcfs turn", base + [t >= 0], _z3(after) >= 0)
        if drafts:
            # used starts at the chunks' sum: per request, its chunk is what it took of `left`
            (t, after), = one.turns(left)
            prove("scan", "fit_draft_tokens start is the chunks' sum", base + [t >= 0],
                  _z3(one.env.taps[(used0, None)][0][0]) == t - after)
            prove("scan", "fit_draft_tokens start", base + at_ends,
                  one.env.taps[(used0, None)][0][1] <= cap)
            for t, after in one.turns(used):
                prove("scan", "fit_draft_tokens turn", base + at_ends + [t <= cap], _z3(after) <= cap)
    # bound: the request's tokens are at most its share
    share = one.delta(bt)
    if chunked:
        rest = one.delta(left) * -1 + (one.delta(used) if drafts else 0)
        share = share + z3.If(af_final, one.delta(cc), rest)
    prove("bound", "tokens <= share", base + at_reads + at_ends + monotone,
          z3.And(one.record.tokens[0] >= 0, one.record.tokens[0] <= share))
    # sum: the shares telescope to end minus start, at most max_num_tokens
    total = one.end(bt) - one.start(bt)
    if chunked:
        rest = (cap - one.end(left)) + \
            ((one.end(used) - one.env.taps[(used0, None)][0][1]) if drafts else 0)
        total = total + z3.If(af_final, one.end(cc) - one.start(cc), rest)
    prove("sum", "shares <= max_num_tokens", [*cons, *at_ends], total <= M)
    return out


# the modules the step runs whose code could tell one request from all (`sealed.mode_blind`)
MODULES = ("model/symbolic/core.py", "model/symbolic/cores/trtllm_v1.py")


def sealed_parts(k: Knobs) -> list[tuple]:
    """The premises that make the one-slot step the step of any request among any number
    (checkers/parametric/sealed.py): the core runs one code with or without an environment, and the
    request's step (fields, record, what its turns hand on, the loops' first values) is the same terms
    at every layout up to the structure bound as alone, with every other request a phantom."""
    out = [premise(MODULES)]
    build = lambda before, after: _Step(k, "sealed", (), before, after).outputs()   # noqa: E731
    t0 = time.monotonic()
    bound, by = structure_bound(lambda kk: _Step(kk, "bound", (), 1, 1).outputs(), k)
    if bound > MAX_BOUND:
        out.append(("sealed", "the same step at every place", "failed", time.monotonic() - t0,
                    f"the step computes with {bound - 2} ({by}): layouts up to {MAX_BOUND} requests cannot reach it"))
        return out
    st, why = uniform(build, bound)
    out.append(("sealed", f"the same step among up to {bound} requests before and after it (past {by})", st,
                time.monotonic() - t0, why))
    return out


# What keeps the MAX_UTILIZATION claim below "any number": its loop's outcome reaches the request through
# `capacity_outcome` as any outcome of the shape, and that shape is proved for every n only on a model of the
# loop over arrays (`capacity_shape_any_n`), a second definition checked against the core's own loop for
# n = 1..5 (`capacity_shape`), not by construction.
CAPACITY_OPEN = ("the capacity outcome's shape is checked on the core's loop only for n = 1..5; for every n it is "
                 "proved on a model of the loop over arrays, not on the core's code")


def covers(design, prop: str) -> Optional[str]:
    """Why this argument does not apply to a claim, or None."""
    if design.policy != "trtllm_v1":
        return "the one-request argument covers trtllm_v1 only"
    if prop != "SAFE-BUDGET":
        return "the one-request argument proves SAFE-BUDGET only"
    if design.options.enable_block_reuse:
        return "with block reuse the cache entries are shared between requests (not one request's state)"
    return None


def for_each_n(action: str, up_to: int, check, left) -> list[tuple]:
    """`check(n, seconds left)` -> (status, reason) for n = 1..up_to, as argument parts."""
    out = []
    for n in range(1, up_to + 1):
        t0 = time.monotonic()
        st, why = check(n, left())
        out.append((action, f"n={n}", st, time.monotonic() - t0, why))
    return out


def argument(design, k: Knobs, cons: list, timeout: float, refine_up_to: int = 3,
             shape_up_to: int = 5) -> list[tuple]:
    """The whole argument for one claim, each part as (action, name, status, seconds, reason)."""
    why = covers(design, "SAFE-BUDGET")
    if why:
        return [("refines", "applies", "failed", 0.0, why)]
    deadline = clock.now() + timeout
    left = lambda: max(0.001, clock.until(deadline))
    out = sealed_parts(k)
    out += for_each_n("refines", refine_up_to, lambda n, t: refines(k, cons, n, t), left)
    if design.options.capacity_scheduler_policy != GNE:   # GNE's loops are read through the environment
        out += for_each_n("capacity", shape_up_to, lambda n, t: capacity_shape(k, cons, n, t), left)
        out += capacity_shape_any_n(left())
        out.append(("capacity", "the core's loop for every n", "open", 0.0, CAPACITY_OPEN))
    out += local_invariants(k, cons, left())
    out += budget(k, cons, left())
    return out
