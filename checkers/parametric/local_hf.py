"""Any number of requests, one request at a time, for transformers continuous batching: the step of
one request with the others as an environment, and the engine's fatal error ruled out from three
distinguished requests (`hf-fits-alone-no-fatal`, `-prefill-first`: every request fits the cache alone).

The hf_cb core's pass (model/symbolic/cores/hf_cb.py `_Pass`) is closed forms over all requests: the
first call of `schedule_batch` when it returns None (`probe`), the offload after it, the scheduling
call's loop over candidate positions, and the offload after a batch with starved requests left. The
core names every value of the others that a request's own step reads (`Plan.seen`, `Plan.at_turn`):
- the pass: whether another request is pending (`pass.pending`), fits or fails the first call
  (`probe.fits`, `probe.fails`), is offloaded (`offload1.off`), is a candidate of the second call or
  fits it (`second.again`, `second.fits`); the free counts (`probe.free`, `offload1.free`) and whether
  the offload's eviction freed anything (`*.evicted`);
- each call: the margin test (`*.in_margin`), `block_new_requests` (`*.block_new`), the request's
  candidate position (`*.pos`), its group's existing prefix blocks, E (`*.E`: kept in the group's home
  slot);
- each offload, what the request's own test reads: the active requests left with every newer starved
  one popped (`*.active_left`), the older starved ones' needs (`*.older_need`), the free blocks with the
  popped ones' (`*.room`); and in a group's home slot the count the eviction and the release leave
  (`*.pc`, `*.pc_kept`);
- the scheduling loop, at the request's turn (one per candidate position): whether the loop has
  stopped, whether anything was scheduled, the three budgets and the free count (`batch1.*` when the
  first call schedules, `batch2.*` after it returned None); after it, whether another request was
  scheduled or starved, and the others' tokens;
- after the pass and the step: the request's ranks in `active_requests` and the waiting queue, a home
  slot's count after the batch's hashing (`hash.pc`).
The pass's decisions (the first call returns None, the fatal error, each call's crash) the one request
makes itself from its own values and those reads (`Plan.decided`), and the core notes what the
argument picks requests out by (`Plan.note`: starved, failed, offloaded, scheduled, the pages held,
what a turn hands on). With no environment each hook returns its input, so the core is as before (the
differential tests cover it). With an `Environment` each read is a fresh term and the scheduling loop
has one turn, the request's own: `Core.step` on one slot is then the step of one request among any
number. `refines` checks it against the whole core for n = 1..3 (`Recorder`, `Replay`): with slot i's
recorded reads the one-slot step gives slot i the n-slot step's fields and record entries and makes
each decision as the n-slot step does; leaving a read to the one slot (`Replay.skip`) fails it.

On it, for every n:
- "scan": in each scheduling loop, "not stopped, every budget has one left" holds at the start and is
  handed on by any request's turn;
- "local": per-request invariants P, true at the start and kept by the one request's step whatever the
  others give, in a step that raises no error;
- "no-error": from a state where every request has P, the step raises no error. If the first call
  returns None with a request starved, the newest starved request the offload keeps decides against
  the fatal error, given its facts (`distinguished`: its room is the free count the offload leaves;
  with nothing evicted or offloaded, the count the first call measured; alone, the pool less its
  pages); with none starved, a request that failed the first call does (the offload leaves the pool
  free, and a short pool had blocks to evict); and a request a call scheduled decides against the
  crash (it has a token).
`heads` checks on the core for n = 1..4 that the distinguished requests' facts hold and that some state
picks out each; `concrete_disagreement` checks the refinement, the decisions and the facts on every
state of concrete runs with any number of requests. docs/symbolic.md, "transformers, one request at a
time".
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.symbolic.core import CORES
from model.symbolic.run import CONCRETE, run_core
from model.symbolic.slots import Knobs, Params, SlotState

from .. import clock
from ..encode import fresh_state
from ..induction import workload_constraints
from . import local_vllm
from .local import (_solver, _status, _z3, differing_slot, for_each_n, fresh_params, same_for_every_slot,
                    slot_differences)
from .local_vllm import OneStep, keeps
from .sealed import premise

SYM = local_vllm.SYM
CORE = "hf_cb"
CALLS = ("probe", "batch1", "batch2")
LOOPS = ("batch1", "batch2")
# values of the others the argument needs not negative (each is needed, tests/symbolic/
# test_parametric_local_hf.py): the candidate positions and the ranks (a request keeps its queue
# place), the others' tokens (the crash), the older starved requests' needs and the free count the
# first offload leaves (the fatal error)
COUNTS = (tuple(f"{c}.pos" for c in CALLS) + ("pass.act_rank", "pass.wait_rank", "after.act_rank") +
          tuple(f"{c}.tokens" for c in LOOPS) + ("offload1.older_need", "offload1.free"))
# the scheduling loop's budgets: while the loop goes on each has at least one left (`scan`)
BUDGETS = ("token_budget", "read_budget", "request_budget")
# the core's per-request invariants the argument keeps (model/symbolic/core.py `invariants`), at one slot;
# the hf core's own (`HfCbCore.core_invariants`) relate a request to others (queue lengths, its group's
# count in another slot), so `_local` keeps their parts about the request alone
LOCAL_INVARIANTS = ("fields", "live-owes-tokens", "pending-holds-nothing", "decode-cursor", "context-cursor")


# the modules the step runs whose code could tell one request from all (`sealed.mode_blind`)
MODULES = ("model/symbolic/core.py", "model/symbolic/cores/hf_cb.py")


class Recorder(local_vllm.Recorder):
    """The whole core's pass with its reads noted (local_vllm.Recorder), and each slot's own values
    the argument picks requests out by (`notes`) and the pass's decisions."""

    def __init__(self):
        super().__init__()
        self.notes = {}

    def note(self, name: str, value, i) -> None:
        self.notes[(name, i)] = value

    def decided(self, name: str, value):
        self.taps[(name, None)] = value
        return value


class Environment(local_vllm.Environment):
    """The other requests, unknown: each value read of them a fresh term (those in COUNTS not
    negative). The pass's decisions are the one request's own (`decided`, as its notes).
    The step raises no error (`step.error` False): what `no_error` proves of every step of a state
    where every request has P, so P is kept along runs whose steps do not raise."""
    counts = COUNTS

    def __init__(self, tag: str = "env"):
        super().__init__(tag)
        self.notes = {}

    def seen(self, name: str, value, i):
        if name == "step.error":
            return False
        return super().seen(name, value, i)

    def turn(self, name: str, pos: int, value):
        """A turn's running value; a loop not stopped has every budget left (`scan`)."""
        term = super().turn(name, pos, value)
        loop, var = name.rsplit(".", 1)
        if var in BUDGETS:
            self.facts.append(z3.Implies(z3.Not(self.turns[f"{loop}.stopped"][1]), term >= 1))
        return term

    def note(self, name: str, value, i) -> None:
        self.notes[name] = value

    def decided(self, name: str, value):
        self.taps[name] = (value, value)
        return value


class Replay(local_vllm.Replay):
    """Slot i of a recorded pass (local_vllm.Replay). The pass's decisions and the engine's error: the
    one-slot step decides each from its own values and its reads, and must decide it as the n-slot
    step did (noted in `promises`); it then goes on with the recorded one."""

    def note(self, name: str, value, i) -> None:
        pass

    def decided(self, name: str, value):
        return self._same(name, value, self.rec.taps[(name, None)])

    def seen(self, name: str, value, i):
        recorded = super().seen(name, value, i)
        return self._same(name, value, recorded) if name == "step.error" else recorded

    def _same(self, name: str, own, recorded):
        if name in self.skip:
            return own
        ops = SYM if any(z3.is_expr(v) for v in (own, recorded)) else CONCRETE
        self.promises.append(ops.eq(_z3(own) if ops is SYM else own, recorded))
        return recorded


def _replays(skip: tuple[str, ...]) -> tuple[Callable, Callable]:
    """A `Replay` factory, and the promises the replays it made noted."""
    made = []

    def replay(rec: Recorder, i: int) -> Replay:
        made.append(Replay(rec, i, skip))
        return made[-1]
    return replay, lambda: [c for r in made for c in r.promises]


# -- what the argument keeps of each request ------------------------------------------------------
def _local(ops, k: Knobs, p: Params, s: SlotState, i: int = 0, names=LOCAL_INVARIANTS) -> dict:
    """P at slot i: the core's per-request invariants `names`, and of the hf core's own what holds of
    the request alone (`HfCbCore.alone_invariants`)."""
    core = CORES[CORE]
    inv = core.invariants(ops, k, p, s)
    return {**{name: inv[name] for name in (f"r{i}.{x}" for x in names)}, **core.alone_invariants(ops, k, p, s, i)}


# -- the abstraction against the whole core ------------------------------------------------------
def refines(k: Knobs, cons: list, n: int, timeout: float, skip: tuple[str, ...] = ()) -> tuple[str, str]:
    """For n slots, every reachable pre-state (the core's invariants) and every slot i: the one-slot
    step with slot i's recorded reads gives slot i the n-slot step's fields and record entries, and
    makes the pass's decisions as the n-slot step does."""
    core = CORES[CORE]
    replay, promises = _replays(skip)
    pre, params, differ = slot_differences(core, k, n, Recorder(), replay)
    differ += [z3.Not(_z3(c)) for c in promises() if c is not True]
    reachable = [c for c in core.invariants(SYM, k, params, pre).values() if c is not True]
    return same_for_every_slot(_solver(timeout, *cons, *workload_constraints(params), *reachable), differ)


# -- the distinguished requests ------------------------------------------------------------------
def distinguished(ops, k: Knobs, rec: Recorder, n: int) -> list[tuple]:
    """On a recorded n-slot pass: (what, condition, fact) per slot and kind, and the existence of the
    newest starved request the first offload keeps. The kinds:
    - "kept": the first call returned None, the request is starved and not offloaded, and every
      starved request newer than it is: its room is the free count the offload leaves; with nothing
      evicted or offloaded that is the free count the first call measured against; with one active
      request left (itself), it is the pool less its pages;
    - "failed": the first call returned None with no request starved, and this one failed its
      allocation: no other request is offloaded, the offload leaves the whole pool free, and a pool
      the first call found short had cached blocks to evict."""
    note = lambda name, i: rec.notes[(name, i)]
    read = lambda name, i=None: rec.taps[(name, i)]
    none1 = read("probe.none")
    if none1 is False:   # a concrete pass whose first call schedules: no offload, nothing picked out
        return []
    starved = [note("probe.starved", i) for i in range(n)]
    pos = [read("probe.pos", i) for i in range(n)]
    N = k.num_blocks
    out, kept = [], []
    for i in range(n):
        is_kept = ops.and_(none1, starved[i], ops.not_(note("offload1.off", i)),
                           *[ops.implies(ops.and_(starved[j], pos[j] > pos[i]), note("offload1.off", j))
                             for j in range(n) if j != i])
        kept.append(is_kept)
        free1 = read("offload1.free")
        out.append(("kept", is_kept, ops.and_(
            read("offload1.room", i) == free1,
            ops.implies(ops.and_(ops.not_(read("offload1.evicted")), ops.not_(read("offload1.off", i))),
                        free1 == read("probe.free")),
            ops.implies(read("offload1.active_left", i) <= 1, free1 == N - note("offload1.held", i)))))
        is_failed = ops.and_(none1, ops.not_(ops.or_(*starved)), note("probe.failed", i))
        out.append(("failed", is_failed, ops.and_(
            ops.not_(read("offload1.off", i)), free1 == N,
            ops.implies(read("probe.free") < N, read("offload1.evicted")))))
    out.append(("kept exists", ops.and_(none1, ops.or_(*starved)), ops.or_(*kept)))
    return out


def promised(ops, rec: Recorder) -> list[tuple]:
    """What the environment promises of its reads (`Environment`), as (what, condition) on a recorded
    pass: a count, rank or block count is not negative, and at each turn of a scheduling loop a loop not
    stopped has every budget left (`scan`)."""
    out = [(name, value >= 0) for (name, _), value in rec.taps.items() if name in COUNTS]
    for loop in LOOPS:
        for pos, stopped in rec.turns.get(f"{loop}.stopped", {}).items():
            out += [(f"{loop}.{b}", ops.implies(ops.not_(stopped), rec.turns[f"{loop}.{b}"][pos] >= 1))
                    for b in BUDGETS]
    return out


def heads(k: Knobs, cons: list, n: int, timeout: float, invariants: Optional[Callable] = None,
          workload: Optional[Callable] = None) -> tuple[str, str]:
    """On the core for n slots, from its invariants, the claim's, its class and P at every request,
    the engine alive: each distinguished request's facts hold, a kept one exists where needed, and every
    read satisfies what the environment promises of it (`promised`)."""
    core = CORES[CORE]
    pre, params = fresh_state(core, n, "pre"), fresh_params(n)
    rec = Recorder()
    core.step(SYM, k, params, pre, env=rec)
    facts = [c for c in core.invariants(SYM, k, params, pre).values() if c is not True]
    if invariants is not None:
        facts += [c for c in invariants(SYM, k, params, pre).values() if c is not True]
    if workload is not None:
        facts += workload(SYM, k, params)
    for i in range(n):
        facts += [c for c in _local(SYM, k, params, pre, i).values() if c is not True]
    kinds = distinguished(SYM, k, rec, n)
    bad = [z3.And(_z3(cond), z3.Not(_z3(fact))) for _, cond, fact in kinds]
    bad += [z3.Not(_z3(c)) for _, c in promised(SYM, rec) if c is not True]
    solver = _solver(timeout, *cons, *workload_constraints(params), *facts, z3.Not(pre.g["error"]))
    # a check no state meets proves nothing: some state must pick out a request of each kind (n >= 2)
    for what in ({"kept", "failed"} if n >= 2 else set()):
        if solver.check(z3.Or(*[_z3(c) for w, c, _ in kinds if w == what])) != z3.sat:
            return "failed", f"no state has a {what} request: the check would be vacuous"
    r = solver.check(z3.Or(*bad))
    if r == z3.unsat:
        return "proved", ""
    if r == z3.sat:
        m = solver.model()
        what = [w for (w, c, f) in distinguished(SYM, k, rec, n) if z3.is_true(m.eval(z3.And(_z3(c), z3.Not(_z3(f))),
                                                                                         model_completion=True))]
        what += [w for w, c in promised(SYM, rec) if z3.is_false(m.eval(_z3(c), model_completion=True))]
        return "failed", f"a distinguished request's fact, or a promise of the environment, does not hold: " \
                         f"{what[0] if what else '?'}"
    return "unknown", solver.reason_unknown()


def concrete_disagreement(cfg, workload, skip: tuple[str, ...] = (), max_steps: int = 400) -> Optional[str]:
    """The abstraction and the distinguished requests' facts beyond the n the solver checks: on every
    state of one concrete run of the core (as many requests as the workload has), each slot's
    one-request step with its recorded reads is the n-slot step's, its decisions alike, and every
    distinguished request's facts hold. None, or the first difference."""
    core = CORES[CORE]
    k, p = Knobs.of(cfg), Params.of(workload)
    for s in run_core(core, k, p, max_steps).states[:-1]:
        rec = Recorder()
        replay, promises = _replays(skip)
        try:
            i = differing_slot(core, k, p, s, rec, replay)
        except KeyError as e:   # an unsound view takes a way the n-slot step did not, reading what it never read
            return f"step {s.g['step']}: the one-request step reads {e.args[0]}, which the core's never read"
        if i is not None:
            return f"step {s.g['step']}, slot {i}: the one-request step differs from the core's"
        if not all(promises()):
            return f"step {s.g['step']}: a one-request step decides the pass otherwise"
        if s.g["error"]:
            continue
        for what, cond, fact in distinguished(CONCRETE, k, rec, len(s)):
            if cond and not fact:
                return f"step {s.g['step']}: a {what} request's fact does not hold"
        for what, holds in promised(CONCRETE, rec):
            if not holds:
                return f"step {s.g['step']}: the environment's promise about {what} does not hold"
    return None


# -- the argument on the one-request step ------------------------------------------------------
def _P(k: Knobs) -> Callable:
    return lambda p, s: _local(SYM, k, p, s)


def local_invariants(k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
                     workload: Optional[Callable] = None) -> list[tuple]:
    """P at the start, and kept by one request's step whatever the others do."""
    return keeps(CORES[CORE], k, cons, timeout, _P(k), workload, Environment("one.env"))


def scan(k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
         workload: Optional[Callable] = None) -> list[tuple]:
    """Each scheduling loop's invariant over its running values, "not stopped, every budget has one
    left": true of the loop's start (the budgets are max_batch_tokens, the requests per batch and the
    pool's tokens, each at least 1), and handed on by any request's turn that reads it. So it holds
    at every turn, for every n (a turn's running values are the last turn's handed on)."""
    one = OneStep(CORES[CORE], k, _P(k), workload, Environment("one.env"))
    start = z3.And(k.max_num_tokens >= 1, k.max_batch_size >= 1, k.num_blocks * k.block_size >= 1)
    t0 = time.monotonic()
    out = [("scan", "start: every budget at least 1", _status(_solver(timeout, *cons), start),
            time.monotonic() - t0, "")]
    for loop in LOOPS:
        h = one.env.notes[f"{loop}.handed"]
        goal = z3.Implies(z3.Not(_z3(h["stopped"])), z3.And(*[_z3(h[b]) >= 1 for b in BUDGETS]))
        t0 = time.monotonic()
        out.append(("scan", f"{loop}: a turn hands it on", _status(_solver(timeout, *cons, *one.facts()), goal),
                    time.monotonic() - t0, ""))
    return out


def no_error(k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
             workload: Optional[Callable] = None, drop: tuple[str, ...] = ()) -> list[tuple]:
    """Each distinguished request's own step, given its facts (`distinguished`), decides against the
    engine's error: the kept starved request and the failed one that the fatal error does not fire,
    a request a call scheduled that the call does not crash (it has a token: `scan`). `drop`: the
    obligations to ask without their last fact (a control: each then fails)."""
    one = OneStep(CORES[CORE], k, _P(k), workload, Environment("one.env"))
    env, N = one.env, k.num_blocks
    read = lambda name: env.taps[name][1] if name in env.taps else env.turns[name][1]
    base = [*cons, *one.facts(), z3.Not(one.pre.g["error"])]
    kept = [env.notes["probe.starved"], z3.Not(env.notes["offload1.off"]),
            read("offload1.room") == read("offload1.free"),
            z3.Implies(z3.And(z3.Not(read("offload1.evicted")), z3.Not(read("offload1.off"))),
                       read("offload1.free") == read("probe.free")),
            z3.Implies(read("offload1.active_left") <= 1, read("offload1.free") == N - env.notes["offload1.held"])]
    failed = [env.notes["probe.failed"], z3.Not(env.notes["probe.starved"]), z3.Not(read("offload1.off")),
              read("offload1.free") == N, z3.Implies(read("probe.free") < N, read("offload1.evicted"))]
    obligations = [("the kept starved request: no fatal error", kept, z3.Not(_z3(env.taps["offload1.dead"][0]))),
                   ("the failed request, none starved: no fatal error", failed,
                    z3.Not(_z3(env.taps["offload1.dead"][0])))]
    for loop in LOOPS:
        # (its turn's token budget is at least 1: the loop's scan invariant, which the environment promises)
        obligations.append((f"a request scheduled by {loop}: no crash", [env.notes[f"{loop}.mine"]],
                            z3.Not(_z3(env.taps[f"{loop}.crash"][0]))))
    out = []
    for name, facts, goal in obligations:
        if name in drop:
            facts = facts[:-1]   # a control: without its last fact the obligation must fail
        t0 = time.monotonic()
        solver = _solver(timeout, *base, *[_z3(f) for f in facts])
        vacuous = solver.check() != z3.sat   # facts no state meets would prove anything
        st = "failed" if vacuous else _status(solver, goal)
        out.append(("no-error", name, st, time.monotonic() - t0, "its facts are unsatisfiable" if vacuous else ""))
    return out


def covers(design, prop: str) -> Optional[str]:
    """Why this argument does not apply to a claim, or None."""
    if design.policy != CORE:
        return "the transformers one-request argument covers hf_cb only"
    if prop != "ENGINE-ERROR":
        return "the transformers one-request argument proves ENGINE-ERROR only"
    return None


def argument(design, k: Knobs, cons: list, timeout: float, invariants: Optional[Callable] = None,
             workload: Optional[Callable] = None, refine_up_to: int = 3, heads_up_to: int = 4,
             prop: str = "ENGINE-ERROR") -> list[tuple]:
    """The whole argument for one claim: the premise that makes the one-slot step the step of any request
    among any number (the core runs one code with or without an environment: checkers/parametric/
    sealed.py), then, only if it holds, the `obligations`; each part as (action, name, status, seconds,
    reason). This core's one-request step takes branches of its own, pinned to the pass only for
    n <= refine_up_to (`refines`, `heads`), so today the argument ends at the premise."""
    why = covers(design, prop)
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
    out = for_each_n("refines", refine_up_to, lambda n, t: refines(k, cons, n, t), left)
    out += for_each_n("heads", heads_up_to, lambda n, t: heads(k, cons, n, t, invariants, workload), left)
    out += scan(k, cons, left(), invariants, workload)
    out += local_invariants(k, cons, left(), invariants, workload)
    out += no_error(k, cons, left(), invariants, workload)
    return out
