"""`schedproof check FILE`: load a design with ranges, search it, replay what is found, print it."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Optional

import model.symbolic.cores  # noqa: F401  (registers every core)
from checkers import clock
from checkers.bmc import SearchEvent, search
from checkers.replay import replay
from checkers.space import hi, lo
from model import releases
from model.config import ConfigError
from model.simulator import RequestSpec, Workload
from model.symbolic.core import CORES
from model.symbolic.slots import Params
from properties.symbolic import PRIORITY
from targets import TargetUnavailable, UnknownTarget, get_target
from targets.checking import replay as replay_on_target
from targets.checking import workload_actions

from proofs.review import decide

from . import checkreport, interrupts, reportdir, verdictreport
from .checkspec import load_check
from .diagnosis import apply, diagnose
from .finding import from_check
from .scenario import ScenarioError

EXIT_OK, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def run_check(path: str, budget: float, max_depth: Optional[int], properties: Optional[list[str]],
              accelerate: bool, as_json: bool, note: Callable[[str], None],
              live: Optional[Callable[[str, str], None]] = None, target: Optional[str] = None,
              step_timeout: float = 10.0, report: Optional[Path] = None,
              proofs_first: bool = False, timeout: Optional[float] = None) -> tuple[int, str]:
    """(exit status, what to print); `note` receives the opening line for stderr. `budget`: seconds of
    solving (checkers/clock.py), which the verdict depends on; `timeout`: a wall-clock cap on top (None:
    `default_wall_cap`), whose verdicts say they were cut by it. The file is decided
    by every route (proofs/review.py): the proved claims whose class holds its runs, the bounded search
    outside them, and an inferred invariant (`proofs_first`: before the search, as `prove FILE` asks).
    `live`, where given, receives ("status", line) as the search deepens and ("found", text) with each
    counterexample as soon as it is found and replayed, before certification goes on. With
    `target`, the counterexample is also run on that engine (`on_engine`) and the report says
    whether the same property fails there."""
    spec = load_check(path)
    target_cls = None
    if target is not None:
        try:
            target_cls = get_target(target)
        except UnknownTarget as exc:   # a name no target has: the flag is bad input; any other problem is the
            raise ScenarioError(path, "--target", str(exc)) from None   # target's own (exit 4 / 5, cli.main)
        runs = getattr(target_cls, "policy", None)
        if runs is not None and runs != spec.space.template.policy:
            raise ScenarioError(path, "--target", f"the {target} target runs {runs!r} designs, this file is "
                                                  f"{spec.space.template.policy!r}")
    policy = spec.space.template.policy
    core = CORES.get(policy)
    if core is None:
        raise ScenarioError(path, "engine.policy", f"the symbolic checker has no core for {policy!r} "
                                                   f"(cores: {', '.join(sorted(CORES))})")
    problem = _unsupported_groups(core, spec)
    if problem:
        raise ScenarioError(path, problem[0], problem[1])
    props = properties or (list(spec.properties) if spec.properties else None)
    if props:
        for p in props:
            if p not in PRIORITY:
                raise ScenarioError(path, "--property", f"{p!r} is not a property the checker searches "
                                                        f"(known: {', '.join(PRIORITY)})")
    depth = max_depth or spec.max_depth
    command = "prove" if proofs_first else "check"
    wall = default_wall_cap(budget) if timeout is None else timeout
    note(f"schedproof {command}: {path}: {policy}, {spec.space.slots} request slots, depth <= {depth}, "
         f"budget {budget:g} s of solving, wall-clock cap {wall:g} s")
    if spec.description:
        note("  " + " ".join(spec.description.split()))
    so_far = _SoFar(None if live is None else _live_progress(live))
    with clock.cap(wall) as capped:
        review, stop = interrupts.until_signal(
            lambda: decide(core, spec.space, list(props or PRIORITY), depth, budget, proofs_first, accelerate,
                           progress=so_far, note=note))
    if stop is not None:
        return stop.status, _interrupted(path, stop, so_far, as_json)
    result = review.search
    stopped_by = _stopped_by(result, capped, budget)
    if review.status == "proved":
        return EXIT_OK, _proved(path, spec, review, as_json, report)
    rep = None
    engine = None
    if result.status == "violated":
        rep = replay(result.cex)
        if not rep.ok:
            # Never report a trace the simulator does not reproduce: that is a defect of the checker.
            result.status, result.reason = "unknown", f"the solver's trace did not replay: {rep.message}"
        elif target_cls is not None:
            engine = on_engine(target_cls, result.cex, len(rep.trace.records), step_timeout)
    proved = []
    if result.lemmas is not None:
        lem = result.lemmas
        kept = len(lem.names)
        line = (f"invariants: {kept}/{kept + len(lem.dropped)} proved inductive for the space of this result "
                f"and used as lemmas ({lem.seconds:.1f} s)")
        if lem.dropped:
            line += f"; left out (not proved in time or refuted): {', '.join(lem.dropped)}"
        proved.append(line)
    written = None
    if result.status == "violated":
        finding = from_check(path, result, rep, spec.name, spec.description)
        finding.search_again = _search_again(core, spec, depth, props, accelerate, min(60.0, budget / 4))
        if engine is not None:
            finding.extra["on_engine"] = dataclasses.asdict(engine)
        if report is not None:
            written = reportdir.write(finding, report)
            cause = json.loads((written / "report.json").read_text())["cause"]
        else:
            cause = diagnose(finding.cfg, finding.states, finding.records, finding.lead_first()).cause
    if report is not None and result.status != "violated":
        written = verdictreport.write(report, path, spec.name, review, result, spec.space.slots)
    if as_json:
        d = checkreport.as_dict(path, result, rep)
        d.update(budget=budget, timeout=wall, stopped_by=stopped_by, release=releases.named(spec.space.template))
        d["proofs"] = verdictreport.as_dict(review)
        if engine is not None:
            d["engine"] = dataclasses.asdict(engine)
        if result.status == "violated":
            d["cause"] = cause
        if written is not None:
            d["report"] = str(written)
        text = json.dumps(d, indent=2)
    else:
        text = checkreport.as_text(path, result, rep, proved + verdictreport.review_lines(review))
        if result.status == "violated":
            text += f"\ncause: {cause}"
        if engine is not None:
            text += "\n" + engine.line()
        if written is not None:
            text += f"\nreport: {written}/report.html"
    return {"violated": EXIT_VIOLATED, "bounded": EXIT_OK, "unknown": EXIT_UNKNOWN,
            TIMED_OUT: EXIT_UNKNOWN}[result.status], text


# With no --timeout, the wall-clock cap is this many times the budget, plus a minute for the Python work the clock
# does not count (building the encodings): far enough that on this machine, busy, the budget is spent first (and the
# verdict is reproducible), near enough that a run still ends.
WALL_CAP_FACTOR, WALL_CAP_FLOOR = 3.0, 60.0


def default_wall_cap(budget: float) -> float:
    return WALL_CAP_FACTOR * budget + WALL_CAP_FLOOR
# the status of a search the wall-clock cap stopped before its budget was spent: not reproducible
TIMED_OUT = "timeout"


def _stopped_by(result, capped: clock.Cap, budget: float) -> Optional[str]:
    """What ended the search short of its depth: "budget" (reproducible), "timeout" (the wall-clock cap) or
    None. An unknown cut by the cap gets its own status, so that it cannot be read as one the budget ended."""
    if result is None:          # proved by the claims or an invariant: no search was needed
        return "timeout" if capped.cut else None
    if capped.cut:
        if result.status == "unknown":
            result.status = TIMED_OUT
            result.reason = (f"the wall-clock cap ({capped.seconds:g} s) passed before the budget ({budget:g} s of "
                             f"solving) was spent: not reproducible")
        return "timeout"
    if result.status == "unknown" and result.reason == "time-out":
        result.reason = f"budget spent ({budget:g} s of solving)"
        return "budget"
    if result.status == "violated" and result.certified is not None:
        return "budget"          # the trace is certified as far as the budget went
    return None


def _proved(path: str, spec, review, as_json: bool, report: Optional[Path]) -> str:
    written = verdictreport.write(report, path, spec.name, review, None, spec.space.slots) if report else None
    if as_json:
        d = {"file": path, "status": "proved", "seconds": round(review.seconds, 3), "depth": None, "notes": [],
             "property": None, "trace": None, "config": None, "proofs": verdictreport.as_dict(review),
             "release": releases.named(spec.space.template)}
        if written is not None:
            d["report"] = str(written)
        return json.dumps(d, indent=2)
    text = verdictreport.proved_text(path, review, spec.space.slots)
    if written is not None:
        text += f"\nreport: {written}/report.html"
    return text


@dataclasses.dataclass
class EngineReplay:
    """A counterexample run on a real engine (`check --target`): whether the property the model
    violates fails there too, and what the engine did instead where it does not."""
    target: str
    same: bool                      # the engine violates the counterexample's property
    property: Optional[str]         # what the engine violated first (None: nothing)
    step: Optional[int]
    message: str
    steps_run: int
    ran: bool = True                # False: the engine could not be started for this design

    def line(self) -> str:
        if not self.ran:
            return f"on the engine ({self.target}): {self.message}"
        if self.same:
            return (f"on the engine ({self.target}): {self.property} at step {self.step} too, as the model "
                    f"predicts: {self.message}")
        if self.property is None:
            return (f"on the engine ({self.target}): NOT reproduced: no property failed in {self.steps_run} engine "
                    f"steps ({self.message})")
        return (f"on the engine ({self.target}): NOT the same: {self.property} at step {self.step}: {self.message}")


def on_engine(target_cls, cex, steps: int, step_timeout: float) -> EngineReplay:
    """Drive the engine through the counterexample's workload for as many steps as the simulator's
    replay took, checking every property after each step (targets/checking.py, as `fuzz` does)."""
    name = target_cls.name
    try:
        actions = workload_actions(cex.workload, steps, cex.cfg)
        target = target_cls(cex.cfg, step_timeout_s=step_timeout)
    except (ValueError, TargetUnavailable, ConfigError) as exc:
        return EngineReplay(name, False, None, None, f"not run: {exc}", 0, ran=False)
    res = replay_on_target(target, cex.cfg, actions)
    v = res.violation
    if v is None:
        return EngineReplay(name, False, None, None, "the workload ran to its end", len(res.observations))
    return EngineReplay(name, v.property == cex.property, v.property, v.step, v.message, len(res.observations))


def _search_again(core, spec, depth: int, props, accelerate: bool, budget: float):
    """The search over the design's space with a suggested change applied (a knob the change sets is
    no longer a range): whether any run of at most `depth` transitions still violates a property."""
    def again(fields: dict) -> tuple[bool, str]:
        pinned = {k.removeprefix("engine.") for k in fields if not k.startswith("engine.options.")}
        try:
            template = apply(spec.space.template, fields)
        except ConfigError as exc:
            return False, f"the design space refuses it: {exc.field}: {exc.reason}"
        space = dataclasses.replace(spec.space, template=template,
                                    knobs={k: v for k, v in spec.space.knobs.items() if k not in pinned})
        found = search(core, space, depth, budget, props, accelerate, minimise=False)
        if found.status == "violated":
            return False, (f"still fails in the design space: {found.cex.property} at depth {found.cex.depth} "
                           f"({found.cex.steps} engine steps)")
        if found.status == "bounded":
            return True, f"the design space: no violation up to depth {found.depth} ({found.seconds:.0f} s)"
        if found.depth >= 1:     # as far as it got: said so, and the depth is in the words
            return True, (f"the design space: no violation up to depth {found.depth}, then {found.reason} "
                          f"before depth {depth} ({found.seconds:.0f} s)")
        return False, f"the design space: unknown, {found.reason} before depth 1 ({found.seconds:.0f} s)"
    return again


class _SoFar:
    """What the search has reported so far, kept for a run cut short by a signal; each event is
    passed on to the live display, where there is one."""

    def __init__(self, forward):
        self.forward, self.start = forward, time.monotonic()
        self.depth: Optional[SearchEvent] = None      # the last depth covered
        self.found = None                             # the best counterexample so far (a BmcResult)

    def __call__(self, event: SearchEvent) -> None:
        if interrupts.received():
            return       # after the signal a query may have been cancelled: nothing it says is a result
        if event.kind == "depth":
            self.depth = event
        else:
            self.found = event.result
        if self.forward is not None:
            self.forward(event)


def _interrupted(path: str, stop, so_far: _SoFar, as_json: bool) -> str:
    """A search cut short: the counterexample found so far (replayed; its certification did not
    finish), or how far the search got without one."""
    seconds = time.monotonic() - so_far.start
    found, rep = so_far.found, None
    if found is not None:
        rep = replay(found.cex)
        if not rep.ok:
            found = None     # never shown unreplayed
    if as_json:
        out = {"file": path, "status": "interrupted", "signal": stop.name, "seconds": round(seconds, 3),
               "depth": so_far.depth.depth if so_far.depth else 0,
               "stage": so_far.depth.stage if so_far.depth else None,
               "found": checkreport.as_dict(path, found, rep) if found is not None else None}
        return json.dumps(out, indent=2)
    head = f"interrupted by {stop.name} after {seconds:.1f} s"
    if found is not None:
        found.seconds = seconds
        return "\n".join([f"{head}: a counterexample was found; certifying it shortest did not finish",
                          checkreport.as_text(path, found, rep, [])])
    if so_far.depth is None:
        return f"{head}, before the first depth was searched: nothing is claimed"
    return f"{head}: {checkreport.progress_line(so_far.depth).split(';')[0]}; deeper runs are not covered"


def _live_progress(live: Callable[[str, str], None]):
    def progress(event):
        if event.kind == "depth":
            live("status", checkreport.progress_line(event))
        else:
            rep = replay(event.result.cex)
            if rep.ok:      # an unreplayed trace is never shown; the final report says what went wrong
                live("found", checkreport.found_text(event.result, rep, replaces=event.kind == "shorter"))
    return progress


def _unsupported_groups(core, spec):
    """A core that refuses some workload feature (a shared prefix, say) checks it on the groups."""
    specs = tuple(RequestSpec(prompt=lo(g.fields.get("prompt", 1)), max_new=lo(g.fields.get("max_new", 1)),
                              prefix_group=g.prefix_group, prefix_len=lo(g.fields.get("prefix_len", 0)))
                  for g in spec.space.groups)
    params = Params.of(Workload(specs))
    for end in (lo, hi):   # a knob range must be covered at both ends (host_blocks = [0, 4], say)
        cfg = dataclasses.replace(spec.space.template, **{k: end(v) for k, v in spec.space.knobs.items()})
        problem = core.unsupported(cfg, params)
        if problem:
            return problem
    return None
