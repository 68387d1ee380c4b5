"""The registry's properties as Z3 conditions on one unrolled transition of a core.

Each condition is the negation of the property of the same ID in registry.py, on a transition
(pre-state, record, post-state) of the bounded unrolling in checkers/bmc.py: satisfiable
means a run of the design violates it at that transition. Record-based conditions apply only
to single engine steps (an accelerated decode run schedules the same decoders each step, within
budget and cap by its guard). tests/symbolic/test_properties_symbolic.py holds each condition
to the registry's own check on simulated runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from model.policy import POLICIES
from model.symbolic.slots import FINISHED, PENDING, SlotRecord, SlotState, unfinished

# Reported in this order when one transition violates several: the most specific first.
PRIORITY = ("LIVE-NO-PROGRESS", "LIVE-LIVELOCK", "ENGINE-ERROR", "SAFE-BUDGET", "SAFE-BATCH", "SAFE-BLOCKS",
            "SAFE-NO-LEAK", "SAFE-REQUESTS")


@dataclasses.dataclass
class Transition:
    index: int            # 0-based: from states[index] to states[index + 1]
    pre: SlotState
    post: SlotState
    rec: SlotRecord
    single: Any           # true when this transition is one engine step
    macro: Any            # engine steps it stands for


def quiet(ops, params, s: SlotState):
    """The environment has nothing left to do: every request has arrived, no cancellation is due."""
    return ops.and_(*[ops.implies(w["present"], ops.and_(w["arrival"] < s.g["step"], w["cancel_at"] < s.g["step"]))
                      for w in params.slots])


def some_unfinished(ops, params, s: SlotState):
    return ops.or_(*[ops.and_(w["present"], unfinished(ops, r["phase"])) for w, r in zip(params.slots, s.req)])


def requests_equal(ops, a: SlotState, b: SlotState):
    return ops.and_(*[ra[f] == rb[f] for ra, rb in zip(a.req, b.req) for f in ra])


def key_equal(ops, a: SlotState, b: SlotState):
    return ops.and_(requests_equal(ops, a, b), *[a.g[f] == b.g[f] for f in a.g if f != "step"])


def violations(ops, u, t: Transition) -> dict[str, tuple[Any, Any]]:
    """Property ID -> (condition, lasso) where lasso lists (start index, condition) for livelocks."""
    k, params, core = u.enc.knobs, u.enc.params, u.core
    pre, post, rec = t.pre, t.post, t.rec
    slots = list(zip(params.slots, pre.req, post.req))
    out: dict[str, tuple[Any, Any]] = {}

    hard = POLICIES[core.policy].hard_step_budget
    out["SAFE-BUDGET"] = (ops.and_(hard, t.single, ops.sum(rec.tokens) > k.max_num_tokens), None)
    out["SAFE-BATCH"] = (ops.and_(t.single, ops.count(rec.flags["scheduled"]) > k.max_batch_size), None)

    held = ops.sum(r["blocks"] for r in post.req) + core.cached_blocks(ops, k, params, post)
    host_held = ops.sum(r["host_blocks"] for r in post.req)
    out["SAFE-BLOCKS"] = (ops.or_(post.g["free_blocks"] < 0, post.g["free_blocks"] + held != k.num_blocks,
                                  post.g["free_host_blocks"] < 0,
                                  post.g["free_host_blocks"] + host_held != k.host_blocks), None)

    # registry._no_leak: a request that is done holds no block of either tier and references no
    # shared prefix block; once every request is done the prefix cache counts no live reference
    done = [ops.or_(ops.not_(w["present"]), b["phase"] >= FINISHED) for w, a, b in slots]
    out["SAFE-NO-LEAK"] = (ops.or_(
        *[ops.and_(w["present"], b["phase"] >= FINISHED,
                   ops.or_(b["blocks"] > 0, b["host_blocks"] > 0, core.shared_blocks(ops, k, params, post, i) > 0))
          for i, (w, a, b) in enumerate(slots)],
        ops.and_(*done, core.cache_refs(ops, k, params, post) != 0)), None)

    answered = [ops.or_(rec.flags["finished"][i], rec.flags["failed"][i], rec.flags["rejected"][i])
                for i in range(len(slots))]
    lost = []
    for i, (w, a, b) in enumerate(slots):
        lost.append(ops.and_(w["present"], ops.or_(
            ops.and_(a["phase"] >= FINISHED, b["phase"] != a["phase"]),
            ops.and_(a["phase"] != PENDING, b["phase"] == PENDING),
            b["generated"] > w["max_new"],
            b["generated"] < a["generated"],
            ops.and_(t.single, answered[i], a["phase"] >= FINISHED))))
    out["SAFE-REQUESTS"] = (ops.or_(*lost), None)

    out["ENGINE-ERROR"] = (ops.and_(t.single, rec.error), None)

    out["LIVE-NO-PROGRESS"] = (ops.and_(
        t.single, quiet(ops, params, pre), some_unfinished(ops, params, pre),
        ops.not_(ops.or_(*rec.flags["scheduled"])), ops.not_(rec.error), requests_equal(ops, pre, post)), None)

    # A lasso closing at this transition: an earlier state with the same key, the environment
    # quiet from there, and no completion on the way round. The loop is at least two transitions
    # long and this one changes the key: a state that repeats at once is a fixpoint, which the
    # simulator ends as such and the registry never calls a livelock (a stuck fixpoint is
    # LIVE-NO-PROGRESS); once quiet the run is deterministic, so a run that reached a fixpoint
    # only repeats it, and a key that changes means a period of two or more.
    lasso = []
    finished_since = False
    for j in range(t.index, -1, -1):
        tj = u.transitions[j]
        finished_since = ops.or_(finished_since, ops.and_(tj.single, ops.or_(*tj.rec.flags["finished"])))
        if j == t.index:
            continue
        start = u.states[j]
        cond = ops.and_(quiet(ops, params, start), some_unfinished(ops, params, post),
                        ops.not_(finished_since), key_equal(ops, start, post))
        lasso.append((j, cond))
    out["LIVE-LIVELOCK"] = (ops.and_(ops.not_(key_equal(ops, pre, post)), ops.or_(*[c for _, c in lasso])), lasso)
    return out

