"""Failures too rare for sampling: `check` against random search on design spaces where a violation exists but
is rare, side by side in one run.

    .venv/bin/python bench/rare_failures.py [--factor 10] [--seed 0] [FILE ...]

Each space is a check file under bench/rare/ (the default: all of them); its description says why the failure is
rare. For each:

1. `check`'s search (checkers.bmc.search on the policy's core, the file's properties and depth, a 60 s budget),
   timed to its first counterexample, which is then replayed in the simulator (untimed; a trace that does not
   replay is reported as such).
2. A uniform sampler: every ranged number of the file (knobs, request counts, every request field) drawn
   uniformly and independently from its range, the workload run on the engine-checked simulator
   (model.simulator.simulate) and the property registry evaluated as `schedproof run` does; it stops at the first
   workload violating a property the file searches.
3. Hypothesis on the same simulator: `@given` draws the same numbers with `st.integers` over the same ranges
   (seeded, no example database), and fails on the same properties.

The random searches get `--factor` (default 10) times the time `check` took to find its counterexample, each.
Spaces must fix early stops and cancellations (`[check] early_stops = false`, `cancellations = false`; a
cancellation is then a ranged `cancel_at`), so the uniform distribution is plain. Wall-clock on this machine; the
CPU column is steadier on a shared one.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import model.symbolic.cores  # noqa: E402,F401  (registers every core)
from checkers.bmc import search  # noqa: E402
from checkers.replay import replay  # noqa: E402
from checkers.space import Space, hi, lo  # noqa: E402
from model.config import ConfigError  # noqa: E402
from model.policy import POLICIES  # noqa: E402
from model.simulator import RequestSpec, Workload, simulate  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402
from properties import evaluate  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402

SPACES = ROOT / "bench" / "rare"
CHECK_BUDGET = 60.0
FIELDS = ("prompt", "max_new", "arrival", "output_len", "cancel_at", "prefix_len", "priority")


@dataclasses.dataclass
class Result:
    search: str
    found: bool
    seconds: float
    cpu: float
    tried: str
    note: str = ""


# -- the space as independent uniform draws -------------------------------------------------------

@dataclasses.dataclass
class Draws:
    """Every ranged number of a space in one flat list of (name, lo, hi), in a fixed order, and how to
    turn one value per entry into a design and a workload."""
    space: Space
    names: list[tuple[str, int, int]]

    @classmethod
    def of(cls, space: Space) -> "Draws":
        if space.early_stops or space.cancellations:
            raise SystemExit("rare_failures: a space must set early_stops = false and cancellations = false")
        names = [(f"knob.{k}", lo(v), hi(v)) for k, v in space.knobs.items() if lo(v) != hi(v)]
        for g, grp in enumerate(space.groups):
            if lo(grp.count) != hi(grp.count):
                names.append((f"g{g}.count", lo(grp.count), hi(grp.count)))
            for j in range(hi(grp.count)):
                names += [(f"g{g}.{j}.{f}", lo(v), hi(v)) for f, v in grp.fields.items() if lo(v) != hi(v)]
        return cls(space, names)

    def build(self, values: list[int]):
        """(config, workload), or None where the policy refuses the design or a request is cancelled
        before it arrives (outside the space check searches)."""
        val = dict(zip((n for n, _, _ in self.names), values))
        knobs = {k: val.get(f"knob.{k}", lo(v)) for k, v in self.space.knobs.items()}
        cfg = dataclasses.replace(self.space.template, **knobs)
        try:
            POLICIES[cfg.policy].check_config(cfg)
        except ConfigError:
            return None
        reqs = []
        for g, grp in enumerate(self.space.groups):
            count = val.get(f"g{g}.count", lo(grp.count))
            for j in range(count):
                f = {name: val.get(f"g{g}.{j}.{name}", lo(v)) for name, v in grp.fields.items()}
                if f.get("cancel_at") is not None and f["cancel_at"] < f.get("arrival", 0):
                    return None      # outside the space: check's encoding has cancel_at >= arrival
                reqs.append(RequestSpec(prompt=f["prompt"], max_new=f["max_new"], arrival=f.get("arrival", 0),
                                        output_len=f.get("output_len"), cancel_at=f.get("cancel_at"),
                                        prefix_group=grp.prefix_group, prefix_len=f.get("prefix_len", 0),
                                        priority=f.get("priority", 0)))
        return cfg, Workload(tuple(reqs))


def violated(cfg, wl: Workload, wanted: set) -> Optional[str]:
    """The first property of `wanted` the run violates, as `schedproof run` evaluates it."""
    trace = simulate(cfg, wl)
    policy = POLICIES[cfg.policy]
    reqs = trace.states[0].requests
    ev = evaluate(trace, lambda rid: policy.fits_alone(cfg, reqs[rid]), cfg.max_batch_size)
    return next((v.property for v in ev.violations if v.property in wanted), None)


# -- the three searches -----------------------------------------------------------------------------

def run_check(spec) -> tuple[Result, Optional[object]]:
    core = CORES[spec.space.template.policy]
    t0, c0 = time.perf_counter(), time.process_time()
    res = search(core, spec.space, spec.max_depth, CHECK_BUDGET, list(spec.properties) or None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if res.status != "violated":
        return Result("check (Z3)", False, wall, cpu, f"depth {res.depth}", f"{res.status}: {res.reason or ''}"), None
    rep = replay(res.cex)
    note = (f"{res.cex.property} at depth {res.cex.depth} ({res.cex.steps} engine steps); replay: "
            f"{'ok' if rep.ok else 'FAILED'}; workload: " + "; ".join(
                f"{r.prompt}+{r.max_new}@{r.arrival}" + (f" cancel {r.cancel_at}" if r.cancel_at is not None else "")
                for r in res.cex.workload.requests))
    return Result("check (Z3)", rep.ok, res.found_seconds, res.found_cpu, f"depths 1..{res.cex.depth}", note), res.cex


def run_uniform(draws: Draws, wanted: set, budget: float, seed: int) -> Result:
    rng = random.Random(seed)
    t0, c0 = time.perf_counter(), time.process_time()
    samples = refused = 0
    while time.perf_counter() - t0 < budget:
        built = draws.build([rng.randint(a, b) for _, a, b in draws.names])
        samples += 1
        if built is None:
            refused += 1
            continue
        prop = violated(*built, wanted)
        if prop is not None:
            return Result("uniform sampler", True, time.perf_counter() - t0, time.process_time() - c0,
                          f"{samples} samples", f"{prop}: {built[1]}")
    return Result("uniform sampler", False, time.perf_counter() - t0, time.process_time() - c0,
                  f"{samples} samples" + (f" ({refused} refused designs)" if refused else ""), f"seed {seed}")


class _OutOfTime(Exception):
    pass


def run_hypothesis(draws: Draws, wanted: set, budget: float, seed: int) -> Result:
    from hypothesis import HealthCheck, Phase, given, settings, seed as hseed, strategies as st

    t0, c0 = time.perf_counter(), time.process_time()
    box = {"examples": 0, "found": None}

    def body(values):
        if time.perf_counter() - t0 > budget:
            raise _OutOfTime
        box["examples"] += 1
        built = draws.build(list(values))
        if built is None:
            return
        prop = violated(*built, wanted)
        if prop is not None:
            box["found"] = (time.perf_counter() - t0, time.process_time() - c0, prop, built[1])
            raise AssertionError(prop)

    strategy = st.tuples(*[st.integers(a, b) for _, a, b in draws.names])
    test = settings(max_examples=10 ** 9, phases=[Phase.generate], database=None, deadline=None,
                    derandomize=False, print_blob=False, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck))(hseed(seed)(given(strategy)(body)))
    try:
        test()
    except (_OutOfTime, AssertionError):
        pass
    if box["found"] is not None:
        wall, cpu, prop, wl = box["found"]
        return Result("Hypothesis", True, wall, cpu, f"{box['examples']} examples", f"{prop}: {wl}")
    return Result("Hypothesis", False, time.perf_counter() - t0, time.process_time() - c0,
                  f"{box['examples']} examples", f"seed {seed}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--factor", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    files = args.files or sorted(str(p) for p in SPACES.glob("*.toml"))
    print(f"seed {args.seed}; random searches get {args.factor:g} x check's time each")
    print(f"{'space':40s} {'search':16s} {'found':5s} {'wall s':>8s} {'CPU s':>8s}  tried")
    for path in files:
        spec = load_check(path)
        name = Path(path).stem
        wanted = set(spec.properties) if spec.properties else None
        chk, cex = run_check(spec)
        rows = [chk]
        if chk.found:
            draws = Draws.of(spec.space)
            wanted = wanted or {cex.property}
            budget = args.factor * chk.seconds
            rows += [run_uniform(draws, wanted, budget, args.seed), run_hypothesis(draws, wanted, budget, args.seed)]
        for r in rows:
            print(f"{name:40s} {r.search:16s} {'yes' if r.found else 'no':5s} {r.seconds:8.1f} {r.cpu:8.1f}  "
                  f"{r.tried}", flush=True)
        for r in rows:
            if r.note:
                print(f"    {r.search}: {r.note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
