"""Bounded model checking of a core over a `Space`: shortest counterexamples.

The unrolling adds one transition per depth: either one engine step (the core's `step` under
`Symbolic`) or, for cores that accelerate, a run of m identical decode steps (`decode_advance`
under `decode_guard`, proved equal to m single steps by accel.py). Each depth gets fresh state
variables, so the formula grows linearly. At each depth the solver is asked for a violation
at the newest transition; an unsatisfiable answer is asserted as a fact before going deeper,
so the first counterexample found has the fewest transitions.

The properties are those of properties/registry.py, by ID (`properties/symbolic.py` encodes
them); a no-progress state is reported only once the environment is quiet (everything has
arrived and no cancellation is due), so it is a state that stays stuck.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional

import z3

from model.symbolic.core import Core
from model.symbolic.ops import Symbolic, sort as ops_sort
from model.symbolic.slots import RECORD_FLAGS, Knobs, SlotRecord, SlotState, select
from properties.symbolic import PRIORITY, Transition, violations

from . import clock
from .accel import prove_acceleration
from .budget import over_limit, units as work_units
from .encode import as_int, evaluate, evaluate_state, fresh_state, int_var, state_eq
from .induction import check_obligations
from .space import MAX_VALUE, Encoding, Space, concrete_config, concrete_workload, encode

SYM = Symbolic()
# SCHEDPROOF_SORT=bv unrolls over 32-bit vectors instead (measured slower; see docs/symbolic.md).
UNROLLING_SORT = os.environ.get("SCHEDPROOF_SORT", "int")


@dataclasses.dataclass
class Counterexample:
    property: str
    depth: int                       # transitions
    cfg: object                      # EngineConfig
    workload: object                 # Workload
    states: list[SlotState]          # depth + 1 states
    macro: list[int]                 # engine steps per transition (1, or m for an accelerated decode run)
    records: list[Optional[SlotRecord]]   # None for an accelerated run
    lasso_start: Optional[int] = None

    @property
    def steps(self) -> int:
        return sum(self.macro)


@dataclasses.dataclass
class SearchEvent:
    """What a long search reports while it runs (for a progress display; `search`'s `progress`):
    "depth": a space of the search (a capped subset, or the whole) has no violation up to `depth`
    transitions ("search" for the first counterexample, "certify" when certifying one against a
    larger space), `reached` says how far each got; "found": the
    first counterexample (`result`), before certification starts; "shorter": certification found
    a shorter one, which replaces it."""
    kind: str
    stage: str = "search"
    depth: int = 0
    slots: tuple = ()                # request slots of the space that reached `depth` (or found `result`)
    seconds_left: float = 0.0
    result: Optional["BmcResult"] = None
    reached: tuple = ()              # (scope, slots, depth clear) of every space of the search


@dataclasses.dataclass
class BmcResult:
    status: str                      # violated | bounded | unknown
    depth: int                       # depth reached (violated: the counterexample's)
    seconds: float
    cex: Optional[Counterexample] = None
    reason: str = ""
    minimised: list[str] = dataclasses.field(default_factory=list)
    lemmas: Optional["Lemmas"] = None
    scope: str = ""                  # "" = the whole space; else the subset a violation is shortest in
    certified: Optional[int] = None  # with a scope: `certified_in` has no violation up to this depth
    certified_in: str = ""           # "" = the whole space; else the larger subset certification reached
    found_seconds: float = 0.0       # wall and CPU seconds to the reported counterexample (certifying it is after)
    found_cpu: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)   # what limited the search (acceleration)
    accelerated: bool = False        # decode runs were transitions (proved sound for every space searched)
    # how far each space of the search got: (scope, request slots, depth with no violation), smallest first
    reached: list = dataclasses.field(default_factory=list)


class Unrolling:
    def __init__(self, core: Core, space: Space, accelerate: bool = True, lemmas: frozenset = frozenset()):
        self.core, self.space = core, space
        self.enc: Encoding = encode(space)
        self.n = space.slots
        self.accelerate = accelerate and core.accelerates_in(self.enc.knobs)
        self.solver = new_solver()
        self.solver.add(*self.enc.constraints)
        self.states: list[SlotState] = [core.initial(SYM, self.enc.knobs, self.enc.params)]
        self.transitions: list[Transition] = []
        self.lemmas = lemmas   # names of the core's invariants proved inductive for this space: hold at every depth

    def extend(self) -> Transition:
        d = len(self.transitions) + 1
        if self.accelerate and self.transitions:
            self._normalise(self.transitions[-1])
        pre = self.states[-1]
        post, rec = self.core.step(SYM, self.enc.knobs, self.enc.params, pre)
        macro = 1
        if self.accelerate:
            macro = int_var(f"macro{d}")
            guard = self.core.decode_guard(SYM, self.enc.knobs, self.enc.params, pre, macro)
            advanced = self.core.decode_advance(SYM, self.enc.knobs, self.enc.params, pre, macro)
            self.solver.add(macro >= 1, macro <= MAX_VALUE, z3.Or(macro == 1, z3.And(macro >= 2, guard)))
            post = select(SYM, macro == 1, post, advanced)
        fresh = fresh_state(self.core, self.n, f"s{d}")
        self.solver.add(*state_eq(fresh, post))
        rec_vars = _fresh_record(self.n, f"t{d}")
        self.solver.add(*_record_eq(rec_vars, rec))
        if self.lemmas:
            self.solver.add(*[c for n, c in self.core.invariants(SYM, self.enc.knobs, self.enc.params, fresh).items()
                              if n in self.lemmas and c is not True])
        self.states.append(fresh)
        t = Transition(index=d - 1, pre=pre, post=fresh, rec=rec_vars, single=(macro == 1) if self.accelerate else True,
                       macro=macro)
        self.transitions.append(t)
        return t

    def _normalise(self, t: Transition) -> None:
        """A transition that is no longer the last one takes its decode run at its longest, and
        takes one wherever one can start (sound by the merge obligation of accel.py: this only
        removes traces that have a shorter equivalent)."""
        k, p = self.enc.knobs, self.enc.params
        can_run = self.core.decode_guard(SYM, k, p, t.pre, 2)
        longer = self.core.decode_guard(SYM, k, p, t.pre, t.macro + 1)
        self.solver.add(z3.Implies(can_run, t.macro >= 2), z3.Implies(t.macro >= 2, z3.Not(longer)))

    def extract(self, model: z3.ModelRef, prop: str, lasso_start: Optional[int]) -> Counterexample:
        cfg = concrete_config(self.space, model, self.enc)
        wl = concrete_workload(model, self.enc)
        states = [evaluate_state(model, s) for s in self.states]
        macro = [evaluate(model, t.macro) for t in self.transitions]
        records = []
        for t, m in zip(self.transitions, macro):
            if m != 1:
                records.append(None)
                continue
            records.append(SlotRecord([evaluate(model, x) for x in t.rec.tokens],
                                      {f: [evaluate(model, x) for x in t.rec.flags[f]] for f in RECORD_FLAGS},
                                      evaluate(model, t.rec.charged), evaluate(model, t.rec.error),
                                      evaluate(model, t.rec.error_kind)))
        return Counterexample(prop, len(self.transitions), cfg, wl, states, macro, records, lasso_start)


def _fresh_record(n: int, tag: str) -> SlotRecord:
    return SlotRecord([int_var(f"{tag}.tokens{i}") for i in range(n)],
                      {f: [z3.Bool(f"{tag}.{f}{i}") for i in range(n)] for f in RECORD_FLAGS},
                      int_var(f"{tag}.charged"), z3.Bool(f"{tag}.error"), int_var(f"{tag}.error_kind"))


def _record_eq(a: SlotRecord, b: SlotRecord) -> list:
    out = [x == y for x, y in zip(a.tokens, b.tokens)]
    for f in RECORD_FLAGS:
        out += [x == y for x, y in zip(a.flags[f], b.flags[f])]
    out += [a.charged == b.charged, a.error == b.error, a.error_kind == b.error_kind]
    return [e for e in out if e is not True]


def new_solver() -> z3.Solver:
    solver = z3.Solver()
    # With integers (the default), Z3's older arithmetic solver is 2-3x faster on these
    # unrollings (trtllm_v2 core, depth-4 no-progress query: 7.3 s -> 2.8 s).
    if UNROLLING_SORT == "int":
        solver.set("smt.arith.solver", 2)
    return solver


@dataclasses.dataclass
class Lemmas:
    proved: bool                     # every invariant of the core is inductive over the space
    obligations: list                # the last round's obligations (all proved when `names` is not empty)
    seconds: float
    names: frozenset = frozenset()   # the invariants the unrolling assumes: an inductive subset
    dropped: tuple = ()              # invariants left out: refuted, or not proved within the time


# A single obligation that needs longer is dropped from the lemmas rather than allowed to hold up
# the search (at 6+ slots of trtllm_v2, `blocks-conserved` over one pass takes minutes).
LEMMA_OBLIGATION_SECONDS = 10.0


def prove_lemmas(core: Core, space: Space, deadline: float) -> Lemmas:
    """The largest subset of the core's invariants that is inductive over this space, found by
    dropping every invariant with an obligation not proved and proving the rest again (Houdini:
    each round assumes only the invariants still kept, so the survivors are inductive together).
    The unrolling may then assume them at every state, which spares the solver re-deriving them
    at each depth."""
    t0 = time.monotonic()
    if _remaining(deadline) <= 0:
        # building the obligations alone takes seconds at a few slots: none when no time is left
        return Lemmas(False, [], 0.0, frozenset(), ())
    enc = encode(space)
    stop = clock.now() + max(0.0, min(_remaining(deadline) / 2, 120.0))
    keep = None          # None: all of them
    dropped: list[str] = []
    while True:
        def kept(ops, k, p, s, keep=keep):
            return {n: c for n, c in core.invariants(ops, k, p, s).items() if keep is None or n in keep}
        obligations = check_obligations(core, enc.knobs, enc.params, enc.constraints, kept,
                                        max(0.0, clock.until(stop)), per_obligation=LEMMA_OBLIGATION_SECONDS,
                                        batch=True)
        names = {o.invariant for o in obligations}
        bad = {o.invariant for o in obligations if o.status != "proved"}
        if not bad:
            return Lemmas(not dropped, obligations, time.monotonic() - t0, frozenset(names), tuple(sorted(dropped)))
        dropped += sorted(bad)
        keep = names - bad
        if not keep or clock.now() >= stop:
            return Lemmas(False, obligations, time.monotonic() - t0, frozenset(), tuple(sorted(dropped)))


# Each search proves acceleration sound for the slot counts it unrolls (tests/ prove it for 2-3
# slots with every knob symbolic; a search may unroll more). On the field design, with page counts
# abstracted (accel.py): 4 slots 1.5 s, 6 slots 9 s, 8 slots 48 s; 12 slots do not prove in 5 min.
ACCEL_SECONDS = 60.0


class AccelerationProofs:
    """Acceleration soundness (accel.py) per slot count, proved once per search, for the knob
    ranges of the space and from the invariants proved inductive for it."""

    def __init__(self, core: Core):
        self.core = core
        self.proved: dict[int, bool] = {}

    def holds(self, space: Space, lemmas: Lemmas, deadline: float) -> bool:
        n = space.slots
        if n not in self.proved:
            if _remaining(deadline) <= 0:
                return False     # not tried: building the obligations would outlast the time-out
            bounds = {name: (v[0], v[1]) if isinstance(v, tuple) else (v, v) for name, v in space.knobs.items()}
            # ACCEL_SECONDS of solver work, a third of what is left at most
            left = max(0.0, min(_remaining(deadline) / 3, ACCEL_SECONDS))
            obligations = prove_acceleration(self.core, space.template, n, left, bounds, assumed=lemmas.names,
                                             work=ACCEL_SECONDS)
            self.proved[n] = all(o.status == "proved" for o in obligations)
        return self.proved[n]


def _remaining(deadline: float) -> float:
    """Seconds of the checkers' clock (checkers/clock.py) until `deadline`, a time on that clock."""
    return clock.until(deadline)


# Every ranged request count is also searched capped: subsets of the runs, with fewer slots, so each depth is
# cheaper. Each slot count is one unit of the search, the whole space the last.
CAPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# The units share the time (of checkers/clock.py's clock: solver work, so the turns and what they find do not
# depend on the machine's load): each turn goes to the unit whose time spent so far (its opening included: its
# lemmas and acceleration proof) is least, and asks its next depth with a slice of solver work, counted in resource
# units (checkers/budget.py). A query the slice does not decide is asked again at the unit's next turn with twice
# the work; the next depth starts from the slice the last one needed, less one doubling. So a costly depth of a
# large space does not hold up the smaller ones, and no unit starves; the small units, cheap at every depth,
# reach far deeper in their equal time (most failures have small counterexamples: Jackson's small-scope
# hypothesis). The time is not weighted by slot count (tried, two runs: it did not clearly pay). Deepening by
# depth alone (a unit's depth plus its slices spent in vain) gave the large units, stuck at a shallow depth, ever
# larger slices, and the runs of 4 requests never reached the depth of their wedge (issue 38); searching tier by
# tier spent the whole time-out on the runs of at most 3 requests.
QUERY_WORK = 15.0
# the reason of a search stopped at its `find_by` with nothing found (Searching.run): it can go on
PAUSED = "paused"
# A unit is opened once every opened unit still deepening has spent OPEN_STAGGER seconds per smaller unit,
# and OPEN_FACTOR times what the last opening took. An opening (lemmas, acceleration proof) is one turn that
# cannot be cut, and its cost grows steeply with the slot count (field design: 0.2, 0.6, 1.6, 7, 43, 94 s at
# 1, 2, 3, 4, 6, 8 slots; 12 slots 78 s without acceleration), about five times the last one's from 4 slots
# on: each unit deepening has had OPEN_FACTOR times the last opening before the next one is paid, so the
# next opening costs about a sixth of what each of them has had. Opened OPEN_STAGGER apart alone, the units
# of 6, 8 and 12 slots took 216 of the first 320 s of the A+B field ranges (1-12 requests), while the
# 4-request wedge there needs 100-250 s of its own unit's turns at depth 6 (issue 38): the small units,
# where most counterexamples are (Jackson's small-scope hypothesis), have their time first.
OPEN_STAGGER = 5.0
OPEN_FACTOR = 30.0
# Acceleration is proved per slot count (AccelerationProofs); beyond this many slots it did not prove within
# ACCEL_SECONDS on the field design (12 slots: not in 5 min), so larger units go step by step untried.
ACCEL_MAX_SLOTS = 8


def capped(space: Space, cap: int) -> Space:
    """The space with every ranged request count capped at `cap` (never below its low end): a
    subset of the runs, with fewer slots, so each depth is cheaper to search."""
    groups = tuple(dataclasses.replace(g, count=(g.count[0], max(g.count[0], min(g.count[1], cap))))
                   if isinstance(g.count, tuple) else g for g in space.groups)
    return dataclasses.replace(space, groups=groups)


def units_of(space: Space) -> list[tuple[Optional[int], Space]]:
    """(cap, capped space) for each cap whose space is smaller than the whole one, each slot count
    once, then (None, the whole space)."""
    seen, out = set(), []
    for cap in CAPS:
        sub = capped(space, cap)
        if sub.slots < space.slots and sub.slots not in seen:
            seen.add(sub.slots)
            out.append((cap, sub))
    return out + [(None, space)]


def search(core: Core, space: Space, max_depth: int, timeout: float, properties: Optional[list[str]] = None,
           accelerate: bool = True, minimise: bool = True,
           progress: Optional[Callable[[SearchEvent], None]] = None, shortest: bool = True) -> BmcResult:
    """Deepen one transition at a time until a property in `properties` (default: all) is violated,
    `max_depth` is reached (bounded) or `timeout` seconds pass (unknown).

    With many request slots each depth is costly, so the space is searched beside its capped
    subsets (`units_of`), which share the time (QUERY_WORK). Each unit is deepened one transition
    at a time, so a trace found in a unit at depth d is shortest among that unit's runs; it is then
    certified against the larger units, each searched up to d - 1, which either finds a shorter
    trace (it replaces the first, and certification goes on from it), proves none exists (the trace
    is shortest in that space too), or runs out of time (the result says which space it is shortest
    in, and how deep the next one was covered). `reached` says how far every unit got.

    Decode runs are taken as one transition only in units whose slot count acceleration is proved
    sound for (AccelerationProofs); elsewhere a transition is one engine step, and a trace found
    with acceleration is certified only where acceleration is proved.

    `progress` receives a `SearchEvent` per depth reached and for each counterexample found. With
    `shortest` False the first counterexample is returned as found, uncertified (its `scope` says
    where it is shortest): for a caller that asks only whether a violation exists."""
    searching = Searching(core, space, max_depth, properties, accelerate, minimise, progress, shortest)
    return searching.run(searching.clock_start + timeout)


class Searching:
    """A `search` that can pause and go on: between `run`s its units keep their unrollings, depths and
    time spent, so a search paused while something else runs (design review proves claims in the pause,
    proofs/review.py) goes on where it stopped. Seconds in its results count from its start, pauses
    included."""

    def __init__(self, core: Core, space: Space, max_depth: int, properties: Optional[list[str]] = None,
                 accelerate: bool = True, minimise: bool = True,
                 progress: Optional[Callable[[SearchEvent], None]] = None, shortest: bool = True):
        self.start = time.monotonic()       # for the seconds it reports
        self.clock_start = clock.now()      # for its deadlines
        self.max_depth, self.shortest = max_depth, shortest
        self._run = _Search(core, self.start, self.start, properties, accelerate and core.accelerates_in(Knobs.of(space.template)), minimise,
                            progress)
        self.units = [_Unit(cap, sub) for cap, sub in units_of(space)]

    def run(self, deadline: float, find_by: Optional[float] = None) -> BmcResult:
        """Search until `deadline`; with `find_by`, pause at that time if nothing is found by then (a trace
        found before it is certified until `deadline`). A paused search ends `unknown`, reason PAUSED."""
        self._run.deadline = deadline
        return self._run.finish(self._run.interleave(self.units, self.max_depth, self.shortest, find_by))


def _scope(cap: Optional[int]) -> str:
    return "" if cap is None else f"runs with at most {cap} request{'s' if cap != 1 else ''} per ranged group"


class _Unit:
    """One space the search deepens (a capped subset or the whole space), and how far it is clear."""

    def __init__(self, cap: Optional[int], space: Space):
        self.cap, self.space = cap, space
        self.run: Optional[_Deepening] = None      # opened at its first turn
        self.lemmas: Optional[Lemmas] = None
        self.accelerated = False
        self.depth = 0          # no wanted property is violated by any run of at most `depth` transitions
        self.target = 0         # deepened no further
        self.tries = 0          # doublings of the slice for the next depth
        self.ended = ""         # why it is deepened no more, before its target
        self.rank = 0           # its place among the units, smallest first (see `key`)
        self.spent = 0.0        # clock seconds of its turns so far, its opening included

    @property
    def scope(self) -> str:
        return _scope(self.cap)

    def key(self, last_opening: float = 0.0) -> tuple:
        """Its turn comes when its key is the least: opened units by the time they spent, the others
        when every opened unit has spent what they wait for (OPEN_STAGGER, OPEN_FACTOR)."""
        if self.run is None:
            return (max(self.rank * OPEN_STAGGER, OPEN_FACTOR * last_opening), self.space.slots)
        return (self.spent, self.space.slots)

    def contains(self, other: "_Unit") -> bool:
        return self.space.slots >= other.space.slots

    def reach(self) -> tuple:
        return (self.scope or "the whole space", self.space.slots, self.depth)


class _Search:
    """What one `search` shares across its unrollings: the deadline, the options and the
    acceleration proofs."""

    def __init__(self, core, deadline, start, properties, accelerate, minimise, progress=None):
        self.core, self.deadline, self.start = core, deadline, start
        self.progress = progress or (lambda event: None)
        self.cpu0 = time.process_time()
        self.properties, self.accelerate, self.minimise = properties, accelerate, minimise
        self.accel = AccelerationProofs(core)
        self.last_opening = 0.0                # seconds the latest unit's opening took
        self.unaccelerated: list[int] = []     # slot counts searched step by step: not proved
        self.untried: list[int] = []           # ... not tried (above ACCEL_MAX_SLOTS)

    def open(self, unit: _Unit) -> None:
        unit.lemmas = prove_lemmas(self.core, unit.space, self.deadline)
        unit.accelerated = (self.accelerate and unit.space.slots <= ACCEL_MAX_SLOTS
                            and self.accel.holds(unit.space, unit.lemmas, self.deadline))
        if self.accelerate and not unit.accelerated:
            (self.unaccelerated if unit.space.slots <= ACCEL_MAX_SLOTS else self.untried).append(unit.space.slots)
        with ops_sort(UNROLLING_SORT):
            unit.run = _Deepening(self.core, unit.space, self.properties, unit.accelerated, self.minimise,
                                  unit.lemmas)

    def interleave(self, units: list[_Unit], max_depth: int, shortest: bool = True,
                   find_by: Optional[float] = None) -> BmcResult:
        """Deepen the units, each turn the one with the smallest key, until each reaches its target,
        is stopped, or the time is out (or, with nothing found, `find_by` has passed); the first
        violation found is certified against the larger units (their target becomes one less than its
        depth)."""
        for i, u in enumerate(units):
            u.target, u.rank = max_depth, i
        best: Optional[BmcResult] = None
        found_in: Optional[_Unit] = None
        paused = False
        while _remaining(self.deadline) > 0:
            live = [u for u in units if not u.ended and u.depth < u.target]
            if not live:
                break
            if best is None and find_by is not None and clock.now() >= find_by:
                paused = True
                break
            u = min(live, key=lambda v: v.key(self.last_opening))
            turn = clock.now()
            if u.run is None:
                self.open(u)
                self.last_opening = clock.now() - turn
                u.spent += self.last_opening
                if best is not None and best.accelerated and not u.accelerated:
                    u.ended = "acceleration not proved sound"   # its depths are not comparable
                continue
            r = u.run.deeper(self.deadline, self.start, work=QUERY_WORK * 2 ** u.tries)
            u.spent += clock.now() - turn
            if r is None:
                u.depth, u.tries = u.depth + 1, max(0, u.tries - 1)
                self.progress(SearchEvent("depth", "search" if best is None else "certify", u.depth,
                                          (u.space.slots,), _remaining(self.deadline),
                                          reached=tuple(v.reach() for v in units)))
            elif r.status == "unknown":
                if r.reason == SLICE_SPENT:
                    u.tries += 1
                else:
                    u.ended = r.reason
            else:
                r.scope, r.accelerated = u.scope, u.accelerated
                r.found_seconds, r.found_cpu = time.monotonic() - self.start, time.process_time() - self.cpu0
                first = best is None
                best, found_in = r, u
                self.progress(SearchEvent("found" if first else "shorter", "search" if first else "certify",
                                          r.depth, (u.space.slots,), _remaining(self.deadline), result=r))
                if not shortest:
                    break
                for v in units:
                    if u.contains(v):
                        v.target = min(v.target, v.depth)      # a subset: nothing shorter there
                    else:
                        v.target = r.depth - 1
                        if r.accelerated and v.run is not None and not v.accelerated:
                            v.ended = "acceleration not proved sound"
        result = self._certified(best, found_in, units) if best is not None else self._unfound(units, max_depth)
        if paused and result.status == "unknown":
            result.reason = PAUSED
        result.reached = [u.reach() for u in units]
        result.seconds = time.monotonic() - self.start
        return result

    def _certified(self, best: BmcResult, found_in: _Unit, units: list[_Unit]) -> BmcResult:
        """The trace's scope: the largest unit clear to one less than its depth (they are nested);
        where that is not the whole space, how far the next larger unit got."""
        best.lemmas = found_in.lemmas
        if best.depth <= 1:             # nothing is shorter than one transition
            best.scope = ""
            return best
        comparable = [u for u in units if u.contains(found_in) and (u.accelerated or not best.accelerated)
                      and u.depth >= best.depth - 1 and u.run is not None]
        widest = max(comparable, key=lambda u: u.space.slots)
        best.scope = widest.scope
        beyond = [u for u in units if not widest.contains(u)]
        if beyond:
            nxt = beyond[0]
            if nxt.ended == "acceleration not proved sound":
                best.notes.append(f"not certified beyond {best.scope}: acceleration not proved sound for "
                                  f"{nxt.space.slots} request slots")
            else:
                best.certified, best.certified_in = nxt.depth, nxt.scope
        return best

    def _unfound(self, units: list[_Unit], max_depth: int) -> BmcResult:
        whole = units[-1]
        if whole.depth >= max_depth:
            return BmcResult("bounded", max_depth, 0.0, lemmas=whole.lemmas, accelerated=whole.accelerated)
        # the largest unit that got anywhere, said with its scope (`reached` has them all): the deepest one is
        # usually the 1-request unit, at the full depth, which says least about the space
        far = max((u for u in units if u.depth > 0), key=lambda u: u.space.slots, default=units[0])
        reason = next((u.ended for u in units if u.ended and u.ended != "acceleration not proved sound"),
                      "time-out")
        return BmcResult("unknown", far.depth, 0.0, reason=reason, lemmas=far.lemmas, scope=far.scope,
                         accelerated=far.accelerated)

    def finish(self, result: BmcResult) -> BmcResult:
        if self.unaccelerated:
            counts = ", ".join(str(n) for n in sorted(set(self.unaccelerated)))
            result.notes.append(f"acceleration not proved sound for {counts} request slots within "
                                f"{ACCEL_SECONDS:g} s: there each transition is one engine step")
        if self.untried:
            counts = ", ".join(str(n) for n in sorted(set(self.untried)))
            result.notes.append(f"acceleration not tried for {counts} request slots (above {ACCEL_MAX_SLOTS}): "
                                f"there each transition is one engine step")
        return result


class _Deepening:
    """One space's unrolling, one transition deeper per call."""

    def __init__(self, core, space, properties, accelerate, minimise, lemmas: Lemmas):
        self.u = Unrolling(core, space, accelerate, lemmas=lemmas.names)
        self.space, self.minimise, self.lemmas = space, minimise, lemmas
        self.wanted = [p for p in PRIORITY if properties is None or p in properties]
        self.pending = None     # the newest transition and its conditions, while its query is undecided

    def deeper(self, deadline: float, start: float, work: Optional[float] = None) -> Optional[BmcResult]:
        """None when no wanted property is violated at the new depth; else violated or unknown.
        With `work` the query gets that much solver work (checkers/budget.py); a query it does not
        decide is unknown with the reason SLICE_SPENT, and the next call asks the same depth again."""
        u, wanted = self.u, self.wanted
        if self.pending is None:
            t = u.extend()
            bad = violations(SYM, u, t)
            # a condition may be a Python bool where the terms simplified it away (before step 0 no
            # request has arrived, so none is unfinished): False cannot hold, True holds in every model
            bad = {p: v for p, v in bad.items() if p in wanted and v[0] is not False}
            if not bad:
                return None
            self.pending = bad
        bad = self.pending
        depth = len(u.transitions)
        any_bad = z3.Or(*[b for b, _ in bad.values()])
        status = _check(u.solver, deadline, any_bad, work=work)
        if status == z3.unknown:
            return BmcResult("unknown", depth - 1, time.monotonic() - start,
                             reason=_unknown_reason(u.solver, deadline, work), lemmas=self.lemmas)
        self.pending = None
        if status == z3.unsat:
            u.solver.add(z3.Not(any_bad))
            return None
        model = u.solver.model()
        for prop in wanted:
            if prop not in bad:
                continue
            cond, lasso = bad[prop]
            # The disjunction's model already witnesses this property when it satisfies it: asking
            # the solver again would repeat the costliest query of the search.
            if _holds(model, cond):
                status = z3.sat
            else:
                status = _check(u.solver, deadline, cond)
                if status == z3.unknown:
                    return BmcResult("unknown", depth - 1, time.monotonic() - start,
                                     reason=_unknown_reason(u.solver, deadline), lemmas=self.lemmas)
                model = u.solver.model() if status == z3.sat else model
            if status == z3.sat:
                minimised = []
                if self.minimise and self.space.symbolic_knobs:
                    model, minimised = _minimise(u, cond, deadline, model)
                lasso_start = None
                if lasso is not None:
                    lasso_start = next(j for j, c in lasso if _holds(model, c))
                cex = u.extract(model, prop, lasso_start)
                return BmcResult("violated", depth, time.monotonic() - start, cex, minimised=minimised,
                                 lemmas=self.lemmas)
        # The disjunction was satisfiable only through properties outside `wanted`: impossible.
        raise AssertionError("a violation the solver found is not attributed to any property")


def _holds(model: z3.ModelRef, cond) -> bool:
    """`cond` is true in `model`; `cond` is a Z3 term or a Python bool."""
    if isinstance(cond, bool):
        return cond
    return z3.is_true(model.eval(cond, model_completion=True))


MINIMISE_ORDER = ("num_blocks", "max_num_tokens", "max_batch_size", "block_size", "host_blocks")


def _minimise(u: Unrolling, cond, deadline: float, model: z3.ModelRef):
    """Lexicographically smallest pool, budget, batch cap, then fewest requests, among the
    counterexamples of this length (each bound found by binary search with the solver)."""
    fixed = [cond]
    done = []
    targets = [(name, u.enc.knob_terms[name]) for name in MINIMISE_ORDER
               if name in u.enc.knob_terms and not isinstance(u.enc.knob_terms[name], int)]
    targets.append(("requests", u.enc.count))
    for name, term in targets:
        best = as_int(model.eval(term, model_completion=True))
        low = _lower_bound(u.space, name)
        while low < best:
            mid = (low + best) // 2
            status = _check(u.solver, deadline, *fixed, term <= mid)
            if status == z3.sat:
                model = u.solver.model()
                best = as_int(model.eval(term, model_completion=True))
            elif status == z3.unsat:
                low = mid + 1
            else:
                done.append(f"{name} <= {best} (time ran out before it was shown smallest)")
                return model, done
        fixed.append(term == best)
        done.append(f"{name} = {best}")
    return model, done


def _lower_bound(space: Space, name: str) -> int:
    if name == "requests":
        return 1
    v = space.knobs[name]
    return v[0] if isinstance(v, tuple) else v


def _check(solver: z3.Solver, deadline: float, *assumptions, work: Optional[float] = None):
    """`solver.check` within the deadline, and within `work` seconds of solver work where given."""
    with clock.rate(clock.UNROLLING_RATE):
        left = _remaining(deadline)
        if left <= 0:
            return z3.unknown
        # what is left of the budget, and of a slice where given (an earlier slice's must not linger)
        clock.limit(solver, left, units=None if work is None else work_units(work))
        return solver.check(*assumptions)


# the reason of a query that ran out of its slice of work (`_check`'s `work`), asked again later
SLICE_SPENT = "its slice of solver work spent"
# ... of one that ran out of the most work one query can be given (budget.MAX_RLIMIT): its unit stops there
WORK_LIMIT_SPENT = "the most solver work one query can be given spent"


def _unknown_reason(solver: z3.Solver, deadline: float, work: Optional[float] = None) -> str:
    # A query ends at its `rlimit`: the search's budget left (then the budget is spent: "time-out", the budget being
    # the search's time on checkers/clock.py's clock) or its slice's work; or at the wall-clock cap (clock.cut() then
    # says so, and the CLI reports the verdict as cut by it). Z3 says "canceled" (or "timeout", or "max. resource
    # limit exceeded") for any of them. An interrupt also cancels a query, but then `schedproof.interrupts` stops
    # the run: no verdict is printed.
    reason = solver.reason_unknown()
    if _remaining(deadline) <= 0 or clock.cut():
        return "time-out"
    if reason in ("timeout", "canceled") or "resource" in reason:
        with clock.rate(clock.UNROLLING_RATE):      # as `_check` counted what was left
            left = _remaining(deadline) * clock.UNROLLING_RATE
        if work is None or work_units(work) >= left:
            return "time-out"        # the budget left was less than the slice
        # a slice as large as a query can be given is not doubled again
        return WORK_LIMIT_SPENT if over_limit(work) else SLICE_SPENT
    return f"the solver gave up: {reason}"
