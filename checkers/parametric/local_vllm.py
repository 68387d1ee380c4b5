"""Any number of requests, one request at a time, for vLLM V1 (FCFS; prefix caching off, or on
for requests in no prefix group): the step of one request with the others as an environment, and
progress from two distinguished requests (the heads of `running` and `waiting`).

The vllm_v1 core's pass (model/symbolic/cores/vllm_v1.py `_Pass`) is two loops over queue
positions. Request i's turn in the running loop is at its position in `running`, and reads i and
the loop's running values (the two token budgets, whether the loop has stopped, the free blocks,
and what the requests after i would free if preempted, `above`); before its turn a turn of another
request may preempt it (FCFS takes victims from the current position on, so never after its own
turn). Its turn in the waiting loop reads whether the loop is still going, the budgets, the
running count and the free blocks. The pass's ranks (waiting after the pass, running after the
step) and its counts are values of the others too. The core names all of them (`_Pass.seen`,
`_Pass.at_turn`); with an `Environment` (`one_request`) each is a fresh term and each loop has one
turn, the request's own: `Core.step` on one slot is then the step of one request among any number.
`refines` checks it against the whole core for n = 1..3: with what the n-slot pass read at slot
i's turns (`Recorder`, selected by slot i's position: `Replay`), the one-slot step gives slot i
exactly the n-slot step's fields and record entries; leaving a running value to the one slot
(`Replay.skip`) fails it.

On it, for every n:
- "local": per-request invariants P (the core's and the claim's, at one slot): true at the start
  and kept by the one request's step whatever the environment gives, so true at every request of
  every reachable state;
- "progress": a request at the head of `running` is scheduled, given what the first turn of the
  running loop reads (the budgets at their start, the loop not stopped, no earlier turn to preempt
  it, and the free blocks plus what the others hold summing to the pool: `head_env`); with
  `running` empty, the head of `waiting` is admitted, given the first turn of the waiting loop
  (nothing preempted, the budgets at their start, no request running, the pool free).
Why the heads' environments are those: turns at positions where no request stands change nothing
(their code for any n), so the first turn reads the loop's start values; the free blocks and the
pages held sum to the pool (every write of the free count moves blocks to or from one request:
`take`, `preempt`, `Core.release`), a request out of `running` holds nothing (P), and the head's
`above` sums every other running request's pages (positions are distinct: each step re-ranks them
by distinct keys). `head_env` checks these facts on the core for n = 1..4, from the core's and the
claim's invariants; `concrete_disagreement` checks them, and the refinement, on every state of a
concrete run with any number of requests.
Then a quiet state with work unfinished has a request in `running` or `waiting` (P), so the step
schedules one: LIVE-NO-PROGRESS is unreachable for every n.

With prefix caching the others' allocations evict from the queue front, which may shrink the
request's own cached run (`oc`): the one way another request's turn changes it. The core names the
run at the request's waiting turn and after the loops, and its queue rank after the step; the
environment promises only that a run shrinks (`SHRINKS`), and `refines` checks that promise of
every recorded read. Shared prefixes are refused (`no_shared_prefix`). docs/symbolic.md, "vLLM V1, one
request at a time".
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.symbolic.core import CORES
from model.symbolic.cores.vllm_v1 import start_budgets
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import DECODING, PREEMPTED, PREFILLING, WAITING, Knobs, Params, SlotState, unfinished
from properties.symbolic import quiet

from .. import clock
from ..encode import fresh_state
from ..induction import workload_constraints
from .local import (SYM, _fresh_like, _solver, _status, _z3, differing_slot, for_each_n, fresh_params,
                    same_for_every_slot, slot_differences)
from .sealed import premise

# the core's per-request invariants the argument keeps (model/symbolic/core.py `invariants`,
# VllmV1Core.core_invariants), at one slot
LOCAL_INVARIANTS = ("fields", "live-owes-tokens", "pending-holds-nothing", "done-holds-nothing", "decode-cursor",
                    "context-cursor", "queues", "queued-holds-nothing")
# ... with prefix caching (no shared prefixes: checkers/parametric/local_vllm.py `no_shared_prefix`),
# what the pool keeps of one request
POOL_INVARIANTS = ("pool-fields", "pool-idle", "own-run-in-reach")
# values of the others that are counts or ranks (`ops.count`, `_ranks`): never negative
COUNTS = ("pass.eligible", "waiting.num_running", "waiting.rank_after", "running.rank_after", "pool.rank_after")
# what is left of the request's own cached run after the others' allocations: between none and what
# it alone would have (evictions only take blocks). The first is read at its turn in the waiting loop
# (only a request queued when the loop starts has one: `Replay` checks the bound there), the second
# once the loops are over.
SHRINKS = {"waiting.oc": "waiting", "pool.oc_after": None}
# a workload field the argument fixes with prefix caching: in no prefix group (the core reads
# prefix_group only as `prefix_group >= 0` and, for two members, their equality)
NO_GROUP = {"prefix_group": -1}


# the modules the step runs whose code could tell one request from all (`sealed.mode_blind`)
MODULES = ("model/symbolic/core.py", "model/symbolic/cores/vllm_v1.py")


class Recorder:
    """The whole core's pass, unchanged, with what each turn read noted per loop and position, each
    slot's position in each loop, and each slot's other reads."""
    one_request = False

    def __init__(self):
        self.taps, self.turns, self.at, self.member = {}, {}, {}, {}

    def seen(self, name: str, value, i):
        self.taps[(name, i)] = value
        return value

    def turn(self, name: str, pos: int, value):
        self.turns.setdefault(name, {})[pos] = value
        return value

    def positions(self, loop: str, pos: list, member: Optional[list] = None) -> None:
        """Each slot's position in `loop`; `member`: whether it is in the loop's queue at all."""
        self.at[loop] = list(pos)
        if member is not None:
            self.member[loop] = list(member)


class Environment:
    """The other requests, unknown: each value read of them a fresh term (counts and ranks not
    negative: `facts`). The vllm_v1 core raises no error (nothing in it calls `raise_error`), so a
    `step.error` that is the constant False for the one request is False for any other too."""
    one_request = True
    counts = COUNTS

    def __init__(self, tag: str = "env"):
        self.tag, self.taps, self.turns, self.facts, self.count = tag, {}, {}, [], 0

    def _fresh(self, name: str, value):
        self.count += 1
        term = _fresh_like(f"{self.tag}.{name}.{self.count}", value)
        if name in self.counts:
            self.facts.append(term >= 0)
        if name in SHRINKS:
            self.facts.append(z3.And(term >= 0, term <= value))
        return term

    def seen(self, name: str, value, i):
        if name == "step.error" and value is False:
            return False
        term = self._fresh(name, value)
        self.taps[name] = (value, term)
        return term

    def turn(self, name: str, pos: int, value):
        term = self._fresh(name, value)
        self.turns[name] = (value, term)
        return term


class Replay:
    """Slot `i` of a recorded pass: each turn's values those the n-slot pass read at slot i's
    position in that loop. `skip` names values left to the one slot (a deliberately unsound view)."""
    one_request = True

    def __init__(self, rec: Recorder, i: int, skip: tuple[str, ...] = ()):
        self.rec, self.i, self.skip = rec, i, skip
        # SHRINKS' promise, per read: the recorded value lies between 0 and the one slot's own
        self.promises: list = []

    def seen(self, name: str, value, i):
        if name in self.skip:
            return value
        return self._kept(name, value, self.rec.taps[(name, self.i if i is not None else None)])

    def turn(self, name: str, pos: int, value):
        if name in self.skip:
            return value
        at = self.rec.at[name.split(".")[0]][self.i]
        by_pos = sorted(self.rec.turns[name].items())
        if not z3.is_expr(at):   # a concrete pass: the turn at its position (none: it has no turn)
            out = dict(by_pos).get(at, by_pos[-1][1])
        else:
            out = _z3(by_pos[-1][1])
            for p, v in reversed(by_pos[:-1]):
                out = z3.If(at == p, _z3(v), out)
        return self._kept(name, value, out)

    def _kept(self, name: str, own, recorded):
        """A SHRINKS read: the recorded value where the slot has the read (its own where it has
        none: the step then does not use it), with the promise noted."""
        if name not in SHRINKS:
            return recorded
        loop = SHRINKS[name]
        has = True if loop is None else self.rec.member[loop][self.i]
        ops = SYM if any(z3.is_expr(v) for v in (has, own, recorded)) else CONCRETE
        self.promises.append(ops.implies(has, ops.and_(recorded >= 0, recorded <= own)))
        return recorded if has is True else ops.ite(has, recorded, own)


def _replays(skip: tuple[str, ...]) -> tuple[Callable, Callable]:
    """A `Replay` factory for `slot_differences` / `differing_slot`, and the promises (SHRINKS) the
    replays it made noted."""
    made = []

    def replay(rec: Recorder, i: int) -> Replay:
        made.append(Replay(rec, i, skip))
        return made[-1]
    return replay, lambda: [c for r in made for c in r.promises]


# -- what the argument keeps of each request ------------------------------------------------------
def _caching(k: Knobs) -> bool:
    return bool(k.options.enable_prefix_caching)


def _pin(k: Knobs) -> Optional[dict]:
    """The workload fields the argument fixes: with prefix caching, no prefix group."""
    return NO_GROUP if _caching(k) else None


def local_names(k: Knobs) -> tuple:
    """The core's per-request invariants the argument keeps for this design."""
    return LOCAL_INVARIANTS + (POOL_INVARIANTS if _caching(k) else ())


def _local(core, ops, k: Knobs, p: Params, s: SlotState, invariants: Optional[Callable], i: int = 0,
           names=None) -> dict:
    """P at slot i: the core's per-request invariants `names` (default `local_names`), no pool
    entry (prefix caching off), no host blocks (vLLM has no host tier: the base release that clears
    them is not the pool's), the engine alive (it never raises), and the claim's per-request
    invariants."""
    inv = core.invariants(ops, k, p, s)
    out = {name: inv[name] for name in (f"r{i}.{x}" for x in (local_names(k) if names is None else names))}
    out[f"r{i}.no-host-blocks"] = s.req[i]["host_blocks"] == 0
    if not _caching(k):
        out[f"r{i}.no-pool"] = ops.and_(*[s.req[i][f] == e for f, e in core.absent_req_extra(i).items()
                                          if f not in ("wpos", "rpos")])
    out["alive"] = ops.not_(s.g["error"])
    if invariants is not None:
        out.update({name: c for name, c in invariants(ops, k, p, s).items() if name.startswith(f"r{i}.")})
    return out


# -- the abstraction against the whole core ------------------------------------------------------
def refines(k: Knobs, cons: list, n: int, timeout: float, skip: tuple[str, ...] = ()) -> tuple[str, str]:
    """For n slots, every reachable pre-state (the core's invariants) and every slot i: the one-slot
    step with slot i's recorded reads gives slot i the n-slot step's fields and record entries."""
    core = CORES["vllm_v1"]
    replay, promises = _replays(skip)
    pre, params, differ = slot_differences(core, k, n, Recorder(), replay, _pin(k))
    # ... and what the environment promises of a read (SHRINKS) holds of the recorded one
    differ += [z3.Not(_z3(c)) for c in promises() if c is not True]
    reachable = [c for c in core.invariants(SYM, k, params, pre).values() if c is not True]
    return same_for_every_slot(_solver(timeout, *cons, *workload_constraints(params), *reachable), differ)


def _running(r):
    return z3.Or(r["phase"] == PREFILLING, r["phase"] == DECODING)


def _queued(r):
    return z3.Or(r["phase"] == WAITING, r["phase"] == PREEMPTED)


def running_head_reads(k: Knobs, turn: Callable, seen: Callable, blocks) -> list[tuple]:
    """What the head of `running` reads, as (read, value at the loop's start) pairs: both budgets,
    the loop not stopped, not preempted by an earlier turn, and its free count, its `above` and its
    own pages summing to the pool. `turn(name)` / `seen(name)`: its turn's value / its other read."""
    T, M = start_budgets(k)
    return [(turn("running.token_budget"), T), (turn("running.input_budget"), M), (turn("running.stopped"), False),
            (seen("running.preempted_before"), False),
            (turn("running.free") + turn("running.above") + blocks, k.num_blocks)]


def waiting_head_reads(k: Knobs, turn: Callable, seen: Callable) -> list[tuple]:
    """What the head of `waiting` reads with `running` empty, as (read, value) pairs: the loop runs
    (nothing preempted) and is going, both budgets at their start, no request running, the pool free."""
    T, M = start_budgets(k)
    return [(seen("running.any_preempted"), False), (turn("waiting.going"), True), (turn("waiting.token_budget"), T),
            (turn("waiting.input_budget"), M), (turn("waiting.num_running"), 0), (turn("waiting.free"), k.num_blocks)]


def _recorded(rec: Recorder, i: int) -> tuple[Callable, Callable]:
    """Slot i's turn values and other reads in a recorded pass, by name."""
    replay = Replay(rec, i)
    return (lambda name: replay.turn(name, 0, None),
            lambda name: rec.taps[(name, None if name == "running.any_preempted" else i)])


def head_env(k: Knobs, cons: list, n: int, timeout: float, invariants: Optional[Callable] = None) -> tuple[str, str]:
    """On the core for n slots, from its invariants: what the head of `running` (least position)
    reads at its turn is the loop's start (budgets, not stopped, not preempted before) and its
    free count plus its `above` plus its own pages is the pool; with `running` empty, what the
    head of `waiting` reads at its turn is the start (going, budgets, no request running) with the
    whole pool free. `invariants`: the claim's, proved for these n by the slot induction."""
    core = CORES["vllm_v1"]
    pre, params = fresh_state(core, n, "pre"), fresh_params(n, pin=_pin(k))
    rec = Recorder()
    core.step(SYM, k, params, pre, env=rec)
    holds = lambda pairs: z3.And(*[_z3(read) == value for read, value in pairs])
    live = [params.slots[j]["present"] for j in range(n)]
    calm = quiet(SYM, params, pre)
    none_running = z3.Not(z3.Or(*[z3.And(live[j], _running(pre.req[j])) for j in range(n)]))
    bad = []
    for i in range(n):
        turn, seen = _recorded(rec, i)
        r = pre.req[i]
        head = z3.And(calm, live[i], _running(r),
                      *[z3.Implies(z3.And(live[j], _running(pre.req[j])), r["rpos"] <= pre.req[j]["rpos"])
                        for j in range(n) if j != i])
        bad.append(z3.And(head, z3.Not(holds(running_head_reads(k, turn, seen, r["blocks"])))))
        whead = z3.And(calm, none_running, live[i], _queued(r),
                       *[z3.Implies(z3.And(live[j], _queued(pre.req[j])), r["wpos"] <= pre.req[j]["wpos"])
                         for j in range(n) if j != i])
        bad.append(z3.And(whead, z3.Not(holds(waiting_head_reads(k, turn, seen)))))
    reachable = [c for c in core.invariants(SYM, k, params, pre).values() if c is not True]
    if invariants is not None:
        reachable += [c for c in invariants(SYM, k, params, pre).values() if c is not True]
    solver = _solver(timeout, *cons, *workload_constraints(params), *reachable)
    r = solver.check(z3.Or(*bad))
    if r == z3.unsat:
        return "proved", ""
    return ("failed", "a head reads other than the loop's start") if r == z3.sat else \
        ("unknown", solver.reason_unknown())


def concrete_disagreement(cfg, workload, skip: tuple[str, ...] = (), max_steps: int = 400) -> Optional[str]:
    """The abstraction and the heads' environments beyond the n the solver checks: on every state of
    one concrete run of the core (as many requests as the workload has), each slot's one-request
    step with its recorded reads is the n-slot step's, and at a quiet state the head of `running`
    (or, none running, of `waiting`) reads what `progress` assumes. None, or the first difference."""
    core = CORES["vllm_v1"]
    k, p = Knobs.of(cfg), Params.of(workload)
    for s in run_core(core, k, p, max_steps).states[:-1]:
        rec = Recorder()
        replay, promises = _replays(skip)
        i = differing_slot(core, k, p, s, rec, replay)
        if i is not None:
            return f"step {s.g['step']}, slot {i}: the one-request step differs from the core's"
        if not all(promises()):
            return f"step {s.g['step']}: a request's cached run grew behind its back"
        if not quiet(CONCRETE, p, s):
            continue
        live = [i for i, w in enumerate(p.slots) if w["present"]]
        running = [i for i in live if s.req[i]["phase"] in (PREFILLING, DECODING)]
        queued = [i for i in live if s.req[i]["phase"] in (WAITING, PREEMPTED)]
        if running:
            h = min(running, key=lambda i: s.req[i]["rpos"])
            pairs, which = running_head_reads(k, *_recorded(rec, h), s.req[h]["blocks"]), "running"
        elif queued:
            h = min(queued, key=lambda i: s.req[i]["wpos"])
            pairs, which = waiting_head_reads(k, *_recorded(rec, h)), "waiting"
        else:
            continue
        if any(read != value for read, value in pairs):
            return f"step {s.g['step']}: the head of {which}, slot {h}, reads {[read for read, _ in pairs]}"
    return None


# -- the argument on the one-request step (shared with local_sglang.py) ----------------------------
class OneStep:
    """One request's step from a fresh pre-state with the environment `env`. `P(p, s)`: the
    per-request invariants the argument keeps, at the one slot."""

    def __init__(self, core, k: Knobs, P: Callable, workload: Optional[Callable], env, tag: str = "one",
                 pin: Optional[dict] = None):
        self.core, self.k, self.P, self.workload, self.env = core, k, P, workload, env
        self.p = fresh_params(1, f"{tag}.w", pin)
        self.pre = fresh_state(core, 1, f"{tag}.pre")
        self.post, self.record = core.step(SYM, k, self.p, self.pre, env=env)

    def facts(self) -> list:
        """The request is one of the n present, in the claim's class; it satisfies P before the step;
        what the environment gives is a count where the core counts."""
        out = [*workload_constraints(self.p), self.p.slots[0]["present"], *self.env.facts]
        if self.workload is not None:
            out += self.workload(SYM, self.k, self.p)
        return out + list(self.P(self.p, self.pre).values())

    def read(self, name: str):
        """The term the environment gave for `name` (a turn's value or another read)."""
        return (self.env.turns.get(name) or self.env.taps[name])[1]


def keeps(core, k: Knobs, cons: list, timeout: float, P: Callable, workload: Optional[Callable], env,
          pin: Optional[dict] = None) -> list[tuple]:
    """P at the start, and kept by one request's step whatever the others (`env`) do."""
    out = []
    p = fresh_params(1, "init.w", pin)
    init = core.initial(SYM, k, p)
    base = [*cons, *workload_constraints(p)] + (workload(SYM, k, p) if workload is not None else [])
    for name, goal in P(p, init).items():
        t0 = time.monotonic()
        st = _status(_solver(timeout, *base), _z3(goal))
        out.append(("local", f"init {name}", st, time.monotonic() - t0, ""))
    one = OneStep(core, k, P, workload, env, pin=pin)
    solver = _solver(timeout, *cons, *one.facts())
    for name, goal in P(one.p, one.post).items():
        t0 = time.monotonic()
        st = _status(solver, _z3(goal))
        out.append(("local", f"step {name}", st, time.monotonic() - t0, ""))
    return out


def _P(k: Knobs, invariants: Optional[Callable], names) -> Callable:
    return lambda p, s: _local(CORES["vllm_v1"], SYM, k, p, s, invariants, names=names)


def local_invariants(k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
                     workload: Optional[Callable] = None, names=None) -> list[tuple]:
    """P at the start, and kept by one request's step whatever the others do."""
    return keeps(CORES["vllm_v1"], k, cons, timeout, _P(k, invariants, names), workload, Environment("one.env"),
                 _pin(k))


def progress(k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
             workload: Optional[Callable] = None, names=None) -> list[tuple]:
    """The head of `running`, and with `running` empty the head of `waiting`, is scheduled in a
    quiet step, given what the first turn of its loop reads (`head_env`)."""
    one = OneStep(CORES["vllm_v1"], k, _P(k, invariants, names), workload, Environment("one.env"), pin=_pin(k))
    r = one.pre.req[0]
    base = [*cons, *one.facts(), quiet(SYM, one.p, one.pre)]
    assume = lambda pairs: [read == value for read, value in pairs]
    running_head = [_running(r), *assume(running_head_reads(k, one.read, one.read, r["blocks"]))]
    waiting_head = [_queued(r), *assume(waiting_head_reads(k, one.read, one.read))]
    present = one.p.slots[0]["present"]
    obligations = [
        # what the heads' environments rest on, at every request: a quiet state's unfinished work is
        # in a queue, and only `running` holds blocks
        ("unfinished work is queued or running", [], z3.Implies(unfinished(SYM, r["phase"]),
                                                                  z3.Or(_running(r), _queued(r)))),
        ("only running requests hold blocks", [], z3.Implies(z3.Not(z3.And(present, _running(r))),
                                                             r["blocks"] == 0)),
        ("head of running scheduled", running_head, one.record.flags["scheduled"][0]),
        ("head of waiting scheduled", waiting_head, one.record.flags["scheduled"][0]),
    ]
    out = []
    for name, facts, goal in obligations:
        t0 = time.monotonic()
        st = _status(_solver(timeout, *base, *facts), goal)
        out.append(("progress", name, st, time.monotonic() - t0, ""))
    return out


def no_shared_prefix(k: Knobs, cons: list, workload: Optional[Callable], timeout: float) -> tuple[str, str]:
    """With prefix caching the argument covers requests in no prefix group only (a shared block is
    held and cached for several requests at once, and its copies live in other requests' slots):
    the claim's workload class must say so, for any request."""
    p = fresh_params(1, "np.w")
    facts = [*workload_constraints(p)] + (workload(SYM, k, p) if workload is not None else [])
    st = _status(_solver(timeout, *cons, *facts), p.slots[0]["prefix_group"] < 0)
    return st, "" if st == "proved" else "the claim's workloads may share a prefix"


def covers(design, prop: str) -> Optional[str]:
    """Why this argument does not apply to a claim, or None."""
    o = design.options
    if design.policy != "vllm_v1":
        return "the vLLM one-request argument covers vllm_v1 only"
    if prop != "LIVE-NO-PROGRESS":
        return "the vLLM one-request argument proves LIVE-NO-PROGRESS only"
    if o.policy != "fcfs":
        return "under PRIORITY a turn's victims come from anywhere in the list, after the request's own turn too"
    if o.async_scheduling:
        return ("async scheduling (vLLM's default loop): the one-request view covers the synchronous Scheduler only "
                "(a request's step under the batch queue reads its in-flight batch; the core refuses an environment "
                "there)")
    return None


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
    deadline = clock.now() + timeout
    left = lambda: max(0.001, clock.until(deadline))
    out = []
    if _caching(k):
        t0 = time.monotonic()
        st, why = no_shared_prefix(k, cons, workload, left())
        out.append(("applies", "no shared prefix", st, time.monotonic() - t0, why))
        if st != "proved":
            return out
    out += for_each_n("refines", refine_up_to, lambda n, t: refines(k, cons, n, t), left)
    out += for_each_n("heads", heads_up_to, lambda n, t: head_env(k, cons, n, t, invariants), left)
    out += local_invariants(k, cons, left(), invariants, workload)
    out += progress(k, cons, left(), invariants, workload)
    return out
