"""Z3's Spacer (PDR / IC3 over constrained Horn clauses) against Houdini inference on a check file's core:

    .venv/bin/python bench/spacer.py [FILE ...] [--timeout S]

The design review (proofs/review.py) proves a file no claim covers by an inferred invariant (checkers/infer.py:
Houdini over candidates, the property from the survivors). Spacer is the other route the issue names: the core at
the file's request slots as Horn clauses, with the invariant an unknown relation over the state, the knobs and the
workload, and Spacer left to find it:

    Inv(initial(k, w), k, w)                   <- the file's constraints on k, w
    Inv(step(s, k, w), k, w)                   <- Inv(s, k, w)
    false                                      <- Inv(s, k, w), the property violated by step(s, k, w)

`sat` is a proof (Spacer found an inductive invariant), `unsat` a reachable violation, `unknown` a time-out.
Per file the row gives Spacer's answer and wall seconds beside inference's (the same slots, the same property,
minimisation off, so both answer only "proved or not"), one after the other on the same machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import z3  # noqa: E402

import model.symbolic.cores  # noqa: E402,F401  (registers every core)
from checkers.encode import fresh_state  # noqa: E402
from checkers.induction import OneStep  # noqa: E402
from checkers.infer import infer  # noqa: E402
from checkers.space import encode  # noqa: E402
from model.symbolic.core import CORES  # noqa: E402
from model.symbolic.ops import Symbolic  # noqa: E402
from proofs.review import _inference_space, candidates_for  # noqa: E402
from properties.symbolic import Transition, violations  # noqa: E402
from schedproof.checkspec import load_check  # noqa: E402

SYM = Symbolic()
DEFAULT = ("scenarios/check/review/trtllm-v1-two-draft-tokens-budget.toml",
           "scenarios/check/review/sglang-pages-of-two.toml",
           "scenarios/check/review/vllm-chunked-priority-fits-alone.toml")


def _flat(state) -> list:
    return [r[f] for r in state.req for f in sorted(r)] + [state.g[f] for f in sorted(state.g)]


def _term(x):
    if isinstance(x, bool):
        return z3.BoolVal(x)
    if isinstance(x, int):
        return z3.IntVal(x)
    return x


def spacer(core, space, prop: str, timeout: float) -> str:
    enc = encode(space)
    n = space.slots
    pre = fresh_state(core, n, "pre")
    env = [t for t in enc.knob_terms.values() if not isinstance(t, int)]
    env += [v for w in enc.params.slots for v in w.values() if not isinstance(v, (bool, int))]
    state_vars = [v for v in _flat(pre) if not isinstance(v, (bool, int))]
    sig = [v.sort() for v in state_vars] + [v.sort() for v in env] + [z3.BoolSort()]
    inv = z3.Function("Inv", *sig)

    def holds(state) -> z3.BoolRef:
        values = [_term(x) for x, v in zip(_flat(state), _flat(pre)) if not isinstance(v, (bool, int))]
        return inv(*values, *env)

    post, rec = core.step(SYM, enc.knobs, enc.params, pre)
    t = Transition(0, pre, post, rec, True, 1)
    bad = violations(SYM, OneStep(enc.knobs, enc.params, core, [t], [pre, post]), t)[prop][0]
    every = state_vars + env
    solver = z3.SolverFor("HORN")
    solver.set("timeout", max(1, int(timeout * 1000)))
    facts = z3.And(*enc.constraints) if enc.constraints else z3.BoolVal(True)
    solver.add(z3.ForAll(every, z3.Implies(facts, holds(core.initial(SYM, enc.knobs, enc.params)))))
    solver.add(z3.ForAll(every, z3.Implies(z3.And(facts, holds(pre)), holds(post))))
    solver.add(z3.ForAll(every, z3.Implies(z3.And(facts, holds(pre), _term(bad)), z3.BoolVal(False))))
    r = solver.check()
    if r == z3.sat:
        return "proved"
    return "violated" if r == z3.unsat else f"unknown ({solver.reason_unknown()})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(DEFAULT))
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    print("| file | slots | property | Spacer | s | Houdini inference | s |")
    print("|---|---|---|---|---|---|---|")
    for path in args.files:
        spec = load_check(str(ROOT / path))
        core = CORES[spec.space.template.policy]
        _, sub = _inference_space(spec.space)
        prop = (spec.properties or ("LIVE-NO-PROGRESS",))[0]
        t0 = time.monotonic()
        s = spacer(core, sub, prop, args.timeout)
        ts = time.monotonic() - t0
        t0 = time.monotonic()
        [inf] = infer(core, sub, candidates_for(core, spec.space.template.policy), [prop], args.timeout,
                      minimise=False)
        ti = time.monotonic() - t0
        print(f"| {path} | {sub.slots} | {prop} | {s} | {ts:.1f} | {inf.status} | {ti:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
