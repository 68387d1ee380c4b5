"""`schedproof conform --target NAME`: drift between a real engine and its model, reported as a finding.

The lockstep campaign of targets/lockstep.py (the engine and its policy's model on the same Hypothesis workloads,
compared after every step). Agreement: a summary and exit 0, no folder. A divergence: the shrunk workload is
replayed on the engine with the model beside it, and a report folder is written like any finding's (report.html,
report.json, the trace, a regression test), with what a scheduler engineer needs to act on drift: the engine
release installed, the first step and field that differ, the model's and the engine's values, and where the
upstream source moved: the mirrored functions whose installed source differs from the modelled release's
(targets/vllm_sources.py, for vLLM). Exit 1.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Optional

from targets import get_target, vllm_sources
from targets.checking import replay
from targets.lockstep import ConformanceResult, conformance

from . import reportdir
from .finding import from_actions

PACKAGES = {"vllm": "vllm", "sglang": "sglang", "transformers": "transformers"}   # target -> its engine's package


@dataclasses.dataclass
class Conform:
    result: ConformanceResult
    release: str
    changed_sources: Optional[list[str]]   # None: the target's sources are not fingerprinted
    folder: Optional[Path] = None

    @property
    def sources(self) -> str:
        """Where the upstream source moved since the modelled release, in words."""
        if self.changed_sources is None:
            return "not fingerprinted for this target"
        if self.changed_sources:
            return "changed since the modelled release: " + "; ".join(self.changed_sources)
        return "every mirrored function as modelled (the divergence is the model's or the adapter's)"

    def lines(self) -> list[str]:
        out = [f"engine release: {self.release}"] + self.result.lines()
        if self.result.divergence is not None:
            out.append(f"upstream sources: {self.sources}")
            if self.folder is not None:
                out.append(f"report: {self.folder}/report.html")
        return out

    def as_dict(self) -> dict:
        r = self.result
        d = {"target": r.target, "release": self.release, "seed": r.seed, "workloads": r.tally.workloads,
             "agreed": r.agreed, "seconds": round(r.seconds, 2), "diverged": r.divergence is not None,
             "changed_sources": self.changed_sources}
        if r.divergence is not None:
            d["divergence"] = {"step": r.divergence.violation.step, "property": r.divergence.violation.property,
                               "message": r.divergence.violation.message}
            d["report"] = str(self.folder) if self.folder else None
        return d


def release_of(target: str) -> str:
    package = PACKAGES.get(target)
    if package is None:
        return "none (the model)"
    return str(getattr(importlib.import_module(package), "__version__", "?"))


def changed_sources(target: str) -> Optional[list[str]]:
    return vllm_sources.changed() if target == "vllm" else None


def conform(target: str, workloads: int, seed: int, steps: int, out: Path, sync: bool = False,
            step_timeout_s: float = 10.0) -> Conform:
    result = conformance(target, workloads, seed, steps, step_timeout_s=step_timeout_s, sync=sync)
    done = Conform(result, release_of(target), changed_sources(target))
    failure = result.divergence
    if failure is None:
        return done
    target_cls = get_target(target)
    replayed = replay(target_cls(failure.cfg, step_timeout_s=step_timeout_s), failure.cfg, failure.actions)
    command = f"schedproof conform --target {target} --workloads {workloads} --seed {seed} --steps {steps}" + \
        (" --sync" if sync else "")
    finding = from_actions("conform", target, failure, replayed,
                           {"command": command, "seed": seed, "examples": workloads}, result.seconds)
    finding.name = f"{target}_{done.release}_drift_seed{seed}".replace(".", "_")
    finding.extra.update({"engine_release": done.release, "changed_sources": done.changed_sources,
                          "first_divergence": failure.violation.message})
    finding.description = (f"Drift: the {target} engine {done.release} and the {failure.cfg.policy} model diverge at "
                           f"step {failure.violation.step}: {failure.violation.message}. Upstream sources: "
                           f"{done.sources}.")
    done.folder = reportdir.write(finding, out / finding.name, diagnose_changes=False)
    return done
