"""The invariants over the array model, for every n: those of class C1 (v2-ab-outgrowing; C2 and C3
change some of them, calm.py): per-index conditions (stated for one index j, proved for a Skolem j,
assumed at finitely many indices) and scalar ones, at every program point of the pass
(points.py).

A program point is a loop head of the micro-steps' program (model/symbolic/cores/trtllm_v2_micro.py): P0 (between steps), ARR@c (arrivals of
indices < c done), GEN@c, EV@(c, j) and RP@(c, j) (inside the generation body of c, its inner
loops at j), CTX@c, PFP@(c, j), DET@c, FAIL@c, EXEC@c. The invariant at a point says what is true
of each index according to how far the pass has got with it:
- arrived(j): this step's arrival and cancellation of j are done (`pending-until-arrival` then
  compares with `step < arrival`, the form it will have once the step counter moves);
- mid(j): arrived and not yet executed: the pass's flags describe j (scheduled decoders hold the
  pages of one more token, scheduled contexts hold their prompt's pages, still WAITING);
- the cursors: no generation flag at or after the generation cursor, no context flag at or after
  the context cursor.
The lifted forms of the core's invariants (model/symbolic/core.py `Core.invariants`, the trtllm_v2
core's `core_invariants`) and of proofs/claims.py `c1_invariants` are all here under their own
names; `blocks-conserved` is the ghost equation `free + S_blocks = num_blocks`, `reservation` is
`S_B <= num_blocks` with `within-reservation` (each request's pages within what fix B counts for
it). The progress facts are those of a witness argument carried through the pass: Q is a free
boolean assumed, at the start of the pass, to mean "quiet, and index u unfinished".
"""

from __future__ import annotations

import z3

from model.symbolic.cores.trtllm_v2_micro import ArrayState, b_part, changed, r_part
from model.symbolic.slots import DECODING, FINISHED, PENDING, PREEMPTED, PREFILLING, WAITING, Knobs, unfinished

from .calm import per_index_c23, scalars_c23
from .points import PROGRESS_POINTS, V2_PHASES, Point, stages

CLASSES = ("c1", "c2", "c3")


def per_index(ops, k: Knobs, st: ArrayState, j, p: Point, drop: tuple = (), cls: str = "c1") -> dict:
    """Named conditions on index j at point p (C1 with fixes A and B, chunking off, no host tier;
    C2 and C3 change some of them, calm.py)."""
    d = k.options.draft_len
    r = st.cell(j)
    ph = r["phase"]
    arrived, executed, gc, cc = stages(p, j, st.n)
    mid = ops.and_(arrived, ops.not_(executed))
    in_pass = p.kind != "P0"
    g = st.g
    inv = {}
    inv["fields"] = ops.and_(ops.or_(*[ph == q for q in V2_PHASES]), r["blocks"] >= 0, r["computed"] >= 0,
                             r["generated"] >= 0, r["preemptions"] >= 0, r["generated"] <= r["max_new"])
    inv["host-blocks-conserved"] = r["host_blocks"] == 0       # with the scalar free_host_blocks == 0
    inv["absent-is-pending"] = ops.implies(ops.not_(r["present"]), ops.and_(
        ph == PENDING, r["blocks"] == 0, r["generated"] == 0, r["computed"] == 0))
    # the engine is never dead in C1 (`no-error`), so pending means "not yet arrived"
    inv["pending-until-arrival"] = ops.implies(r["present"], (ph == PENDING) == ops.ite(
        arrived, g["step"] < r["arrival"], g["step"] <= r["arrival"]))
    live = ops.and_(ph >= WAITING, ph < FINISHED)
    inv["live-owes-tokens"] = ops.implies(live, ops.and_(
        r["generated"] < r["max_new"], ops.or_(r["output_len"] <= 0, r["generated"] < r["output_len"])))
    inv["pending-holds-nothing"] = ops.implies(ph == PENDING, ops.and_(
        r["blocks"] == 0, r["generated"] == 0, r["computed"] == 0, ops.not_(r["suspended"]), r["preemptions"] == 0))
    inv["done-holds-nothing"] = ops.implies(ph >= FINISHED, r["blocks"] == 0)
    inv["decode-cursor"] = ops.implies(ph == DECODING, ops.and_(
        r["generated"] >= 1, r["computed"] == r["prompt"] + r["generated"] - 1))
    inv["context-cursor"] = ops.implies(ops.or_(ph == WAITING, ph == PREFILLING, ph == PREEMPTED),
                                        r["computed"] < r["prompt"] + r["generated"])
    inv["waiting-is-fresh"] = ops.implies(ph == WAITING, ops.and_(
        r["computed"] == 0, r["generated"] == 0, r["preemptions"] == 0, ops.not_(r["suspended"]),
        r["blocks"] == ops.ite(ops.and_(in_pass, mid, r["ctx_s"]), k.blocks_for(ops, r["prompt"] + d), 0)))
    inv["decode-pages"] = ops.implies(ph == DECODING, r["blocks"] == k.blocks_for(
        ops, r["computed"] + d + ops.ite(ops.and_(in_pass, mid, r["gen_s"]), 1, 0)))
    inv["paused-holds-nothing"] = ops.implies(ph == PREEMPTED, ops.and_(
        r["blocks"] == 0, r["computed"] == 0, ops.not_(r["suspended"]), r["preemptions"] >= 1))
    inv["suspended-is-started"] = ops.implies(r["suspended"], ops.and_(
        ops.or_(ph == PREFILLING, ph == DECODING), r["blocks"] > 0))
    inv["context-whole"] = ph != PREFILLING
    inv["never-suspended"] = ops.not_(r["suspended"])
    inv["never-paused"] = ph != PREEMPTED
    inv["within-reservation"] = r["blocks"] <= b_part(ops, k, r)
    if cls in ("c2", "c3"):
        per_index_c23(ops, k, st, j, p, inv, mid, cls)
    elif in_pass:
        inv["in-list"] = ops.ite(arrived, ops.implies(mid, r["in_list"] == ops.and_(r["present"], unfinished(ops, ph))),
                                 ops.not_(r["in_list"]))
        inv["no-pause-flags"] = ops.and_(ops.not_(r["victims"]), ops.not_(r["evicted"]), ops.not_(r["paused"]),
                                         ops.not_(r["preempted_ids"]))
        inv["gen-scheduled"] = ops.implies(ops.and_(mid, r["gen_s"]), ops.and_(
            ph == DECODING, r["own"] == 1, r["tokens"] == 1 + d, ops.not_(r["ctx_s"])))
        inv["ctx-scheduled"] = ops.implies(ops.and_(mid, r["ctx_s"]), ops.and_(
            ph == WAITING, r["own"] == r["prompt"], r["tokens"] == r["prompt"] + d, r["pending"]))
        inv["scheduled"] = r["scheduled"] == ops.or_(r["gen_s"], r["ctx_s"])
        inv["pending"] = ops.implies(r["pending"], ops.and_(r["in_list"], ops.implies(mid, ph == WAITING)))
        inv["gen-cursor"] = ops.implies(j >= gc, ops.and_(ops.not_(r["gen_s"]), ops.not_(r["pending"])))
        inv["ctx-cursor"] = ops.implies(j >= cc, ops.not_(r["ctx_s"]))
        inv["nothing-scheduled"] = ops.implies(ops.not_(g["sched_any"]), ops.not_(r["scheduled"]))
        if p.kind in ("GEN", "EV", "RP"):
            inv["gen-progress"] = ops.implies(ops.and_(ops.not_(g["sched_any"]), j < gc, r["in_list"]), r["pending"])
        if p.kind in ("CTX", "PFP"):
            inv["ctx-progress"] = ops.implies(ops.not_(g["sched_any"]), ops.and_(
                ops.implies(r["in_list"], r["pending"]), ops.implies(j < cc, ops.not_(r["pending"]))))
        if p.after("PFP"):
            inv["pass-progress"] = ops.implies(ops.not_(g["sched_any"]), ops.not_(r["in_list"]))
        if p.kind in PROGRESS_POINTS:
            inv["quiet"] = ops.implies(ops.and_(g["Q"], r["present"]), ops.and_(
                r["arrival"] < g["step"], r["cancel_at"] < g["step"]))
    return {name: c for name, c in inv.items() if name not in drop}


def scalars(ops, k: Knobs, st: ArrayState, p: Point, drop: tuple = (), cls: str = "c1") -> dict:
    if cls in ("c2", "c3"):
        return {name: c for name, c in scalars_c23(ops, k, st, p, cls).items() if name not in drop}
    g = st.g
    inv = {"blocks-conserved": ops.and_(g["free_blocks"] >= 0, g["free_blocks"] + g["S_blocks"] == k.num_blocks),
           "free-host": g["free_host_blocks"] == 0,
           "reservation": g["S_B"] <= k.num_blocks,
           "no-error": ops.and_(ops.not_(g["error"]), g["stalls"] == 0)}
    if p.kind != "P0":
        inv["pass"] = ops.and_(ops.not_(g["dead"]), g["end"] == st.n, g["frontier"] == st.n,
                               ops.not_(g["ev_active"]), ops.not_(g["rp_active"]), ops.not_(g["pfp_active"]),
                               ops.implies(g["sched_any"], g["prog_any"]))
        inv["no-plan-error"] = ops.not_(g["perr"])
        if not p.after("DET"):
            inv["budget-unused"] = ops.implies(ops.not_(g["sched_any"]), ops.and_(
                g["budget_requests"] == 0, g["budget_tokens"] == 0))
        # each loop's own scalars keep their initial values until the loop starts
        if p.kind == "ARR":
            inv["gen-fresh"] = g["going"]
        if not p.after("RP"):
            inv["ctx-fresh"] = g["cgoing"]
        if not p.after("PFP"):
            inv["det-fresh"] = ops.and_(ops.not_(g["det_gens"]), ops.not_(g["det_ctxs"]))
        if p.kind in ("GEN", "EV", "RP"):
            inv["gen-going"] = ops.implies(ops.not_(g["sched_any"]), g["going"])
        if p.kind in ("CTX", "PFP"):
            inv["ctx-going"] = ops.implies(ops.not_(g["sched_any"]), g["cgoing"])
        if p.kind == "DET":
            inv["progress"] = ops.implies(g["Q"], g["sched_any"])
            inv["det-idle"] = ops.implies(ops.not_(g["prog_any"]), ops.and_(ops.not_(g["det_gens"]),
                                                                           ops.not_(g["det_ctxs"])))
        if p.kind in PROGRESS_POINTS:
            u = g["u"]
            ru = st.cell(u)
            inv["witness-unfinished"] = ops.implies(g["Q"], ops.and_(
                u >= 0, u < st.n, ru["present"], unfinished(ops, ru["phase"])))
    return {name: c for name, c in inv.items() if name not in drop}


def outgrowing():
    """How many requests of the workload can outgrow their replay: class C3 puts them first, so a class
    condition at one index compares the index with it (the workload is the same in every state). Made in Z3's
    current context at each call (checkers/clock.py `fresh_context`)."""
    return z3.Int("workload.outgrowing")


def workload_at(ops, k: Knobs, st: ArrayState, j, per_index_class=None) -> list:
    """The workload's per-request constraints at j (checkers/induction.py `workload_constraints`
    without the two that relate neighbouring slots, which no obligation needs) and the class's,
    which sees the request's fields, its `index` and the workload's `outgrowing`."""
    r = {**st.cell(j), "index": j, "outgrowing": outgrowing()}
    out = [r["prompt"] >= 1, r["max_new"] >= 1, r["arrival"] >= 0,
           z3.Or(r["output_len"] == 0, z3.And(r["output_len"] >= 1, r["output_len"] <= r["max_new"])),
           z3.Or(r["cancel_at"] == -1, r["cancel_at"] >= r["arrival"])]
    if per_index_class is not None:
        out += [c for c in per_index_class(ops, k, r) if c is not True]
    return out


def sum_lemmas(ops, k: Knobs, st: ArrayState, idx: list, witnesses: dict, names: set, others: dict = None) -> list:
    """Facts about the ghost sums of a state where the per-index invariants hold at *every* index
    (the pre-state of an obligation), instantiated at the indices `idx`:
    - a sum of non-negative parts is at least each part and at least 0: S_blocks (parts `blocks`,
      non-negative by `fields`), S_B - S_blocks (parts b(j) - blocks(j), by `within-reservation`)
      and, within a pass, S_chg (parts 0 or 1); for C2, at least any two parts at distinct indices;
    - a sum that is not 0 has a part that is not 0, at a witness index (a fresh constant: adding
      it keeps every model of the rest, so it only makes the query harder to refute);
    - `others`: a sum that exceeds its part at an index c in [0, n) has a positive part at a
      witness index other than c."""
    g, n = st.g, st.n
    fns = {"S_blocks": lambda r: r["blocks"], "S_B": lambda r: b_part(ops, k, r),
           "S_chg": lambda r: ops.ite(changed(ops, r), 1, 0), "S_R": lambda r: r_part(ops, k, r),
           # C3: the pages held beyond the reservation
           "S_blocks-S_R": lambda r: r["blocks"] - r_part(ops, k, r)}
    ghost = {**g, "S_blocks-S_R": g["S_blocks"] - g["S_R"]}
    parts = []
    if "fields" in names:
        parts.append((g["S_blocks"], fns["S_blocks"]))
    if "within-reservation" in names:
        parts.append((g["S_B"] - g["S_blocks"], lambda r: b_part(ops, k, r) - r["blocks"]))
    if "S_chg" in witnesses:
        parts.append((g["S_chg"], fns["S_chg"]))
    if "S_R" in witnesses:   # C3: what fix B sums is at least the reservation, part by part
        parts.append((g["S_B"] - g["S_R"], lambda r: b_part(ops, k, r) - r_part(ops, k, r)))
    out = []
    for total, part in parts:
        out.append(total >= 0)
        for a, i in enumerate(idx):
            out.append(z3.Implies(z3.And(i >= 0, i < n), total >= part(st.cell(i))))
            if "S_chg" in witnesses:   # C2: and at least any two distinct parts together
                for h in idx[a + 1:]:
                    out.append(z3.Implies(z3.And(i >= 0, i < n, h >= 0, h < n, i != h),
                                          total >= part(st.cell(i)) + part(st.cell(h))))
    for name, w in witnesses.items():
        if name in g:
            out.append(z3.Implies(g[name] != 0, z3.And(w >= 0, w < n, fns[name](st.cell(w)) != 0)))
    for name, (w, c) in (others or {}).items():
        out.append(z3.Implies(z3.And(c >= 0, c < n, ghost[name] > fns[name](st.cell(c))),
                              z3.And(w >= 0, w < n, w != c, fns[name](st.cell(w)) > 0)))
    return out


