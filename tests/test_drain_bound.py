"""A lockstep run's drain (targets/stateful.py, DRAIN_STEPS) ends at a step bound; a workload whose requests are
still unanswered there is counted as such in the run's tally, not passed over as drained."""

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from targets import stateful
from targets.lockstep import Tally
from targets.reference import ReferenceTarget

IN_FLIGHT = "requests still in flight at the drain bound"


def tally_of_run(monkeypatch, bound: int) -> Tally:
    monkeypatch.setattr(stateful, "DRAIN_STEPS", bound)
    tally = Tally()
    machine = stateful.machine_for(ReferenceTarget, tally=tally)
    seed(3)(machine)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=40, stateful_step_count=10, deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck), phases=[Phase.generate]))
    return tally


def test_a_workload_left_in_flight_at_the_bound_is_counted(monkeypatch):
    assert tally_of_run(monkeypatch, 0).covered[IN_FLIGHT] > 0


def test_the_default_bound_drains_what_a_zero_bound_leaves(monkeypatch):
    assert tally_of_run(monkeypatch, stateful.DRAIN_STEPS).covered[IN_FLIGHT] < \
        tally_of_run(monkeypatch, 0).covered[IN_FLIGHT]
