"""One finding, whatever found it: `run` (a scenario simulated), `check` (a solver counterexample,
replayed in the simulator) or `fuzz` (a shrunk action list on a target). A report folder is
written from a `Finding` (schedproof/reportdir.py); nothing here prints or writes.

Every finding carries a model-shaped trace (states and step records, as the properties see them)
and a way to re-check a changed configuration: the scenario's or the counterexample's workload
re-simulated, or the fuzz actions re-run on the model, every property checked.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from checkers.replay import replay as replay_cex
from model.config import ConfigError, EngineConfig
from model.policy import POLICIES
from model.simulator import Workload, simulate
from model.state import Phase, State, StepRecord
from properties import REGISTRY, evaluate
from properties.registry import Violation
from targets.checking import PER_STEP_TRACE_CHECKS, action_code, action_from_code, replay
from targets.reference import ReferenceTarget


def _headline_rank() -> dict[str, int]:
    """When several properties fail at one step, the lead is the one a replay on a target reports
    first (targets/checking.py StepChecker): the per-step checks in registry order, then the trace
    checks it runs per step, then the rest; so a report and its replay name the same property."""
    order = [p.id for p in REGISTRY.values() if p.step_check is not None] + list(PER_STEP_TRACE_CHECKS)
    order += [p for p in REGISTRY if p not in order]
    return {p: i for i, p in enumerate(order)}


@dataclasses.dataclass
class Finding:
    kind: str                         # "run" | "check" | "fuzz"
    name: str                         # the scenario's name, or a name made from target, property and seed
    verdict: str                      # deadlock | livelock | crash | violation | ok | unknown (as `run` says it)
    completeness: str                 # how far the verdict goes, in words
    cfg: EngineConfig
    states: list[State]               # len(records) + 1, every state holding every request
    records: list[StepRecord]
    violations: list[Violation]       # all of them, by step; `headline` picks the lead
    target: str = "model"             # where the trace ran: the model, or an engine target
    workload: Optional[Workload] = None
    actions: Optional[list[str]] = None   # fuzz: the shrunk actions, as code
    description: str = ""
    source: dict = dataclasses.field(default_factory=dict)    # file, command, seed
    timings: dict = dataclasses.field(default_factory=dict)
    max_overtakes: int = 10 ** 9
    extra: dict = dataclasses.field(default_factory=dict)     # what the finder adds (check: shortest among ...)
    # check: the search over the design's whole space re-run with the changed fields (schedproof/check.py)
    search_again: Optional[Callable[[dict], tuple[bool, str]]] = None

    @property
    def headline(self) -> Optional[Violation]:
        if not self.violations:
            return None
        first = min(v.step for v in self.violations)
        at = [v for v in self.violations if v.step == first]
        rank = _headline_rank()
        return min(at, key=lambda v: (rank.get(v.property, len(rank)), v.property))

    def lead_first(self) -> list[Violation]:
        """The violations with the headline first (what the diagnosis explains)."""
        head = self.headline
        return [head] + [v for v in self.violations if v is not head] if head else []

    def recheck(self, cfg: EngineConfig, fields: dict) -> tuple[bool, str]:
        """Re-run this finding's search with `cfg` (its `fields` changed): (no property violated, what
        happened). The finding's own workload or actions first; a `check` finding then searches its
        whole design space again with the change, where the workload no longer fails."""
        if self.workload is not None:
            ok, text = _recheck_workload(cfg, self.workload, len(self.records), self.max_overtakes, self.kind)
        else:
            ok, text = _recheck_actions(cfg, self.actions or [])
        if ok and self.search_again is not None:
            ok, more = self.search_again(fields)
            text = f"{text}; {more}"
        return ok, text


def from_run(result) -> Finding:
    """`run` (schedproof/runner.py RunResult) on a scenario."""
    s, tr = result.scenario, result.trace
    complete = ("complete for this workload: the run ended "
                + {"done": "with every request answered", "error": "when the engine raised",
                   "fixpoint": "in a state that repeats itself with nothing left to arrive (it never changes again)",
                   "cycle": "in a cycle of states with nothing left to arrive"}.get(tr.end, f"({tr.end})"))
    if tr.end == "limit":
        complete = f"unknown: the step limit ({len(tr.records)} steps) ended the run before anything can be claimed"
    return Finding("run", s.name, result.verdict, complete, s.cfg, list(tr.states), list(tr.records),
                   list(result.evaluation.violations), workload=s.workload, description=s.description,
                   source={"file": s.path, "command": f"schedproof run {s.path}"},
                   timings={"run_seconds": round(result.seconds, 3)}, max_overtakes=s.max_overtakes)


def from_check(path: str, result, rep, name: str, description: str = "") -> Finding:
    """A `check` counterexample (checkers/bmc.py BmcResult) and its simulator replay (checkers/replay.py)."""
    tr, cex = rep.trace, result.cex
    scope = result.scope or "the whole space"
    complete = f"violated at depth {cex.depth} ({cex.steps} engine steps); shortest among {scope}"
    if result.scope and result.certified is not None:
        complete += (f"; {result.certified_in or 'the whole space'} has no violation in at most "
                     f"{result.certified} transitions")
    extra = {"depth": cex.depth, "engine_steps": cex.steps, "shortest_in": scope, "minimised": result.minimised,
             "replay": rep.message}
    return Finding("check", name, rep.evaluation.verdict, complete, tr.cfg, list(tr.states), list(tr.records),
                   list(rep.evaluation.violations), workload=tr.workload, description=description,
                   source={"file": path, "command": f"schedproof check {path}"},
                   timings={"found_seconds": round(result.found_seconds, 3), "seconds": round(result.seconds, 3)},
                   extra=extra)


def from_claim(verdict) -> Optional[Finding]:
    """A `prove` claim refuted by its bounded search (proofs/run.py Verdict with a counterexample),
    replayed in the simulator; None for a claim without a trace (proved, or refuted by induction)."""
    if verdict.cex is None:
        return None
    rep = replay_cex(verdict.cex)
    if not rep.ok:
        return None      # never reported unreplayed (the verdict line already says it did not replay)
    claim, cex, tr = verdict.claim, verdict.cex, rep.trace
    complete = (f"{verdict.line}: violated at depth {cex.depth} ({cex.steps} engine steps), the claim's bounded "
                f"search over {claim.class_text}")
    return Finding("prove", claim.name, rep.evaluation.verdict, complete, tr.cfg, list(tr.states), list(tr.records),
                   list(rep.evaluation.violations), workload=tr.workload, description=claim.statement,
                   source={"command": f"schedproof prove {claim.policy}", "claim": claim.name},
                   timings={"seconds": round(verdict.seconds, 3)},
                   extra={"depth": cex.depth, "engine_steps": cex.steps, "replay": rep.message})


def from_fuzz(result) -> Finding:
    """A `fuzz` find (schedproof/fuzz.py FuzzResult), with the replay of its shrunk actions."""
    finding = from_actions("fuzz", result.target, result.failure, result.replayed,
                           {"command": result.command, "seed": result.seed, "examples": result.examples},
                           result.seconds)
    if result.target != "reference":
        agrees, account = _on_model(finding.cfg, result.failure.actions, finding.violations[0])
        finding.extra["model_agrees"] = agrees
        if account:
            finding.extra["model_account"] = account
    return finding


def from_actions(kind: str, target: str, failure, replayed, source: dict, seconds: float) -> Finding:
    """A shrunk action list that failed on a target (`failure`, targets/stateful.py Failure), with its replay."""
    cfg = failure.cfg
    observations = replayed.observations if replayed else []
    states, records = _padded(cfg, [o.state for o in observations]), [o.record for o in observations]
    violation = replayed.violation if replayed and replayed.violation else failure.violation
    complete = ("violated on the target: the shrunk action list reproduces it" if replayed
                and replayed.violation and replayed.violation.property == failure.violation.property
                else "found by the search; the replay of the shrunk actions did not reproduce it")
    name = f"{target}_{failure.violation.property.lower().replace('-', '_')}_seed{source.get('seed', 0)}"
    verdict = "deadlock" if violation.property == "LIVE-NO-PROGRESS" else (
        "crash" if violation.property == "ENGINE-ERROR" else "violation")
    return Finding(kind, name, verdict, complete, cfg, states, records, [violation], target=target,
                   actions=[action_code(a) for a in failure.actions], source=source,
                   timings={"search_seconds": round(seconds, 2)})


def _on_model(cfg: EngineConfig, actions, violation: Violation) -> tuple[bool, Optional[str]]:
    """Whether the model fails the same actions with the same property, and its message where it also
    fails at the same step and says something else: the model names the mechanism where the engine's
    own error may only name a tensor shape."""
    try:
        v = replay(ReferenceTarget(cfg), cfg, list(actions)).violation
    except ConfigError:     # the model refuses the design: no account
        return False, None
    if v is None or v.property != violation.property:
        return False, None
    return True, (v.message if v.step == violation.step and v.message != violation.message else None)


def _padded(cfg: EngineConfig, after_steps: list[State]) -> list[State]:
    """A target's observations hold the requests submitted so far: every state gets every request
    (those not yet submitted as pending), and the initial state is put in front."""
    if not after_steps:
        return []
    final = after_steps[-1].requests
    pending = [dataclasses.replace(r, phase=Phase.PENDING, computed=0, generated=0, blocks=0, shared_blocks=0,
                                   host_blocks=0, suspended=False, preemptions=0, reason="") for r in final]
    initial = dataclasses.replace(after_steps[0], step=0, requests=tuple(pending), free_blocks=cfg.num_blocks,
                                  free_host_blocks=cfg.host_blocks, prefix_cache=(), error=None,
                                  sched=POLICIES[cfg.policy].initial_sched(cfg))
    own = type(initial.sched)
    out = [initial]
    for s in after_steps:
        # an engine's own view of its queues (not the policy's `Sched`) stays out of the trace
        sched = s.sched if type(s.sched) is own else None
        out.append(dataclasses.replace(s, requests=s.requests + tuple(pending[len(s.requests):]), sched=sched))
    return out


def _recheck_workload(cfg: EngineConfig, workload: Workload, steps: int, max_overtakes: int,
                      kind: str) -> tuple[bool, str]:
    trace = simulate(cfg, workload, max_steps=4 * steps + 1000)
    reqs = trace.states[0].requests
    ev = evaluate(trace, lambda rid: POLICIES[cfg.policy].fits_alone(cfg, reqs[rid]), max_overtakes)
    where = "this workload" if kind == "run" else "the counterexample's workload"
    done = sum(1 for r in trace.final.requests if r.phase == Phase.FINISHED)
    if trace.end == "limit":
        return False, f"unknown: re-run on {where} hit its step limit ({len(trace.records)} steps)"
    if not ev.violations:
        return True, f"re-run on {where}: no property violated ({done}/{len(reqs)} requests complete)"
    v = ev.violations[0]
    return False, f"still fails on {where}: {ev.verdict}, {v.property} at step {v.step}"


def _recheck_actions(cfg: EngineConfig, actions: list[str]) -> tuple[bool, str]:
    result = replay(ReferenceTarget(cfg), cfg, [action_from_code(a) for a in actions])
    if result.violation is None:
        return True, f"re-run of the {len(actions)} actions on the model: no property violated"
    v = result.violation
    return False, f"still fails when the actions are re-run on the model: {v.property} at step {v.step}"
