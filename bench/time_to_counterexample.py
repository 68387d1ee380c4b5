"""Time to the first counterexample for the TensorRT-LLM V2 replay-over-budget deadlock (seeds.md 3,
NVIDIA/TensorRT-LLM #21826) when the workload is given only as ranges: three searches over the same space,
side by side in one run.

    .venv/bin/python bench/time_to_counterexample.py --budget 600

(scenarios/check/trtllm-v2-field-ranges.toml; `--small` runs bench/trtllm-v2-field-ranges-small.toml, the same
design at a small size, in under a minute.)

The space is the scenario's `[[requests]]` group (count, prompt, max_new, arrival as ranges; no early stops and no
cancellations, as the file says) on its fixed engine design. The searches:

1. BMC: `checkers.bmc.search` on the trtllm_v2 core for LIVE-NO-PROGRESS, depth up to the file's
   `max_depth` (its time includes proving the core's invariants for the space, as `schedproof check` does). The
   counterexample is replayed on the simulator afterwards, untimed.
2. Hypothesis on the simulator: `@given` draws a workload from the same ranges (a list of `count` requests, each
   (prompt, max_new, arrival)), runs `model.simulator.simulate` and `properties.evaluate`, and fails on
   LIVE-NO-PROGRESS. Seeded (`--seed`), no example database; the time is that of the first failing example.
   Shrinking then runs on its own budget (`--shrink-budget`) and is reported apart.
3. Explicit-state BFS of the simulator: the environment's choice at each step is which requests arrive, with
   which sizes; the engine's is `POLICIES["trtllm_v2"].step`. States are `State`s whose request tuple grows
   as requests arrive; breadth-first by step, with a visited set on `State.key()` (plus the step while more
   arrivals may come, since two such states differ in what the environment may still do). The goal is a
   state where, with nothing more arriving, the next step is LIVE-NO-PROGRESS. The BFS explores a discretised
   grid, not the whole space (it cannot enumerate 2048 prompt lengths): prompts and max_new take `--grid`
   evenly spaced values of each range, the multiples of hi/grid (default 4: prompts 512, 1024, 1536, 2048 and
   outputs 256, 512, 768, 1024 at full size; `--small` defaults to 2: prompts and outputs 8 and 16); arrivals at
   every step of the arrival range; requests arriving in one step in every order. Both default grids hold the
   deadlock (full size: 12 x 1536+768 at step 0; small: 16+16 at step 0, 8+16 at step 3).
   What it finds is replayed with `simulate` (untimed).

Each search gets the same wall-clock budget (`--budget`); one that does not finish reports "none within
budget" and its budget as a lower bound. Wall time is `time.perf_counter`, CPU time `time.process_time` of this
process (Z3 runs in it); on a shared machine the CPU column is the steadier one.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from collections import deque
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model.policy import POLICIES, Env  # noqa: E402
from model.simulator import RequestSpec, Workload, simulate  # noqa: E402
from model.state import Phase, Request, State  # noqa: E402
from checkers.space import Space, hi, lo  # noqa: E402
from properties import evaluate  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402

DEFAULT_SCENARIO = "scenarios/check/trtllm-v2-field-ranges.toml"
SMALL_SCENARIO = "bench/trtllm-v2-field-ranges-small.toml"
PROPERTY = "LIVE-NO-PROGRESS"


@dataclasses.dataclass
class Outcome:
    search: str
    found: bool
    wall: float
    cpu: float
    length: str = "-"          # the counterexample's length (engine steps up to and including the stuck one)
    explored: str = "-"
    notes: list = dataclasses.field(default_factory=list)


class Clock:
    def __init__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def wall(self) -> float:
        return time.perf_counter() - self.wall0

    def cpu(self) -> float:
        return time.process_time() - self.cpu0


# -- the space -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Ranges:
    count: tuple[int, int]
    prompt: tuple[int, int]
    max_new: tuple[int, int]
    arrival: tuple[int, int]


def ranges_of(space: Space) -> Ranges:
    """The single request group of the space, which is all the simulator-side searches handle."""
    if len(space.groups) != 1:
        raise SystemExit("time_to_counterexample: the space must have exactly one [[requests]] group")
    if space.symbolic_knobs:
        raise SystemExit(f"time_to_counterexample: engine knobs must be fixed (ranged: {space.symbolic_knobs})")
    if space.early_stops or space.cancellations:
        raise SystemExit("time_to_counterexample: the space must set early_stops = false and cancellations = false")
    g = space.groups[0]
    extra = set(g.fields) - {"prompt", "max_new", "arrival"}
    if extra or g.prefix_group != -1:
        raise SystemExit(f"time_to_counterexample: request fields beyond prompt, max_new, arrival: {sorted(extra)}")

    def rng(v) -> tuple[int, int]:
        return lo(v), hi(v)

    return Ranges(rng(g.count), rng(g.fields["prompt"]), rng(g.fields["max_new"]), rng(g.fields.get("arrival", 0)))


def no_progress(cfg, wl: Workload):
    """Simulate and evaluate the registry as `schedproof run` does: the LIVE-NO-PROGRESS violation or None."""
    trace = simulate(cfg, wl)
    policy = POLICIES[cfg.policy]
    reqs = trace.states[0].requests
    ev = evaluate(trace, lambda rid: policy.fits_alone(cfg, reqs[rid]), cfg.max_batch_size)
    return next((v for v in ev.violations if v.property == PROPERTY), None), trace


def in_transitions(cfg, wl: Workload, step: int) -> str:
    """A trace stuck at engine step `step`, in engine steps and in the BMC's transitions (a decode run that
    can start counts once, taken at its longest: checkers/replay.py `transitions`)."""
    from checkers.replay import transitions
    return f"{step + 1} steps ({len(transitions(cfg, wl, step))} transitions)"


def diagnose(cfg, s: State) -> str:
    """What holds the engine at the stuck state: the field report's mechanism, or something else."""
    over = [f"r{q.rid} ({q.prompt}+{q.generated} = {q.context_len})" for q in s.requests
            if q.phase == Phase.PREEMPTED and q.context_len > cfg.max_num_tokens]
    if over:
        return (f"stuck on replay over budget: recompute-paused {', '.join(over)} > max_num_tokens "
                f"{cfg.max_num_tokens}")
    return "stuck, but no recompute-paused request's replay exceeds max_num_tokens (another mechanism)"


def describe(wl: Workload) -> str:
    return ", ".join(f"{s.prompt}+{s.max_new}@{s.arrival}" for s in wl.requests)


# -- 1. BMC ----------------------------------------------------------------------------------

def run_bmc(space: Space, max_depth: int, budget: float) -> Outcome:
    from checkers.bmc import search
    from model.symbolic.core import CORES
    from checkers.replay import replay
    import model.symbolic.cores  # noqa: F401  (registers every core)

    core = CORES[space.template.policy]
    clock = Clock()
    result = search(core, space, max_depth, budget, properties=[PROPERTY])
    wall, cpu = clock.wall(), clock.cpu()
    if result.status != "violated":
        what = {"bounded": f"no violation up to depth {max_depth}",
                "unknown": f"unknown at depth {result.depth + 1} ({result.reason})"}[result.status]
        return Outcome("BMC (Z3, trtllm_v2 core)", False, wall, cpu, explored=f"depth {result.depth}", notes=[what])
    cex = result.cex
    rep = replay(cex)
    # Time to the first counterexample; certifying it shortest over the whole space runs after.
    wall, cpu = result.found_seconds, result.found_cpu
    if not result.scope:
        shortest = "shortest in the whole space (certified)"
    elif result.certified is None:
        shortest = f"shortest among {result.scope}; " + "; ".join(result.notes)
    else:
        shortest = (f"shortest among {result.scope}; {result.certified_in or 'whole space'} clear to depth "
                    f"{result.certified} when the budget ran out")
    notes = [f"first counterexample after {wall:.1f} s wall, {cpu:.1f} s CPU; {shortest} "
             f"(total {clock.wall():.1f} s wall)",
             f"workload (prompt+max_new@arrival): {describe(cex.workload)}",
             f"simulator replay: {'ok' if rep.ok else 'FAILED'}: {rep.message}"]
    if rep.ok and rep.evaluation is not None:
        v = next(x for x in rep.evaluation.violations if x.property == PROPERTY)
        notes.append(diagnose(cex.cfg, rep.trace.states[v.step]))
    if result.lemmas is not None:
        notes.append(f"invariant proof {result.lemmas.seconds:.1f} s of it ("
                     f"{len(result.lemmas.names)} invariants used as lemmas, {len(result.lemmas.dropped)} left out)")
    return Outcome("BMC (Z3, trtllm_v2 core)", True, wall, cpu,
                   length=f"{cex.steps} steps ({cex.depth} transitions)",
                   explored=f"depths 1..{cex.depth}", notes=notes)


# -- 2. Hypothesis on the simulator ------------------------------------------------------------

class BudgetExceeded(Exception):
    pass


def run_hypothesis(space: Space, budget: float, seed: int, max_examples: int, shrink_budget: float) -> Outcome:
    """One Hypothesis run: generation until the first failing example (timed), then shrinking from it on its
    own budget (reported apart). Results are cached by example, so the final replay of the shrunk example never
    re-simulates and a candidate skipped once shrinking is out of time cannot turn flaky."""
    from hypothesis import HealthCheck, Phase as HPhase, given, settings, seed as hseed, strategies as st

    cfg, r = space.template, ranges_of(space)
    request = st.tuples(st.integers(*r.prompt), st.integers(*r.max_new), st.integers(*r.arrival))
    workloads = st.lists(request, min_size=r.count[0], max_size=r.count[1])
    box = {"examples": 0, "first": None, "cache": {}, "stopped": False, "shrink_deadline": 0.0, "shrink_sims": 0}
    clock = Clock()
    deadline = clock.wall0 + budget

    def body(reqs):
        key = tuple(reqs)
        if key not in box["cache"]:
            if box["first"] is None:                      # still generating
                if box["stopped"] or time.perf_counter() > deadline:
                    box["stopped"] = True
                    raise BudgetExceeded
                box["examples"] += 1
            elif time.perf_counter() > box["shrink_deadline"]:
                return                                    # shrinking out of time: an unseen candidate passes
            else:
                box["shrink_sims"] += 1
            wl = Workload(tuple(RequestSpec(p, m, a) for p, m, a in reqs))
            v, trace = no_progress(cfg, wl)
            box["cache"][key] = (v, wl)
            if v is not None and box["first"] is None:
                box["first"] = (clock.wall(), clock.cpu(), box["examples"], v, wl)
                box["diagnosis"] = diagnose(cfg, trace.states[v.step])
                box["shrink_deadline"] = time.perf_counter() + shrink_budget
        v, wl = box["cache"][key]
        if v is not None:
            box["last"] = (v, wl)           # the last failing call is Hypothesis's replay of its shrunk example
            raise AssertionError(f"{PROPERTY} at step {v.step}: {describe(wl)}")

    phases = [HPhase.generate] + ([HPhase.shrink] if shrink_budget > 0 else [])
    test = settings(max_examples=max_examples, phases=phases, database=None, deadline=None, derandomize=False,
                    report_multiple_bugs=False, print_blob=False, suppress_health_check=list(HealthCheck))(
        hseed(seed)(given(workloads)(body)))
    shrunk = None
    try:
        test()
    except BudgetExceeded:
        pass
    except AssertionError as exc:
        shrunk = str(exc)
    wall, cpu = clock.wall(), clock.cpu()
    name = "Hypothesis + simulator"
    if box["first"] is None:
        why = "the budget" if box["stopped"] else f"max_examples ({max_examples})"
        return Outcome(name, False, wall, cpu, explored=f"{box['examples']} examples",
                       notes=[f"seed {seed}; stopped by {why}"])
    fwall, fcpu, n, v, wl = box["first"]
    notes = [f"seed {seed}; first failing workload (prompt+max_new@arrival): {describe(wl)}", box["diagnosis"]]
    if shrink_budget > 0:
        cut = time.perf_counter() > box["shrink_deadline"]
        notes.append(f"shrinking (not counted): {wall - fwall:.1f} s wall, {cpu - fcpu:.1f} s CPU, "
                     f"{box['shrink_sims']} more simulations{', cut at its budget' if cut else ''}; "
                     f"shrunk to: {shrunk} ({in_transitions(cfg, box['last'][1], box['last'][0].step)})")
    return Outcome(name, True, fwall, fcpu, length=in_transitions(cfg, wl, v.step), explored=f"{n} examples",
                   notes=notes)


# -- 3. Explicit-state BFS of the simulator ----------------------------------------------------

def grid(low: int, high: int, points: int) -> list[int]:
    """`points` evenly spaced values ending at `high` (multiples of high / points), clipped to the range."""
    values = sorted({max(low, round(high * k / points)) for k in range(1, points + 1)})
    return [v for v in values if low <= v <= high]


def run_bfs(space: Space, budget: float, points: int, max_states: int) -> Outcome:
    cfg, r = space.template, ranges_of(space)
    policy = POLICIES[cfg.policy]
    prompts, outputs = grid(*r.prompt, points), grid(*r.max_new, points)
    sizes = [(p, m) for p in prompts for m in outputs]
    choices = sum(len(sizes) ** k for k in range(r.count[1] + 1))
    grid_note = (f"grid: prompt in {prompts}, max_new in {outputs}, arrivals at every step "
                 f"{r.arrival[0]}..{r.arrival[1]}, {r.count[0]}..{r.count[1]} requests "
                 f"({choices:.3g} environment choices at a step where all may still arrive)")
    name = "BFS of the simulator (grid)"
    clock = Clock()
    deadline = clock.wall0 + budget
    start = State(step=0, requests=(), free_blocks=cfg.num_blocks, free_host_blocks=cfg.host_blocks,
                  sched=policy.initial_sched(cfg))

    def is_open(s: State) -> bool:
        return s.step <= r.arrival[1] and len(s.requests) < r.count[1]

    def vkey(s: State):
        return (s.key(), s.step if is_open(s) else -1)

    visited = {vkey(start)}
    frontier = deque([start])
    depth, ticks = 0, 0
    while frontier:
        s = frontier.popleft()
        depth = s.step
        n = len(s.requests)
        can_arrive = r.arrival[0] <= s.step <= r.arrival[1]
        ks = range(0, r.count[1] - n + 1) if can_arrive else (0,)
        for k in ks:
            for new in itertools.product(sizes, repeat=k):
                ticks += 1
                if ticks % 256 == 0 and (time.perf_counter() > deadline or len(visited) > max_states):
                    why = "budget" if len(visited) <= max_states else f"the state cap ({max_states})"
                    return Outcome(name, False, clock.wall(), clock.cpu(), explored=f"{len(visited)} states",
                                   notes=[grid_note, f"stopped by {why} at step {depth}; "
                                                     f"process peak RSS {_rss_mib():.0f} MiB"])
                reqs = s.requests + tuple(Request(rid=n + i, prompt=p, max_new=m, arrival=s.step)
                                          for i, (p, m) in enumerate(new))
                pre = dataclasses.replace(s, requests=reqs)
                post, rec = policy.step(cfg, pre, Env(arrivals=tuple(range(n, n + k))))
                if post.error is not None:
                    continue
                if k == 0 and n >= r.count[0] and s.step >= r.arrival[0]:
                    unfinished = [q for q in pre.requests if q.phase.unfinished]
                    if unfinished and not rec.scheduled and pre.requests == post.requests:
                        wall, cpu = clock.wall(), clock.cpu()
                        return _bfs_found(name, cfg, pre, wall, cpu, len(visited), grid_note)
                if not is_open(post) and (len(post.requests) < r.count[0]
                                          or all(q.phase.terminal for q in post.requests)):
                    continue
                key = vkey(post)
                if key not in visited:
                    visited.add(key)
                    frontier.append(post)
    return Outcome(name, False, clock.wall(), clock.cpu(), explored=f"{len(visited)} states",
                   notes=[grid_note, "the grid holds no deadlock (exhausted)"])


def _rss_mib() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _bfs_found(name, cfg, s: State, wall, cpu, visited, grid_note) -> Outcome:
    wl = Workload(tuple(RequestSpec(q.prompt, q.max_new, q.arrival) for q in s.requests))
    v, _ = no_progress(cfg, wl)
    check = (f"simulate replays it: {PROPERTY} at step {v.step}" if v is not None and v.step == s.step
             else f"simulate does NOT replay it ({v})")
    return Outcome(name, True, wall, cpu, length=in_transitions(cfg, wl, s.step),
                   explored=f"{visited} states",
                   notes=[grid_note, f"workload (prompt+max_new@arrival): {describe(wl)}", check, diagnose(cfg, s)])


# -- the table ---------------------------------------------------------------------------------

def ratio(o: Outcome, bmc: Outcome) -> str:
    if o is bmc:
        return "1 (reference)"
    if not bmc.found and not o.found:
        return "neither found"

    def one(a: float, b: float, a_found: bool, b_found: bool) -> str:
        # a: this search's time, b: BMC's; a lower bound where not found
        if a_found and b_found:
            x = a / b if b > 0 else float("inf")
            if 1 / 1.05 <= x <= 1.05:
                return f"BMC is about as fast ({x:.2f}x)"
            return f"BMC is {x:.1f}x faster" if x >= 1 else f"BMC is {1 / x:.1f}x slower"
        if b_found:
            return f"BMC is > {a / b:.1f}x faster"
        return f"BMC is > {b / a:.1f}x slower"

    wall = one(o.wall, bmc.wall, o.found, bmc.found)
    cpu = one(o.cpu, bmc.cpu, o.found, bmc.found).replace("BMC is ", "")
    return f"{wall} (CPU: {cpu})"


def table(outcomes: list[Outcome], budget: float) -> str:
    bmc = outcomes[0]
    rows = ["| search | found | wall s | CPU s | ratio to BMC | trace length | explored |",
            "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        wall = f"{o.wall:.1f}" if o.found else f"> {budget:g} (none within budget)" if o.wall >= budget * 0.99 \
            else f"{o.wall:.1f} (not found)"
        rows.append(f"| {o.search} | {'yes' if o.found else 'no'} | {wall} | {o.cpu:.1f} | {ratio(o, bmc)} "
                    f"| {o.length} | {o.explored} |")
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=None, help=f"check file (default {DEFAULT_SCENARIO})")
    ap.add_argument("--small", action="store_true", help=f"run the small-size variant ({SMALL_SCENARIO})")
    ap.add_argument("--budget", type=float, default=600.0, help="wall-clock seconds per search (default 600)")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    ap.add_argument("--max-examples", type=int, default=1_000_000, help="Hypothesis max_examples (default 10^6)")
    ap.add_argument("--shrink-budget", type=float, default=30.0,
                    help="seconds for Hypothesis shrinking after the timed search, 0 to skip (default 30)")
    ap.add_argument("--grid", type=int, default=None,
                    help="BFS grid points per size range (default 4; 2 with --small)")
    ap.add_argument("--max-states", type=int, default=2_000_000,
                    help="BFS visited-set cap, to bound its memory (default 2,000,000; about 2.5 KB a state "
                         "at full size)")
    ap.add_argument("--max-depth", type=int, default=None, help="BMC depth bound (default: the file's max_depth)")
    ap.add_argument("--only", default="bmc,hypothesis,bfs", help="comma-separated subset of bmc,hypothesis,bfs")
    args = ap.parse_args(argv)
    if args.scenario and args.small:
        ap.error("--small and --scenario are exclusive")
    path = args.scenario or (SMALL_SCENARIO if args.small else DEFAULT_SCENARIO)
    if not Path(path).is_absolute() and not Path(path).exists():
        path = str(ROOT / path)
    spec = load_check(path)
    space, r = spec.space, ranges_of(spec.space)
    depth = args.max_depth or spec.max_depth
    cfg = space.template
    print(f"# time to the first {PROPERTY} counterexample: {Path(path).name}", flush=True)
    print(f"design: {cfg.policy}, block_size {cfg.block_size}, {cfg.num_blocks} blocks, max_num_tokens "
          f"{cfg.max_num_tokens}, max_batch_size {cfg.max_batch_size}, chunked prefill "
          f"{'on' if cfg.chunked_prefill else 'off'}, host blocks {cfg.host_blocks}; "
          f"requests {r.count[0]}..{r.count[1]}, "
          f"prompt {r.prompt[0]}..{r.prompt[1]}, max_new {r.max_new[0]}..{r.max_new[1]}, arrival "
          f"{r.arrival[0]}..{r.arrival[1]}; budget {args.budget:g} s per search, BMC depth <= {depth}", flush=True)
    wanted = set(args.only.split(","))
    outcomes = []
    runs = [("bmc", lambda: run_bmc(space, depth, args.budget)),
            ("hypothesis", lambda: run_hypothesis(space, args.budget, args.seed, args.max_examples,
                                                  args.shrink_budget)),
            ("bfs", lambda: run_bfs(space, args.budget, args.grid or (2 if args.small else 4), args.max_states))]
    for key, fn in runs:
        if key not in wanted:
            continue
        print(f"... {key}", file=sys.stderr, flush=True)
        o = fn()
        print(f"... {key}: {'found' if o.found else 'not found'} in {o.wall:.1f} s wall, {o.cpu:.1f} s CPU",
              file=sys.stderr, flush=True)
        outcomes.append(o)
    if not outcomes:
        ap.error("--only selected nothing")
    if outcomes[0].search.startswith("BMC"):
        print()
        print(table(outcomes, args.budget))
    else:
        print("\n(no BMC row: ratios omitted)")
        for o in outcomes:
            print(f"- {o.search}: found {o.found}, {o.wall:.1f} s wall, {o.cpu:.1f} s CPU, {o.length}, {o.explored}")
    print()
    for o in outcomes:
        for n in o.notes:
            print(f"- {o.search}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
