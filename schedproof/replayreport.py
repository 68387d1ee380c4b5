"""`schedproof replay REPORT [--target NAME]`: re-run a fuzz report's actions, on its own target or another.

A report of `fuzz` (schedproof/fuzz.py `write_report`) holds the target, the configuration as plain data,
the shrunk actions as code (`Add(rid=0, prompt=3, max_new=2)`, `Cancel(rid=1)`, `Step()`) and the property
found. Replaying it on the target it came from checks that it still reproduces; on another target (a
`reference` finding on the `transformers` engine, or back) it asks whether the engine and the model agree.
Every bad field of the report is a `ScenarioError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from model.config import ConfigError
from model.simulator import RequestSpec, Workload
from properties.registry import Violation
from targets import get_target
from targets.checking import ReplayResult, action_from_code, config_from_dict, replay, workload_actions
from targets.protocol import Action

from .reportdir import load
from .scenario import ScenarioError


@dataclasses.dataclass
class Report:
    path: str
    target: str
    property: Optional[str]
    cfg: object
    actions: list[Action]


def load_report(path: str) -> Report:
    """A fuzz report (.json), or a report folder of any command (schedproof/reportdir.py): a folder with
    a workload replays it on the model (the `reference` target) by default, submitting each request at
    its arrival step, for as many steps as the finding's trace."""
    if os.path.isdir(path):
        return _from_folder(path)
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise ScenarioError(path, "file", exc.strerror or str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(path, "file", f"not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(path, "file", "not a fuzz report (a JSON object is expected)")
    for field, typ in (("target", str), ("config", dict), ("actions", list)):
        if not isinstance(raw.get(field), typ):
            raise ScenarioError(path, field, f"missing or not a {typ.__name__}: not a fuzz report with a finding")
    if not raw["actions"]:
        raise ScenarioError(path, "actions", "empty: the report has no finding to replay")
    actions = _actions(path, raw["actions"])
    try:
        cfg = config_from_dict(raw["config"])
    except ConfigError as exc:
        raise ScenarioError(path, f"config.{exc.field.removeprefix('engine.')}", exc.reason) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(path, "config", f"not a configuration: {exc}") from None
    prop = raw.get("property")
    return Report(path, raw["target"], prop if isinstance(prop, str) else None, cfg, actions)


def _actions(source: str, texts: list) -> list[Action]:
    actions = []
    for k, text in enumerate(texts):
        try:
            actions.append(action_from_code(str(text)))
        except ValueError as exc:
            raise ScenarioError(source, f"actions[{k}]", str(exc)) from None
    return actions


def _from_folder(path: str) -> Report:
    loaded = load(path)
    data, cfg = loaded.data, loaded.trace.cfg
    source = f"{path}/report.json"
    if isinstance(data.get("actions"), list) and data["actions"]:
        actions = _actions(source, data["actions"])
        return Report(path, str(data.get("target") or "reference"), data.get("property"), cfg, actions)
    workload = loaded.trace.workload
    if workload is None:
        try:
            workload = Workload(tuple(RequestSpec(**r) for r in data["workload"]))
        except TypeError as exc:
            raise ScenarioError(source, "workload", f"not a workload: {exc}") from None
    steps = len(loaded.trace.records)
    return Report(path, "reference", data.get("property"), cfg, workload_actions(workload, steps, cfg))


@dataclasses.dataclass
class Outcome:
    report: Report
    target: str
    result: ReplayResult

    @property
    def violation(self) -> Optional[Violation]:
        return self.result.violation

    @property
    def same(self) -> bool:
        return self.violation is not None and self.violation.property == self.report.property

    def text(self) -> str:
        head = (f"replayed {self.result.actions_run} of {len(self.report.actions)} actions of {self.report.path} "
                f"on {self.target} ({len(self.result.observations)} engine steps)")
        v = self.violation
        if v is None:
            return f"{head}: nothing violated; the report's {self.report.property} does not reproduce"
        verdict = "the report's property" if self.same else f"not the report's {self.report.property}"
        return f"{head}: [{v.property}] at step {v.step} ({verdict}): {v.message}"

    def as_dict(self) -> dict:
        v = self.violation
        return {"report": self.report.path, "target": self.target, "report_property": self.report.property,
                "property": v.property if v else None, "step": v.step if v else None,
                "message": v.message if v else None, "same": self.same,
                "actions_run": self.result.actions_run, "engine_steps": len(self.result.observations)}


def replay_report(report: Report, target: str, step_timeout: float) -> Outcome:
    """Run the report's actions on `target` with every property checked after each step."""
    cls = get_target(target)
    try:
        engine = cls(report.cfg, step_timeout_s=step_timeout)
    except ConfigError as exc:
        raise ScenarioError(report.path, f"config.{exc.field.removeprefix('engine.')}",
                            f"{target} refuses it: {exc.reason}") from None
    return Outcome(report, target, replay(engine, report.cfg, report.actions, getattr(engine, "greedy_output", None)))
