"""bmc.search: the search over the capped units sharing the time agrees with the plain deepening of the
whole space,
knob minimisation returns a configuration no smaller one beats, lemmas are only ever an inductive
subset of the invariants, and a trace that does not replay is caught by replay (so `check` can
never print one)."""

import copy
import time

import model.policies  # noqa: F401
import model.symbolic.cores  # noqa: F401
from model.config import EngineConfig
from model.policies.trtllm_v2 import Options as V2Options
from checkers import bmc, clock
from checkers.bmc import PAUSED, Searching, _Search, _Unit, prove_lemmas, search, units_of
from model.symbolic.core import CORES
from checkers.replay import replay, transitions
from checkers.space import Group, Space
from helpers import sized


def Options(**options) -> V2Options:
    """_executor_loop (disable_overlap_scheduler): the loop these searches were written for (the default overlap
    executor: tests/symbolic/test_core_trtllm_overlap.py)."""
    return V2Options(**{"disable_overlap_scheduler": True, **options})


CORE = CORES["trtllm_v2"]

# Four of the searches that find the 3-request wedge (depth 5) and certify it over the whole space search requests
# of 4-16 new tokens in ci (tests/helpers.py `sized`), 1-16 nightly. Most of their time is the query that finds the
# wedge at depth 5 over 3 slots (10 of 16 s; the 4-slot unit's depth 4, 4 s more); in the narrower space the same
# depths hold (2 requests wedge at 6, 3 at 5, none in 4, decode runs taken as one transition) and every assertion
# runs as before, and Z3 finds the wedge sooner. The tests alone, CPU s (2026-12-07): capped 28.8 -> 15.8, units
# share 30.0 -> 16.5, opened smallest first 17.6 -> 9.4, transitions split 16.7 -> 9.1. The paused search keeps the
# full space: its pause (0.5 s of the clock) must come before any trace is found, which with 5-16 new tokens it
# does not (the 2-request wedge is found first), and 4-16 saved it 1 s of 25.
MAX_NEW = sized(ci=(4, 16), nightly=(1, 16))


def small_space(num_blocks=12, count=(1, 3), prompt=(1, 16), max_new=(1, 16)):
    cfg = EngineConfig("trtllm_v2", 4, 12, 16, 8, 0, False, 0, Options())
    knobs = {"block_size": 4, "num_blocks": num_blocks, "max_num_tokens": 16, "max_batch_size": 8, "host_blocks": 0}
    group = Group(count, {"prompt": prompt, "max_new": max_new, "arrival": (0, 4)})
    return Space(cfg, knobs, (group,), early_stops=False, cancellations=False)


def _plain(space, depth, core=CORE, minimise=True):
    """The whole space deepened alone, one transition at a time: no capped unit beside it."""
    run = _Search(core, clock.now() + 600, time.monotonic(), ["LIVE-NO-PROGRESS"], True, minimise)
    return run.finish(run.interleave([_Unit(None, space)], depth))


def test_capped_search_finds_a_shortest_trace_of_the_whole_space():
    space = small_space(max_new=MAX_NEW)
    capped = search(CORE, space, 8, 600, ["LIVE-NO-PROGRESS"])
    plain = _plain(space, 8)
    assert capped.status == plain.status == "violated"
    assert capped.scope == ""            # certified against the whole space
    assert capped.cex.depth == plain.cex.depth
    assert replay(capped.cex).ok


def test_minimised_pool_is_the_smallest_that_fails_at_that_depth():
    space = small_space(num_blocks=(4, 16), count=(1, 2))
    result = search(CORE, space, 8, 600, ["LIVE-NO-PROGRESS"])
    assert result.status == "violated"
    assert any(m.startswith("num_blocks = ") for m in result.minimised), result.minimised
    best = result.cex.cfg.num_blocks
    assert replay(result.cex).ok
    if best > 4:
        smaller = small_space(num_blocks=(4, best - 1), count=(1, 2))
        again = _plain(smaller, result.cex.depth, minimise=False)
        assert again.status == "bounded"


def test_a_trace_that_does_not_replay_is_caught():
    space = small_space(count=(1, 1), prompt=(1, 20))   # a prompt over the budget never runs
    result = search(CORE, space, 6, 600)
    assert result.status == "violated" and replay(result.cex).ok
    forged = copy.deepcopy(result.cex)
    forged.states[-1].g["free_blocks"] += 1
    rep = replay(forged)
    assert not rep.ok and "free_blocks" in rep.message


class _CoreWithAFalseInvariant(type(CORE)):
    """The trtllm_v2 core plus an invariant that holds initially but is not inductive."""

    def core_invariants(self, ops, k, p, s):
        inv = super().core_invariants(ops, k, p, s)
        inv["engine-stays-at-step-0"] = s.g["step"] == 0
        return inv


def test_lemmas_drop_an_invariant_that_is_not_inductive_and_keep_the_rest():
    core = _CoreWithAFalseInvariant()
    space = small_space(count=(1, 2))
    lemmas = prove_lemmas(core, space, clock.now() + 600)
    assert not lemmas.proved
    assert lemmas.dropped == ("engine-stays-at-step-0",)
    assert "blocks-conserved" in lemmas.names and "engine-stays-at-step-0" not in lemmas.names
    # the search assumes only the kept ones, so the known wedge (which runs past step 0) is still found
    result = search(core, space, 8, 600, ["LIVE-NO-PROGRESS"])
    assert result.status == "violated" and replay(result.cex).ok


def test_the_units_share_the_time_and_the_trace_is_shortest_over_the_whole_space():
    """Runs of at most 2 requests wedge in 6 transitions, 3 requests in 5: whichever unit finds its trace
    first, the result is the 5-transition one, certified against the whole space of 1-4 requests (every
    larger unit clear to depth 4), and `reached` says how far each unit got."""
    space = small_space(count=(1, 4), max_new=MAX_NEW)
    assert [u.slots for _, u in units_of(space)] == [1, 2, 3, 4]
    best = search(CORE, space, 8, 600, ["LIVE-NO-PROGRESS"], minimise=False)
    assert best.status == "violated" and best.cex.depth == 5 and best.scope == ""
    assert len(best.cex.workload.requests) == 3
    assert replay(best.cex).ok
    assert [slots for _, slots, _ in best.reached] == [1, 2, 3, 4]
    assert all(depth >= 4 for _, slots, depth in best.reached if slots >= 3), best.reached


def test_a_paused_search_goes_on_where_it_stopped():
    """Design review proves claims while the search pauses (Searching.run's find_by): the search it goes on with
    keeps its units' depths, and ends as one run would, with the same shortest trace."""
    space = small_space(count=(1, 3))
    searching = Searching(CORE, space, 8, ["LIVE-NO-PROGRESS"])
    first = searching.run(clock.now() + 600, find_by=clock.now() + 0.5)
    assert first.status == "unknown" and first.reason == PAUSED
    depths = [u.depth for u in searching.units]
    assert any(depths), "half a second of solving deepens the 1-request unit at least once"
    done = searching.run(clock.now() + 600)
    assert all(u.depth >= d for u, d in zip(searching.units, depths))
    whole = search(CORE, space, 8, 600, ["LIVE-NO-PROGRESS"])
    assert done.status == whole.status == "violated" and done.cex.depth == whole.cex.depth and done.scope == ""
    assert replay(done.cex).ok


def test_units_are_opened_smallest_first():
    """A unit is opened (its lemmas and acceleration proved) only once the smaller ones have had their
    turns (bmc.OPEN_STAGGER): the large spaces' openings do not hold up the small ones."""
    space = small_space(count=(1, 3), max_new=MAX_NEW)
    run = _Search(CORE, clock.now() + 600, time.monotonic(), ["LIVE-NO-PROGRESS"], True, False)
    units = [_Unit(cap, sub) for cap, sub in units_of(space)]
    seen = []
    original = _Search.open

    def spy(self, unit):
        seen.append(unit.space.slots)
        original(self, unit)
    run.open = lambda unit: spy(run, unit)
    result = run.interleave(units, 8)
    assert seen == [1, 2, 3]          # opened smallest first
    assert result.status == "violated" and result.cex.depth == 5


def test_a_costly_opening_holds_back_the_next_one():
    """An opening is one turn that cannot be cut, and its cost grows steeply with the slot count: the next
    unit is opened only once every opened unit still deepening has spent OPEN_FACTOR times what the last
    opening took (bmc.OPEN_FACTOR), so the small units have their time first."""
    units = [_Unit(cap, sub) for cap, sub in units_of(small_space(count=(1, 4)))]
    for rank, u in enumerate(units):
        u.rank = rank
    opened, waiting = units[2], units[3]
    opened.run = object()        # opened: its turn comes by the time it spent
    last_opening = 2.0
    wait = bmc.OPEN_FACTOR * last_opening
    assert wait > waiting.rank * bmc.OPEN_STAGGER
    opened.spent = wait - 1
    assert min([opened, waiting], key=lambda v: v.key(last_opening)) is opened
    opened.spent = wait + 1
    assert min([opened, waiting], key=lambda v: v.key(last_opening)) is waiting
    # with nothing opened yet at a cost, the stagger alone orders them
    assert waiting.key(0.0)[0] == waiting.rank * bmc.OPEN_STAGGER


def test_acceleration_is_used_only_where_it_is_proved(monkeypatch):
    """With acceleration unprovable beyond 2 slots, the 2-slot trace (decode runs as transitions)
    is not compared with 3-slot runs: certification stops and says why. A search of 3 slots alone
    then goes step by step, and says so."""
    proved = bmc.AccelerationProofs.holds
    monkeypatch.setattr(bmc.AccelerationProofs, "holds",
                        lambda self, space, lemmas, deadline: space.slots <= 2 and proved(self, space, lemmas, deadline))
    space = small_space()
    result = search(CORE, space, 8, 600, ["LIVE-NO-PROGRESS"])
    assert result.status == "violated" and result.accelerated and result.cex.depth == 6
    assert result.scope == "runs with at most 2 requests per ranged group"
    assert result.certified is None
    assert any("acceleration not proved sound for 3 request slots" in n for n in result.notes), result.notes
    assert replay(result.cex).ok
    stepwise = _plain(space, 4, minimise=False)
    assert stepwise.status == "bounded" and not stepwise.accelerated


def test_transitions_split_a_run_as_the_unrolling_does():
    """replay.transitions on the workload of a solver trace gives back the trace's own split."""
    result = search(CORE, small_space(max_new=MAX_NEW), 8, 600, ["LIVE-NO-PROGRESS"], minimise=False)
    assert result.status == "violated" and result.accelerated
    cex = result.cex
    assert any(m > 1 for m in cex.macro)
    assert transitions(cex.cfg, cex.workload, cex.steps - 1) == cex.macro


def test_the_field_design_wedges_in_fewer_transitions_with_more_requests():
    """Why `check` says how far its trace is shortest: on the field design the search finds a
    7-transition wedge shortest among runs of at most 4 requests (scenarios/check/
    trtllm-v2-field-ranges.toml, docs/symbolic.md), yet 7 requests wedge in 5 (bench/short_wedges.py
    found it): six small ones and a long one admitted in one step, one decode run fills the pool, the
    long one is suspended, then paused with a replay over the budget while the others finish, and
    nothing runs again."""
    from model.simulator import RequestSpec, Workload, simulate
    from properties import evaluate
    from model.policy import POLICIES

    cfg = EngineConfig("trtllm_v2", 32, 272, 2048, 64, 0, False, 0, Options(kv_cache_max_tokens=8192))
    wl = Workload(tuple([RequestSpec(5, 957, 0)] * 6 + [RequestSpec(1983, 959, 0)]))
    trace = simulate(cfg, wl)
    reqs = trace.states[0].requests
    ev = evaluate(trace, lambda rid: POLICIES[cfg.policy].fits_alone(cfg, reqs[rid]), cfg.max_batch_size)
    stuck = next(v for v in ev.violations if v.property == "LIVE-NO-PROGRESS")
    assert transitions(cfg, wl, stuck.step) == [1, 955, 1, 1, 1]
    victim = trace.states[stuck.step].requests[6]
    assert victim.phase.name == "PREEMPTED" and victim.prompt + victim.generated > cfg.max_num_tokens
    three = Workload((RequestSpec(1886, 996, 0), RequestSpec(1823, 995, 0), RequestSpec(2016, 995, 2)))
    assert len(transitions(cfg, three, 997)) == 7


class _GaveUp:
    def __init__(self, reason):
        self.reason = reason

    def reason_unknown(self):
        return self.reason


def test_a_query_z3_stops_at_its_timeout_is_a_time_out_even_just_before_the_deadline():
    """Z3 says "canceled" where a query's limit (the budget left, counted on checkers/clock.py's clock) ran out a
    moment before the deadline reads as passed; that is reported as the time-out, and a real give-up keeps its
    reason."""
    soon = clock.now() + 5.0
    assert bmc._unknown_reason(_GaveUp("canceled"), soon) == "time-out"
    assert bmc._unknown_reason(_GaveUp("timeout"), soon) == "time-out"
    assert bmc._unknown_reason(_GaveUp("incomplete quantifiers"), soon) == "the solver gave up: incomplete quantifiers"
    assert bmc._unknown_reason(_GaveUp("incomplete quantifiers"), clock.now() - 1) == "time-out"
