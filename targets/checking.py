"""Check the property registry after every step of any target, and replay action lists.

The same `StepChecker` runs inside the Hypothesis state machine, in `schedproof fuzz` and in the
generated regression tests, so a counterexample means the same thing everywhere.
"""

from __future__ import annotations

import ast
import dataclasses
import time
from typing import Callable, Optional

import model.policies  # noqa: F401  (registers every policy)
from model.config import EngineConfig, build_options
from model.policy import POLICIES
from model.simulator import Workload
from model.state import Phase, State
from properties import REGISTRY
from properties.registry import Context, Violation

from .protocol import Action, Add, Cancel, Observation, Step, Stop, Target, TargetHung
from .reference import ReferenceTarget

# The step checks of the registry plus these trace checks, evaluated on the last step alone.
PER_STEP_TRACE_CHECKS = ("LIVE-NO-PROGRESS", "LIVE-NO-INTERFERENCE")
ORACLE = "ORACLE-GREEDY-OUTPUT"   # a target-level oracle, not a model property: see `check_outputs`


@dataclasses.dataclass
class _MiniTrace:
    cfg: EngineConfig
    states: list[State]
    records: list
    end: str = "running"
    cycle_start: Optional[int] = None


class StepChecker:
    """Holds the previous observation and returns the first violation of a step, if any."""

    def __init__(self, cfg: EngineConfig, reference_outputs: Optional[Callable[[Add], tuple[int, ...]]] = None):
        self.cfg = cfg
        self.policy = POLICIES[cfg.policy]
        self.prev: Optional[State] = None
        self.adds: dict[int, Add] = {}
        self.reference_outputs = reference_outputs

    def submitted(self, action: Add) -> None:
        self.adds[action.rid] = action

    def check(self, obs: Observation) -> Optional[Violation]:
        prev = self.prev if self.prev is not None else dataclasses.replace(obs.state, requests=())
        # Requests submitted since the previous step are compared from their submitted form.
        prev = self._align(prev, obs.state)
        self.prev = obs.state
        for p in REGISTRY.values():
            if p.step_check is not None:
                message = p.step_check(self.cfg, prev, obs.record, obs.state)
                if message:
                    return Violation(p.id, obs.record.step, message)
        trace = _MiniTrace(self.cfg, [prev, obs.state], [obs.record])
        reqs = {r.rid: r for r in obs.state.requests}
        ctx = Context(trace, lambda rid: self.policy.fits_alone(self.cfg, reqs[rid]), max_overtakes=10**9)
        for pid in PER_STEP_TRACE_CHECKS:
            found = REGISTRY[pid].trace_check(ctx)
            if found:
                return found[0]
        return self.check_outputs(obs)

    def check_outputs(self, obs: Observation) -> Optional[Violation]:
        """Every request that finishes has exactly the tokens greedy `model.generate` gives."""
        if self.reference_outputs is None:
            return None
        for rid in obs.record.finished:
            got = obs.outputs.get(rid)
            if self.adds[rid].prompt == 0:
                # greedy `model.generate` needs an input token, so an empty prompt has no reference tokens (the
                # engine, batched with another request, still returns some); its output length is still known
                if len(got or ()) != self.adds[rid].max_new:
                    return Violation(ORACLE, obs.record.step,
                                     f"r{rid} (an empty prompt) finished with {len(got or ())} tokens, "
                                     f"not max_new {self.adds[rid].max_new}")
                continue
            want = self.reference_outputs(self.adds[rid])
            if got != want:
                return Violation(ORACLE, obs.record.step,
                                 f"r{rid} finished with tokens {list(got or ())} but greedy generate gives {list(want)}")
        return None

    @staticmethod
    def _align(prev: State, cur: State) -> State:
        if len(prev.requests) >= len(cur.requests):
            return prev
        extra = tuple(dataclasses.replace(r, phase=Phase.PENDING, computed=0, generated=0, blocks=0,
                                          shared_blocks=0, host_blocks=0, reason="")
                      for r in cur.requests[len(prev.requests):])
        return dataclasses.replace(prev, requests=prev.requests + extra)


@dataclasses.dataclass
class ReplayResult:
    observations: list[Observation]
    violation: Optional[Violation]
    actions_run: int


def replay(target: Target, cfg: EngineConfig, actions: list[Action], reference_outputs=None) -> ReplayResult:
    """Run the actions on a target, checking after every step; stop at the first violation."""
    checker = StepChecker(cfg, reference_outputs)
    observations = []
    try:
        for k, action in enumerate(actions):
            if isinstance(action, Add):
                checker.submitted(action)
            try:
                obs = target.apply(action)
            except TargetHung as exc:
                return ReplayResult(observations, Violation("ENGINE-ERROR", len(observations), f"hung: {exc}"), k + 1)
            if obs is None:
                continue
            observations.append(obs)
            violation = checker.check(obs)
            if violation is None and hasattr(target, "conformance_check"):   # a lockstep model, if any
                violation = target.conformance_check(obs)
            if violation is not None:
                return ReplayResult(observations, violation, k + 1)
    finally:
        target.close()
    return ReplayResult(observations, None, len(actions))


def workload_actions(workload: Workload, steps: int, cfg: Optional[EngineConfig] = None) -> list[Action]:
    """The actions that drive a target through `steps` engine steps of a simulator workload: before
    step t, the requests arriving at t are submitted (in workload order, so rid i is request i, as
    the model numbers them) and those cancelled at t are cancelled; then the step. (A Workload keeps
    its requests in arrival order, so workload order is submission order.)

    A request with an `output_len` stops early: the simulator passes it in `Env.stops` from the first
    step at which its next token is its last (`Workload.env_at`), which only a run of the model knows;
    with `cfg` the model (`ReferenceTarget`) is run beside the actions and `Stop(i)` is issued before
    that step (a stop stays pending until the request samples, as `Env.stops` is passed until then).
    Without `cfg` such a workload is refused (ValueError)."""
    early = [i for i, r in enumerate(workload.requests) if r.output_len is not None]
    if early and cfg is None:
        raise ValueError(f"r{early[0]} stops early after {workload.requests[early[0]].output_len} tokens: "
                         "its Stop needs the model run (pass cfg)")
    beside = ReferenceTarget(cfg) if early else None
    stopped: set[int] = set()
    actions: list[Action] = []
    for t in range(steps):
        step = [Add(i, r.prompt, r.max_new, r.prefix_group, r.prefix_len, r.priority)
                for i, r in enumerate(workload.requests) if r.arrival == t]
        step += [Cancel(i) for i, r in enumerate(workload.requests) if r.cancel_at == t]
        if beside is not None:
            for a in step:
                beside.apply(a)
            state = beside.state
            for i in early:
                r = state.requests[i] if i < len(state.requests) else None
                if (i not in stopped and r is not None and not r.phase.terminal
                        and r.generated + 1 >= workload.requests[i].output_len):
                    stopped.add(i)
                    step.append(Stop(i))
                    beside.stop(i)
            beside.step()
        actions += step + [Step()]
    return actions


# -- configurations as plain data (for reports and generated tests) ---------------------------

def config_to_dict(cfg: EngineConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["options"] = dataclasses.asdict(cfg.options)
    return d


def config_from_dict(d: dict) -> EngineConfig:
    d = dict(d)
    options = {k: v for k, v in d.pop("options").items() if v is not None}
    policy = POLICIES[d["policy"]]
    cfg = EngineConfig(options=build_options(policy.Options, options), **d)
    policy.check_config(cfg)
    return cfg


def action_code(a: Action) -> str:
    if isinstance(a, Step):
        return "Step()"
    return repr(a)


_ACTIONS = {"Add": Add, "Cancel": Cancel, "Stop": Stop, "Step": Step}


def action_from_code(text: str) -> Action:
    """The inverse of `action_code`, for a report read back: one call of Add, Cancel or Step with
    integer literal arguments, nothing evaluated (ValueError otherwise, naming what is wrong)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not an action") from None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ACTIONS):
        raise ValueError(f"{text!r} is not Add(...), Cancel(...), Stop(...) or Step()")

    def value(arg):
        v = arg.value if isinstance(arg, ast.Constant) else None
        if isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub) and isinstance(arg.operand, ast.Constant):
            v = -arg.operand.value if isinstance(arg.operand.value, int) else None
        if type(v) is not int:
            raise ValueError(f"{text!r}: arguments must be integers")
        return v
    try:
        return _ACTIONS[node.func.id](*[value(a) for a in node.args],
                                      **{k.arg: value(k.value) for k in node.keywords})
    except TypeError as exc:
        raise ValueError(f"{text!r}: {exc}") from None


def without(actions: list[Action], k: int) -> list[Action]:
    """The action list less its k-th action. Less an `Add`, the request is gone: its cancels and stops go too, and
    the later requests' ids move down one, since ids are assigned in submission order."""
    gone = actions[k]
    rest = actions[:k] + actions[k + 1:]
    if not isinstance(gone, Add):
        return rest
    out = []
    for a in rest:
        if isinstance(a, (Cancel, Stop)) and a.rid == gone.rid:
            continue
        if isinstance(a, (Add, Cancel, Stop)) and a.rid > gone.rid:
            a = dataclasses.replace(a, rid=a.rid - 1)
        out.append(a)
    return out


def reduce_actions(make_target: Callable[[], Target], cfg: EngineConfig, actions: list[Action], violation: Violation,
                   error_kind: Optional[str] = None, reference_outputs=None,
                   budget_s: float = 20.0) -> tuple[list[Action], Optional[ReplayResult]]:
    """After Hypothesis's shrink, delete actions one at a time (from the last), keeping a deletion whenever a
    replay on a fresh target still breaks the same property with the same error kind (the pair that tells
    findings apart, stateful.failure_type), until a pass deletes nothing or `budget_s` is spent.
    Hypothesis cannot delete a rule whose removal changes which rules are enabled later (a submission, once the
    machine stops accepting submissions), so its shrunk lists can keep requests the failure never needed; a
    replay decides here, as the regression test will. Returns the list and the replay of it that showed the
    failure (None when nothing was deleted: the caller has replayed the list it gave)."""
    deadline = time.monotonic() + budget_s
    kept: Optional[ReplayResult] = None
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for k in range(len(actions) - 1, -1, -1):
            if time.monotonic() >= deadline:
                break
            if k >= len(actions):
                continue
            trial = without(actions, k)
            result = replay(make_target(), cfg, trial, reference_outputs)
            kind = result.observations[-1].record.error_kind if result.observations else None
            if result.violation is not None and result.violation.property == violation.property and kind == error_kind:
                actions, violation, kept, changed = trial[:result.actions_run], result.violation, result, True
    return actions, kept
