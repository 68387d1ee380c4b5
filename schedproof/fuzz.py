"""`schedproof fuzz`: the stateful search on one target, a shrunk counterexample, a report and a
regression test that replays it. No printing here: the command line prints."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import ExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from model import releases
from model.state import State
from targets import get_target
from targets import stateful
from targets.checking import ReplayResult, action_code, config_to_dict, reduce_actions, replay

from . import interrupts
from .regression import actions_regression_test


@dataclasses.dataclass
class FuzzResult:
    status: str                       # "found" | "none"
    target: str
    seed: int
    examples: int
    seconds: float
    failure: Optional[stateful.Failure] = None
    replayed: Optional[ReplayResult] = None
    flags: str = ""                   # the search options, as command-line flags
    interrupted: str = ""             # the signal that cut the search short ("SIGINT"), if one did
    loop: str = ""                    # the engine loop the search drove (targets/stateful.py `loop_of`)

    @property
    def command(self) -> str:
        return f"schedproof fuzz --target {self.target} --seed {self.seed} --examples {self.examples}{self.flags}"

    @property
    def property(self) -> Optional[str]:
        return self.failure.violation.property if self.failure else None

    def as_dict(self) -> dict:
        d = {"status": self.status, "target": self.target, "loop": self.loop, "property": self.property,
             "seed": self.seed, "command": self.command,
             "examples": self.examples, "seconds": round(self.seconds, 2), "actions": []}
        if self.failure:
            d["actions"] = [action_code(a) for a in self.failure.actions]
            d["message"] = self.failure.violation.message
            d["config"] = config_to_dict(self.failure.cfg)
            d["release"] = releases.named(self.failure.cfg)   # the modelled release the engine was held to
            d["reproduced_on_replay"] = bool(self.replayed and self.replayed.violation
                                             and self.replayed.violation.property == self.property)
            d["steps"] = [_step_summary(o.state, o.record) for o in (self.replayed.observations if self.replayed else [])]
        if self.interrupted:
            # found before the signal: shrinking may not have finished, and it was not replayed
            d["interrupted"] = self.interrupted
        return d


REDUCE_SECONDS = 20.0   # `fuzz --reduce`: the replays' budget (targets/checking.py reduce_actions)


def fuzz(target_name: str, examples: int, seed: int, steps: int = 30, step_timeout_s: float = 10.0,
         fitting_only: bool = False, empty_prompts: bool = True, drain: bool = False,
         reduce_s: float = 0.0, sync: bool = False, database: Optional[ExampleDatabase] = None) -> FuzzResult:
    """Search `target_name` in its engine's default mode (vLLM: async scheduling), or with `sync` in its
    synchronous loop (ValueError where the target has no such choice). With a `database` the search first
    replays the failures saved there by earlier searches of the same target and options (Hypothesis's reuse
    phase), and saves its own: `fuzz --workers` shares one among its seeds (schedproof/campaign.py)."""
    target_cls = get_target(target_name)
    configs = stateful.sync_configs(target_cls) if sync else None
    loop = stateful.loop_of(target_cls, sync)
    machine = stateful.machine_for(target_cls, configs=configs, step_timeout_s=step_timeout_s,
                                   fitting_only=fitting_only, empty_prompts=empty_prompts, drain=drain)
    # Hypothesis keys a stateful test in the database by a digest of the machine class (stateful.py
    # get_state_machine_test: reflection.function_digest, the class's source and signature). That is the same in
    # every process, but machine_for builds every target's machine, whatever the options, from one class
    # statement, so it is the same for all of them too: a reference search's reuse phase would replay the examples
    # a vLLM search saved and delete every one that does not fail on the reference. The digest also takes the class's
    # `_hypothesis_internal_add_digest` (what Hypothesis sets to tell pytest's parametrized cases apart): it
    # names the target and the options that change what a saved choice sequence means, so the key is stable
    # across processes and distinct per search.
    machine._hypothesis_internal_add_digest = (
        f"schedproof fuzz {target_name} steps={steps} sync={sync} fitting_only={fitting_only} "
        f"empty_prompts={empty_prompts} drain={drain}").encode()
    hypothesis.seed(seed)(machine)
    run_settings = settings(max_examples=examples, stateful_step_count=steps, deadline=None, database=database,
                            derandomize=False, print_blob=False, report_multiple_bugs=False,
                            suppress_health_check=list(HealthCheck),
                            # the explain phase replays the failure hundreds of times to annotate it:
                            # costly on a real engine, and the report already lists every action
                            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
    stateful.LAST_FAILURE = None
    start = time.perf_counter()
    stopped = ""
    try:
        run_state_machine_as_test(machine, settings=run_settings)
    except stateful.PropertyFailure:
        pass
    except interrupts.Interrupted as stop:
        stopped = stop.name
    seconds = time.perf_counter() - start
    failure = stateful.LAST_FAILURE
    flags = f" --steps {steps}" + (" --fitting-only" if fitting_only else "") + \
        ("" if empty_prompts else " --no-empty-prompts") + (" --drain" if drain else "") + \
        (" --reduce" if reduce_s > 0 else "") + (" --sync" if sync else "") + \
        (f" --database {database.path}" if getattr(database, "path", None) else "")
    if failure is None:
        return FuzzResult("none", target_name, seed, examples, seconds, flags=flags, interrupted=stopped, loop=loop)
    if stopped:     # saved at once, unreplayed: a replay on a real engine could outlast the signal's grace
        return FuzzResult("found", target_name, seed, examples, seconds, failure, None, flags, stopped, loop)
    target = target_cls(failure.cfg, step_timeout_s=step_timeout_s)
    reference = getattr(target, "greedy_output", None)
    replayed = replay(target, failure.cfg, failure.actions, reference)
    if replayed.violation is not None and reduce_s > 0:
        kind = replayed.observations[-1].record.error_kind if replayed.observations else None
        actions, reduced = reduce_actions(lambda: target_cls(failure.cfg, step_timeout_s=step_timeout_s),
                                          failure.cfg, failure.actions, replayed.violation, kind, reference,
                                          budget_s=reduce_s)
        if reduced is not None:          # its replay is the report's: no need to run the shorter list again
            failure, replayed = stateful.Failure(failure.cfg, actions, reduced.violation), reduced
    seconds = time.perf_counter() - start
    return FuzzResult("found", target_name, seed, examples, seconds, failure, replayed, flags, loop=loop)


def _step_summary(state: State, record) -> dict:
    return {
        "step": record.step,
        "scheduled": [list(x) for x in record.scheduled],
        "free_blocks": state.free_blocks,
        "requests": [{"rid": r.rid, "phase": r.phase.name.lower(), "computed": r.computed,
                      "generated": r.generated, "blocks": r.blocks} for r in state.requests],
        **({"error": record.error} if record.error else {}),
    }


def write_report(result: FuzzResult, folder: Path) -> tuple[Path, Path]:
    """The report (JSON: actions first, then per-step states, then the property) and a pytest
    file that replays the actions on the same target and expects the same property to fail.
    Never overwrites: a name already taken (another run with the same target, property and seed)
    gets the next free suffix, _2, _3, ...; each file appears whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    base = f"{result.target}_{result.property.lower().replace('-', '_')}_seed{result.seed}"
    report_text, test_text = json.dumps(result.as_dict(), indent=2), regression_test(result)
    for k in itertools.count(1):
        stem = base if k == 1 else f"{base}_{k}"
        report, test = folder / f"{stem}.json", folder / f"test_{stem}.py"
        if not _publish(report, report_text):
            continue
        if _publish(test, test_text):
            return report, test
        report.unlink()      # the test's name is taken: both move on to the next suffix


def _publish(path: Path, text: str) -> bool:
    """Write `path` atomically, only if no file has that name: the text goes to a temporary file
    in the same folder, which is then linked to its name (refused if the name exists)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


def regression_test(result: FuzzResult) -> str:
    f = result.failure
    return actions_regression_test(result.command, result.target, config_to_dict(f.cfg),
                                   [action_code(a) for a in f.actions], f.violation.property, f.violation.message)
