"""`schedproof`: the command line.

Exit status: 0 nothing violated (or, for `corpus`, every scenario as expected); 1 a property
is violated (or a scenario is not as expected); 2 bad input; 3 the run hit its step limit
and nothing is claimed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from model.policy import POLICIES
from properties import REGISTRY
from targets import TargetUnavailable

from . import report
from .runner import DEFAULT_MAX_STEPS, run_scenario
from .scenario import ScenarioError, load

EXIT_OK, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def _number(kind: type, low, high, why: str):
    """An argparse type: a finite number of `kind` in [low, high]; outside, argparse's one-line
    error (exit 2) says the range and why it is the range."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        if value != value or value in (float("inf"), float("-inf")) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside [{low:g}, {high:g}] ({why})")
        return value
    return parse


# The limits on the numbers a flag takes, each with its reason (shown when a value is refused).
TIMEOUT = _number(float, 0.001, 7 * 86400, "seconds; a week at most: split a longer campaign")
MAX_DEPTH = _number(int, 1, 1000, "transitions; each adds a copy of the state's terms to the solver")
MAX_STEPS = _number(int, 1, 10_000_000, "engine steps; the run keeps every state in memory")
STEP_TIMEOUT = _number(float, 0.1, 3600, "seconds; below 0.1 s an ordinary engine step on this CPU reads as a hang")
COUNT = _number(int, 1, 1_000_000, "a positive count")


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse's own usage errors are bad input too: one line, exit 2
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="schedproof", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="simulate one scenario and report per-request outcomes and a verdict")
    run.add_argument("file")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--max-steps", type=MAX_STEPS, default=DEFAULT_MAX_STEPS)

    corpus = sub.add_parser("corpus", help="run every scenario in a folder and compare with its [expect] table")
    corpus.add_argument("folder", nargs="?", default="scenarios")
    corpus.add_argument("--json", action="store_true")
    corpus.add_argument("--max-steps", type=MAX_STEPS, default=DEFAULT_MAX_STEPS)

    sub.add_parser("properties", help="list the property registry")

    ck = sub.add_parser("check", help="bounded model checking of a design whose numbers may be ranges: "
                                      "a shortest counterexample, replayed, or a bound")
    ck.add_argument("file")
    ck.add_argument("--json", action="store_true", help="print one JSON object")
    ck.add_argument("--timeout", type=TIMEOUT, default=600.0, help="seconds for the whole search (default 600)")
    ck.add_argument("--max-depth", type=MAX_DEPTH, help="transitions to unroll at most (default: the file's, or 24)")
    ck.add_argument("--property", action="append", dest="properties", metavar="ID",
                    help="search only this property (repeatable; default: the file's, or all)")
    ck.add_argument("--no-accelerate", action="store_true", help="one transition per engine step")
    ck.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                    help="show the depth reached and time left, and each counterexample as soon as it is found, "
                         "on stderr (auto: on a terminal, not under --json or CI=true)")

    pv = sub.add_parser("prove", help="inductive proofs of the designs claimed correct, and the refuted claims")
    pv.add_argument("policy", nargs="?", help="only this policy's claims")
    pv.add_argument("--timeout", type=TIMEOUT, default=600.0, help="seconds for all the proofs (default 600)")
    pv.add_argument("--json", action="store_true")

    fz = sub.add_parser("fuzz", help="Hypothesis stateful search of a target; report and regression test on a find")
    fz.add_argument("--target", required=True, help="reference (the model) or transformers (the real engine)")
    fz.add_argument("--profile", choices=["ci", "nightly"],
                    help="search budget: ci (bounded) or nightly (deep); default: $SCHEDPROOF_PROFILE or ci")
    fz.add_argument("--examples", type=COUNT, help="examples to run (default: the profile's)")
    fz.add_argument("--seed", type=int, default=0)
    fz.add_argument("--steps", type=COUNT, help="actions per example at most (default: the profile's)")
    fz.add_argument("--fitting-only", action="store_true",
                    help="submit only requests that fit the cache alone (search past the known fatal error)")
    fz.add_argument("--no-empty-prompts", action="store_true",
                    help="never submit an empty prompt (search past the known empty-prompt crash)")
    fz.add_argument("--step-timeout", type=STEP_TIMEOUT, default=10.0, help="seconds one engine step may take")
    fz.add_argument("--out", default="reports", help="folder for the report and the regression test")
    fz.add_argument("--json", action="store_true")

    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:      # a usage error (2) or --help (0): a status, as from any command
        return stop.code if isinstance(stop.code, int) else EXIT_BAD_INPUT
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "corpus":
            return _corpus(args)
        if args.command == "fuzz":
            return _fuzz(args)
        if args.command == "check":
            return _check(args)
        if args.command == "prove":
            return _prove(args)
        return _properties()
    except (ScenarioError, TargetUnavailable) as exc:
        print(f"schedproof: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run(args) -> int:
    result = run_scenario(load(args.file), max_steps=args.max_steps)
    if args.json:
        print(json.dumps(report.as_dict(result), indent=2))
    else:
        print(report.as_text(result))
    if result.verdict == "unknown":
        return EXIT_UNKNOWN
    return EXIT_OK if result.verdict == "ok" else EXIT_VIOLATED


def _corpus(args) -> int:
    folder = Path(args.folder)
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ScenarioError(str(folder), "-", "no *.toml scenario files here")
    scenarios = [load(f) for f in files]   # every file is checked before anything runs
    rows, unexpected = [], 0
    for scenario in scenarios:
        result = run_scenario(scenario, max_steps=args.max_steps)
        problems = result.matches_expectation()
        if scenario.expect.verdict is None:
            problems.append("no [expect] verdict")
        unexpected += bool(problems)
        rows.append((result, problems))
        if not args.json:
            print(report.corpus_line(result, problems), flush=True)
    if args.json:
        print(json.dumps([dict(report.as_dict(r), unexpected=p) for r, p in rows], indent=2))
    else:
        print(f"\n{len(rows) - unexpected}/{len(rows)} scenarios as expected")
    return EXIT_OK if unexpected == 0 else EXIT_VIOLATED


def _fuzz(args) -> int:
    from targets.stateful import PROFILES

    from .fuzz import fuzz, write_report

    profile = args.profile or os.environ.get("SCHEDPROOF_PROFILE", "ci")
    if profile not in PROFILES:
        print(f"schedproof: SCHEDPROOF_PROFILE: {profile!r} is not a profile (known: {', '.join(PROFILES)})",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    for name in ("examples", "steps"):
        if getattr(args, name) is None:
            setattr(args, name, PROFILES[profile][name])
    print(f"schedproof fuzz: target {args.target}, seed {args.seed}, {args.examples} examples", file=sys.stderr)
    result = fuzz(args.target, args.examples, args.seed, args.steps, args.step_timeout, args.fitting_only,
                  not args.no_empty_prompts)
    paths = write_report(result, Path(args.out)) if result.status == "found" else ()
    if args.json:
        out = result.as_dict()
        if paths:
            out["report"], out["regression_test"] = str(paths[0]), str(paths[1])
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
    return EXIT_OK if result.status == "none" else EXIT_VIOLATED


def _check(args) -> int:
    from .check import run_check

    show = args.progress == "on" or (args.progress == "auto" and not args.json and _interactive())
    live = _LiveDisplay(sys.stderr) if show else None
    code, text = run_check(args.file, args.timeout, args.max_depth, args.properties, not args.no_accelerate,
                           args.json, lambda line: print(line, file=sys.stderr, flush=True), live=live)
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


def _prove(args) -> int:
    from proofs.claims import claims_for
    from proofs.run import decide_claims, exit_code

    from . import provereport

    if args.policy is not None and args.policy not in POLICIES:
        print(f"schedproof prove: unknown policy {args.policy!r} (known: {', '.join(sorted(POLICIES))})",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    claims = claims_for(args.policy)
    if not claims:
        print("[]" if args.json else f"no claims for {args.policy}")
        return EXIT_OK

    def show(event):
        if not args.json:
            for line in provereport.event_lines(event):
                print(line, flush=True)

    verdicts = decide_claims(claims, args.timeout, show)
    if args.json:
        print(json.dumps([provereport.as_dict(v) for v in verdicts], indent=2))
    else:
        print(provereport.summary(verdicts))
    return exit_code(verdicts)


def _properties() -> int:
    for p in REGISTRY.values():
        print(f"{p.id:<28} {p.kind:<9} {p.statement}")
        for e in p.evidence:
            print(f"{'':<38} evidence: {e}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
