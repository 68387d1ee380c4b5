"""checkers/budget.py: solver budgets counted in Z3's work, not in wall-clock time."""

import time

import z3

import model.symbolic.cores  # noqa: F401  (registers the cores)
from checkers import bmc, budget, clock
from checkers.accel import prove_acceleration
from checkers.budget import RLIMIT_PER_SECOND, spent
from model.symbolic.core import CORES
from schedproof.checkspec import load_check


def hard_query() -> z3.Solver:
    xs = z3.Ints("x0 x1 x2 x3 x4")
    s = z3.Solver()
    s.add(z3.Sum([x * x * x for x in xs]) == 123456789, *[x > 0 for x in xs])
    return s


def burn(units: int) -> None:
    s = hard_query()
    s.set("rlimit", units)
    assert s.check() == z3.unknown


def test_a_budget_stops_a_query_by_work_with_the_wall_clock_to_spare():
    s = hard_query()
    with clock.cap(600) as capped:
        clock.limit(s, 600, units=budget.units(0.05))
        t0 = time.monotonic()
        assert s.check() == z3.unknown
        assert time.monotonic() - t0 < 60      # its work ran out, long before the wall-clock cap
        assert clock.why_unknown(s) == "time-out"
    assert not capped.cut


def test_the_budget_is_per_check_and_the_counter_is_shared():
    """Z3's counter belongs to the context: a new solver starts where the others left it. A check's
    limit counts from there, and only a difference across one check is that check's work."""
    burn(RLIMIT_PER_SECOND // 2)
    s = z3.Solver()
    y = z3.Int("y")
    s.add(y > 1)
    before = spent(s)
    assert before >= RLIMIT_PER_SECOND // 2
    s.set("rlimit", 1000)
    assert s.check(y < 5) == z3.sat            # 1000 units are plenty, counted from `before`
    assert 0 < spent(s) - before < 1000


def test_acceleration_work_is_counted_per_check_after_other_work():
    """A process that has already solved a lot (the counter far above the budget) still proves
    acceleration within its budget: the regression of counting the shared counter as spent."""
    burn(4 * RLIMIT_PER_SECOND)
    space = bmc.capped(load_check("scenarios/check/trtllm-v2-field-ranges-defaults.toml").space, 1)
    obligations = prove_acceleration(CORES["trtllm_v2"], space.template, 1, 240, work=1.0)
    assert obligations and all(o.status == "proved" for o in obligations)


def test_acceleration_without_work_left_is_unknown_not_proved():
    space = bmc.capped(load_check("scenarios/check/trtllm-v2-field-ranges-defaults.toml").space, 1)
    obligations = prove_acceleration(CORES["trtllm_v2"], space.template, 1, 240, work=1e-9)
    assert any(o.status == "unknown" for o in obligations)


def test_a_budget_beyond_the_solvers_largest_limit_is_not_wrapped_around():
    """Z3 keeps only the low 32 bits of `rlimit`: 2^32 + 1000 units would stop a query after 1000. The budget is
    held at the largest limit instead, so this query runs to the wall-clock cap (2 s), not out of work at once; and
    the cap says it stopped it."""
    seconds = (2 ** 32 + 1000) / RLIMIT_PER_SECOND
    assert budget.over_limit(seconds) and budget.units(seconds) == budget.MAX_RLIMIT
    assert clock.units_for(seconds) == budget.MAX_RLIMIT
    s = hard_query()
    with clock.cap(2) as capped:
        clock.limit(s, seconds)
        t0 = time.monotonic()
        assert s.check() == z3.unknown
        assert time.monotonic() - t0 > 1.5, s.reason_unknown()
        assert clock.why_unknown(s) == "the wall-clock cap passed"
    assert capped.cut


def test_a_search_slice_as_large_as_a_query_can_be_given_is_not_doubled_again():
    """A query its slice did not decide is asked again with twice the work, up to the largest limit: there the
    search says so, and its unit stops (bmc.WORK_LIMIT_SPENT) rather than asking again with the same work."""
    s = hard_query()
    s.set("rlimit", 1000)
    assert s.check() == z3.unknown
    deadline = clock.now() + 600
    assert bmc._unknown_reason(s, deadline, work=1.0) == bmc.SLICE_SPENT
    assert bmc._unknown_reason(s, deadline, work=budget.MAX_RLIMIT / RLIMIT_PER_SECOND) == bmc.WORK_LIMIT_SPENT
