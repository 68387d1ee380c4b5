"""`schedproof`: the command line.

Exit status: 0 nothing violated (or, for `corpus`, every scenario as expected); 1 a property
is violated (or a scenario is not as expected); 2 bad input; 3 the run hit its step limit
and nothing is claimed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from properties import REGISTRY

from . import report
from .runner import DEFAULT_MAX_STEPS, run_scenario
from .scenario import ScenarioError, load

EXIT_OK, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse's own usage errors are bad input too
        self.print_usage(sys.stderr)
        print(f"schedproof: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="schedproof", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="simulate one scenario and report per-request outcomes and a verdict")
    run.add_argument("file")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)

    corpus = sub.add_parser("corpus", help="run every scenario in a folder and compare with its [expect] table")
    corpus.add_argument("folder", nargs="?", default="scenarios")
    corpus.add_argument("--json", action="store_true")
    corpus.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)

    sub.add_parser("properties", help="list the property registry")

    args = parser.parse_args(argv)
    if getattr(args, "max_steps", 1) <= 0:
        print("schedproof: --max-steps: must be a positive integer", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "corpus":
            return _corpus(args)
        return _properties()
    except ScenarioError as exc:
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


def _properties() -> int:
    for p in REGISTRY.values():
        print(f"{p.id:<28} {p.kind:<9} {p.statement}")
        for e in p.evidence:
            print(f"{'':<38} evidence: {e}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
