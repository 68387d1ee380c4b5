"""Run a scenario through the simulator and the property registry; no printing here."""

from __future__ import annotations

import dataclasses
import time

from model.policy import POLICIES
from model.simulator import Trace, simulate
from model.state import Phase
from properties import Evaluation, evaluate

from .scenario import Scenario

DEFAULT_MAX_STEPS = 200_000


@dataclasses.dataclass
class RunResult:
    scenario: Scenario
    trace: Trace
    evaluation: Evaluation
    seconds: float

    @property
    def verdict(self) -> str:
        return self.evaluation.verdict

    def count(self, phase: Phase) -> int:
        return sum(1 for r in self.trace.final.requests if r.phase == phase)

    @property
    def completed(self) -> int:
        return self.count(Phase.FINISHED)

    @property
    def failed(self) -> int:
        return self.count(Phase.FAILED)

    @property
    def total(self) -> int:
        return len(self.trace.final.requests)

    @property
    def steps(self) -> int:
        return len(self.trace.records)

    def matches_expectation(self) -> list[str]:
        """Differences from the scenario's [expect] table, as readable lines (empty: as expected)."""
        e = self.scenario.expect
        out = []
        for field, want, got in (("verdict", e.verdict, self.verdict), ("completed", e.completed, self.completed),
                                 ("failed", e.failed, self.failed)):
            if want is not None and want != got:
                out.append(f"{field}: expected {want}, got {got}")
        return out


def run_scenario(scenario: Scenario, max_steps: int = DEFAULT_MAX_STEPS) -> RunResult:
    start = time.perf_counter()
    trace = simulate(scenario.cfg, scenario.workload, max_steps=max_steps)
    policy = POLICIES[scenario.cfg.policy]
    reqs = trace.states[0].requests
    evaluation = evaluate(trace, lambda rid: policy.fits_alone(scenario.cfg, reqs[rid]), scenario.max_overtakes)
    return RunResult(scenario, trace, evaluation, time.perf_counter() - start)
