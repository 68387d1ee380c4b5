"""The mutation suite as a table (proofs/mutants.py): for each planted bug and each claim it lies in, what the
argument for any number of requests says with the bug planted (the part that stops it), and, with
`--obligations`, whether the argument's obligations would have proved without the premises the tool now
checks (the route `prove` took before: every such bug was "proved for any n"); and the witness, replayed on
the real and the mutated simulator. `--find NAME` searches a witness for a bug of the catalogue
(`mutants.find_witness`, seeded) and prints it in the catalogue's form.

    .venv/bin/python bench/mutants.py [--obligations] [--mutant NAME]
    .venv/bin/python bench/mutants.py --find NAME [--seed 0] [--tries 4000]

docs/symbolic.md ("Any number of requests: the checked route") quotes its table.
"""

from __future__ import annotations

import argparse
import time

from checkers.induction import symbolic_knobs
from checkers.parametric import local_hf, local_sglang, local_vllm
from checkers.parametric import argument as array_argument
from model.symbolic.slots import Params
from proofs import mutants as M
from proofs import run as R
from proofs.plant import planted

OBLIGATIONS = {"vllm_v1": local_vllm.obligations, "sglang": local_sglang.obligations, "hf_cb": local_hf.obligations}


def obligations_without_premises(claim) -> str:
    """The argument's other parts, as `prove` ran them before the premises were checked (without the `sealed`
    premises and the parts no check establishes for every n, `open`): "all proved" or the first part not proved."""
    parts = []
    for b, one in R.per_block_size(claim):
        k, cons = symbolic_knobs(one.design, claim.knob_bounds)
        if claim.policy in OBLIGATIONS:
            parts += OBLIGATIONS[claim.policy](one.design, k, cons, 1200, claim.invariants, claim.workload)
        elif claim.parametric == "local":
            parts += [p for p in R.one_request_argument(one, k, cons, 1200) if p[0] != "sealed" and p[2] != "open"]
        else:   # the class at one index as `prove` gives it (C3's relates requests: `per_request`)
            per_index = claim.per_request or (lambda ops, k_, r: claim.workload(ops, k_, Params([r])))
            parts += array_argument(k, cons, per_index, R.invariant_set(claim), 1200, refine_up_to=2,
                                    cls=claim.parametric)[1:]
    missed = [f"{a} {n}" for a, n, st, _, _ in parts if st != "proved"]
    return "all proved" if not missed else f"not proved: {missed[0]}"


def table(only: str, with_obligations: bool) -> None:
    for m in M.MUTANTS:
        if only and not m.name.startswith(only):
            continue
        c0, w = M.claim(m.claims[0]), m.witness
        with planted(list(m.patches)):
            broken = M.violates(c0, w.cfg, w.workload)
        print(f"{m.name}: {m.story}")
        print(f"  witness ({len(w.workload.requests)} requests, {c0.name}): real simulator "
              f"{'violates' if M.violates(c0, w.cfg, w.workload) else 'keeps'} {c0.property}, mutated "
              f"{'violates' if broken else 'keeps'} it")
        for name in m.claims:
            c = M.claim(name)
            with planted(list(m.patches)):
                t0 = time.monotonic()
                any_n, why = R.decide_any_n(c, 1200, [], lambda event: None)
                secs = time.monotonic() - t0
                before = obligations_without_premises(c) if with_obligations else ""
            verdict = "PROVED FOR ANY n" if any_n else f"not for any n: {why[:150]}"
            print(f"  {name:36s} {verdict}  ({secs:.1f} s)" + (f"\n  {'':36s} without the premises: {before}"
                                                                  if before else ""))


def find(name: str, seed: int, tries: int) -> None:
    m = next(m for m in M.MUTANTS if m.name == name)
    c = M.claim(m.claims[0])
    t0 = time.monotonic()
    w = M.find_witness(m, c, seed=seed, tries=tries)
    print(f"{name}: {'no witness' if w is None else 'found'} in {time.monotonic() - t0:.1f} s (seed {seed})")
    if w is not None:
        knobs = ", ".join(f"{k}={getattr(w.cfg, k)}" for k in ("block_size", "num_blocks", "max_num_tokens",
                                                                 "max_batch_size"))
        print(f"  at({c.name!r}, {knobs}),")
        print("  W(" + ", ".join(f"({r.prompt}, {r.max_new}, {r.arrival})" for r in w.workload.requests) + ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutant", default="", help="only the bugs whose name starts with this")
    ap.add_argument("--obligations", action="store_true",
                    help="also run each argument's obligations without its premises (minutes for transformers)")
    ap.add_argument("--find", default="", metavar="NAME")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tries", type=int, default=4000)
    args = ap.parse_args()
    if args.find:
        find(args.find, args.seed, args.tries)
    else:
        table(args.mutant, args.obligations)


if __name__ == "__main__":
    main()
