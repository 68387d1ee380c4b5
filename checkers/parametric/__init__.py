"""Proofs for any number of requests (trtllm_v2, class C1): the step as micro-steps over arrays with
symbolic n (model/symbolic/cores/trtllm_v2_micro.py, which the core itself runs on its slots), its
invariants at every program point (invariants.py), one quantifier-free query per micro-step
(obligations.py), and what ties them to the core (refinement.py).

`argument` runs the whole of it for one design and reports each part as
(action, name, status, seconds, reason):
- "refines":  the premises (`tied`): `Core.step` is, term for term, one pass of the micro-steps on its
              slots, and runs them in the order the obligations take them, for n up to a bound past the
              constants its code uses; then one pass over Z3 arrays equals `Core.step`, n = 1..refine_up_to;
- "lifts":    the array invariants imply the slot invariants given (the core's and the claim's),
              for n = 1..lift_up_to;
- "any-n":    init and each micro-step of the pass, for every n.
The claim holds for every n only if all are proved. docs/symbolic.md, "Any number of requests".
"""

from __future__ import annotations

from typing import Callable

from model.symbolic.slots import Knobs

from .. import clock
from .obligations import Result, Setup, prove_all_n
from .refinement import lifting, refinement, replay_counterexample, tied

__all__ = ["argument", "Result", "Setup", "prove_all_n", "lifting", "refinement", "replay_counterexample", "tied"]


def argument(k: Knobs, cons: list, per_index_class: Callable, slot_invariants: Callable, timeout: float,
             refine_up_to: int = 3, lift_up_to: int = 5, cls: str = "c1") -> list[tuple]:
    """`k`: the design's knobs with the class's numeric knobs as terms, `cons` their bounds
    (checkers/induction.py `symbolic_knobs`); `cls` whose invariants (invariants.CLASSES)."""
    deadline = clock.now() + timeout
    # The premises: the core's step is the micro-steps these proofs take apart, in their order
    # (refinement.py `tied`); without them every obligation below would be about a second definition.
    out = tied(k)
    for n in range(1, refine_up_to + 1):
        left = clock.until(deadline)
        if left <= 0:
            out.append(("refines", f"n={n}", "unknown", 0.0, "time-out"))
            continue
        r = refinement(k, n, left)
        out.append(("refines", f"n={n}", r.status, r.seconds, r.detail))
    for n in range(1, lift_up_to + 1):
        r = lifting(k, n, slot_invariants, per_index_class, max(0.001, clock.until(deadline)), cls=cls)
        out.append(("lifts", f"n={n}", r.status, r.seconds, r.detail))
    for r in prove_all_n(Setup(k, cons, per_index_class, cls=cls), max(0.001, clock.until(deadline))):
        reason = r.reason or ("fails: " + ", ".join(r.failed) if r.failed else "")
        out.append(("any-n", r.step, r.status, r.seconds, reason))
    return out
