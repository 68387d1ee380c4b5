"""The invariants of classes C2 and C3 over the array model, for every n (docs/symbolic.md, "Classes C2
and C3"): per-index conditions at every program point and the scalar ones, added to or replacing C1's
(invariants.py `per_index`, `scalars`, which dispatch here)."""

from __future__ import annotations

from model.symbolic.cores.trtllm_v2_micro import STOP, ArrayState, b_part, changed, gate_allows, resume_gate
from model.symbolic.slots import DECODING, PREEMPTED, WAITING, Knobs, started, unfinished

from .points import PROGRESS_POINTS, V2_PHASES, Point, stages

# C2: no request outgrows its replay, every worst case within the resume gate. Fix B counts no
# request there, so it never refuses, and fix A lets every started request be paused. C3: the
# requests that can outgrow come first and the resume gate is off; fix B reserves those, fix A
# protects the ones whose replay has outgrown the budget. Unlike C1, allocations fail: the eviction, pause and preemption loops run. The progress
# argument is about the states where the pass has done nothing yet ("calm": nothing scheduled, no
# request changed in phase or suspension since the arrivals, except, inside the generation body of
# c, c's own resumption): a calm pass visits every listed request, and the first one it visits is
# scheduled, because when nothing is scheduled and nothing paused the pool holds only the pages of
# the request being visited (in C3, and at most the reserved worst cases of the others), which its
# growth and the resume gate both allow (C2: worst <= 0.95 N; C3: the gate is off).

def calm(ops, st: ArrayState, p: Point):
    """Nothing done yet by the pass (from GEN on; inside the generation body of c, c's own
    resumption excepted)."""
    g = st.g
    if p.kind not in ("EV", "RP"):
        return ops.and_(ops.not_(g["sched_any"]), g["S_chg"] == 0)
    r = st.cell(p.c)
    resumed = ops.and_(r["ss"], ops.not_(r["suspended"]), r["phase"] == r["sp"])
    return ops.and_(ops.not_(g["sched_any"]), g["S_chg"] - ops.ite(changed(ops, r), 1, 0) == 0,
                    ops.implies(changed(ops, r), resumed))


def evict_candidate(ops, r: dict):
    """`evict_for_generation`'s condition at an index below `end` (the other half of it)."""
    return ops.and_(r["in_list"], started(ops, r["phase"]), r["blocks"] > 0, ops.not_(r["suspended"]))


def pause_candidate(ops, k: Knobs, r: dict):
    """`recompute_pause_for_generation`'s condition at an index below the frontier."""
    ok = ops.and_(r["in_list"], ops.not_(r["victims"]), started(ops, r["phase"]), ops.not_(r["evicted"]))
    if k.options.fix_replay_fit:
        ok = ops.and_(ok, r["prompt"] + r["generated"] + k.options.draft_len <= k.max_num_tokens)
    return ok


def allocation_fails(ops, k: Knobs, st: ArrayState, c, util: tuple):
    """`allocate_generation` at c fails on this state: refused resumption, or too few free pages."""
    r = st.cell(c)
    need = k.blocks_for(ops, r["computed"] + 1 + k.options.draft_len) - r["blocks"]
    return ops.ite(r["suspended"], ops.not_(gate_allows(k, st, util)), ops.and_(need > 0, need > st.g["free_blocks"]))


def per_index_c23(ops, k: Knobs, st: ArrayState, j, p: Point, inv: dict, mid, cls: str) -> None:
    d = k.options.draft_len
    r = st.cell(j)
    ph = r["phase"]
    g = st.g
    in_pass = p.kind != "P0"
    arrived = stages(p, j, st.n)[0]
    del inv["never-suspended"], inv["never-paused"]
    if cls == "c2":
        # fix B counts no request of C2 (none can outgrow), so what it sums is the pages held
        inv["b-is-blocks"] = b_part(ops, k, r) == r["blocks"]
    else:
        # fix A's invariant (proofs/claims.py `paused_replay_fits`)
        inv["paused-replay-fits"] = ops.implies(ph == PREEMPTED, r["prompt"] + r["generated"] + d <= k.max_num_tokens)
    replay = r["prompt"] + r["generated"]
    ctx_s = ops.and_(in_pass, mid, r["ctx_s"]) if in_pass else False
    inv["paused-holds-nothing"] = ops.implies(ph == PREEMPTED, ops.and_(
        r["blocks"] == ops.ite(ctx_s, k.blocks_for(ops, replay + d), 0), r["computed"] == 0,
        ops.not_(r["suspended"]), r["preemptions"] >= 1))
    if p.kind == "RP":
        # the pause loop's retry grew c by the pages of one more token
        grown = ops.and_(j == p.c, g["rp_active"], g["rp_done"])
        inv["decode-pages"] = ops.implies(ph == DECODING, r["blocks"] == k.blocks_for(
            ops, r["computed"] + d + ops.ite(ops.or_(ops.and_(mid, r["gen_s"]), grown), 1, 0)))
    if not in_pass:
        return
    gc, cc = stages(p, j, st.n)[2:]
    quiet_now = ops.and_(g["Q"], r["present"]) if p.kind != "P0" else False
    inv["in-list"] = ops.ite(arrived, ops.implies(mid, r["in_list"] == ops.and_(r["present"], unfinished(ops, ph))),
                             ops.not_(r["in_list"]))
    inv["pause-flags"] = ops.and_(ops.implies(r["victims"], ops.and_(ph == PREEMPTED, ops.not_(r["scheduled"]))),
                                  ops.implies(r["preempted_ids"], ops.and_(ph == PREEMPTED, ops.not_(r["scheduled"]))),
                                  ops.implies(r["paused"], ops.and_(ph == PREEMPTED, ops.not_(r["scheduled"]))),
                                  ops.implies(r["evicted"], ops.and_(ph == DECODING, r["suspended"],
                                                                     ops.not_(r["scheduled"]))))
    inv["paused-flags"] = ops.and_(ops.implies(ops.or_(r["victims"], r["preempted_ids"]), r["paused"]),
                                   ops.implies(r["paused"], r["sp"] == DECODING))   # a pause changes the phase
    if not p.after("RP"):
        inv["no-preemption-flags"] = ops.not_(r["preempted_ids"])
    if p.kind in ("GEN", "EV", "RP"):
        # a request the generation loop has not reached yet is changed only as a victim
        ahead = j >= p.c if p.kind == "GEN" else j > p.c
        inv["unvisited-changes"] = ops.implies(ops.and_(ahead, changed(ops, r)), ops.or_(r["evicted"], r["paused"]))
        # an eviction moves `end` to its victim, ahead of the cursor
        inv["evicted-ahead"] = ops.implies(ops.and_(r["evicted"], j >= p.c), g["end"] <= j)
    inv["gen-scheduled"] = ops.implies(ops.and_(mid, r["gen_s"]), ops.and_(
        ph == DECODING, r["own"] == 1, r["tokens"] == 1 + d, ops.not_(r["ctx_s"]), ops.not_(r["suspended"])))
    inv["ctx-scheduled"] = ops.implies(ops.and_(mid, r["ctx_s"]), ops.and_(
        ops.or_(ph == WAITING, ph == PREEMPTED), r["computed"] == 0, r["own"] == replay, r["tokens"] == replay + d,
        r["pending"]))
    inv["scheduled"] = r["scheduled"] == ops.or_(r["gen_s"], r["ctx_s"])
    inv["pending"] = ops.implies(r["pending"], ops.and_(r["in_list"], ops.not_(r["paused"]), ops.implies(
        mid, ops.or_(ph == WAITING, ph == PREEMPTED))))
    inv["gen-cursor"] = ops.implies(j >= gc, ops.and_(ops.not_(r["gen_s"]), ops.not_(r["pending"])))
    inv["ctx-cursor"] = ops.implies(j >= cc, ops.not_(r["ctx_s"]))
    inv["nothing-scheduled"] = ops.implies(ops.not_(g["sched_any"]), ops.not_(r["scheduled"]))
    if p.kind in PROGRESS_POINTS:
        inv["quiet"] = ops.implies(quiet_now, ops.and_(r["arrival"] < g["step"], r["cancel_at"] < g["step"]))
    if p.kind == "ARR":
        inv["calm-flags"] = ops.and_(ops.not_(r["victims"]), ops.not_(r["evicted"]), ops.not_(r["paused"]),
                                     ops.not_(r["preempted_ids"]))
        inv["quiet-unchanged"] = ops.implies(g["Q"], ops.and_(ph == r["sp0"], r["suspended"] == r["ss0"]))
        return
    # from the snapshot on
    inv["snapshot"] = ops.and_(ops.or_(*[r["sp"] == q for q in V2_PHASES]), ops.implies(r["ss"], r["sp"] == DECODING))
    # c's own resumption, inside its generation body (which ends in a schedule or a suspension, both
    # flagged): the one change the pass makes without a flag
    own = ops.and_(j == p.c, g["ev_active"], r["ss"], ops.not_(r["suspended"]), ph == r["sp"]) \
        if p.kind in ("EV", "RP") else False
    # so a running decoder that was neither scheduled nor suspended is as it was (a pause stops it)
    inv["running-unchanged"] = ops.implies(ops.and_(ph == DECODING, ops.not_(r["suspended"]),
                                                    ops.not_(r["scheduled"]), ops.not_(own)),
                                           ops.not_(changed(ops, r)))
    if p.kind in ("EV", "RP"):
        inv["cursor-changes"] = ops.implies(ops.and_(j == p.c, changed(ops, r)),
                                            ops.or_(own, r["gen_s"], r["evicted"], r["paused"]))
    if not p.after("RP"):
        inv["gen-pause-flags"] = ops.implies(r["paused"], r["victims"])
    inv["quiet-snapshot"] = ops.implies(g["Q"], ops.and_(r["sp"] == r["sp0"], r["ss"] == r["ss0"]))
    inv["changes-flagged"] = ops.implies(changed(ops, r), ops.or_(g["prog_any"], own))
    quiet_pass = calm(ops, st, p)
    inv["calm-flags"] = ops.implies(quiet_pass, ops.and_(ops.not_(r["victims"]), ops.not_(r["evicted"]),
                                                         ops.not_(r["paused"]), ops.not_(r["preempted_ids"])))
    if p.kind == "GEN":
        inv["gen-progress"] = ops.implies(ops.and_(quiet_pass, j < p.c, r["in_list"]), r["pending"])
    if p.kind in ("EV", "RP"):
        inv["gen-progress"] = ops.implies(ops.and_(quiet_pass, j <= p.c, r["in_list"]),
                                          ops.or_(r["pending"], ops.and_(j == p.c, g["ev_active"])))
        scanned = p.j if p.kind == "EV" else p.c
        inv["evict-scan"] = ops.implies(ops.and_(quiet_pass, g["ev_active"], j > scanned, j < st.n),
                                        ops.not_(evict_candidate(ops, r)))
    if p.kind == "RP":
        inv["pause-scan"] = ops.implies(ops.and_(quiet_pass, g["rp_active"], j > p.j, j < st.n),
                                        ops.not_(pause_candidate(ops, k, r)))
    if p.kind in ("CTX", "PFP"):
        inv["ctx-progress"] = ops.implies(quiet_pass, ops.and_(
            ops.implies(r["in_list"], r["pending"]), ops.implies(j < cc, ops.not_(r["pending"]))))
    if p.after("PFP"):
        inv["pass-progress"] = ops.implies(quiet_pass, ops.not_(r["in_list"]))


def scalars_c23(ops, k: Knobs, st: ArrayState, p: Point, cls: str) -> dict:
    g = st.g
    inv = {"blocks-conserved": ops.and_(g["free_blocks"] >= 0, g["free_blocks"] + g["S_blocks"] == k.num_blocks),
           "free-host": g["free_host_blocks"] == 0,
           **({"S_B-is-S_blocks": g["S_B"] == g["S_blocks"]} if cls == "c2" else {"reservation": g["S_R"] <= k.num_blocks}),
           "no-error": ops.and_(ops.not_(g["error"]), g["stalls"] == 0)}
    if p.kind == "P0":
        return inv
    util = resume_gate(k)
    inv["pass"] = ops.and_(ops.not_(g["dead"]), g["end"] <= st.n, g["frontier"] <= st.n,
                           ops.implies(g["sched_any"], g["prog_any"]), g["S_chg"] >= 0)
    inv["no-plan-error"] = ops.not_(g["perr"])
    if p.kind not in ("EV", "RP"):
        inv["no-generation-loops"] = ops.and_(ops.not_(g["ev_active"]), ops.not_(g["rp_active"]))
    else:
        # inside c's generation body: the loops run only for a listed decoder whose allocation failed,
        # and the pause loop's retry, once it succeeded, has resumed c
        c = st.cell(p.c)
        retried = ops.not_(g["rp_done"]) if p.kind == "EV" else ops.implies(g["rp_done"], ops.not_(c["suspended"]))
        inv["generation-loops"] = ops.and_(
            ops.implies(g["rp_active"], g["ev_active"]), ops.implies(g["rp_done"], g["rp_active"]), retried,
            ops.implies(g["ev_active"], ops.and_(c["in_list"], c["phase"] == DECODING, ops.not_(c["gen_s"]),
                                                 ops.not_(c["evicted"]), ops.not_(c["victims"]))))
    if p.kind != "PFP":
        inv["no-preemption-loop"] = ops.not_(g["pfp_active"])
    if not p.after("DET"):
        inv["budget-unused"] = ops.implies(ops.not_(g["sched_any"]), ops.and_(
            g["budget_requests"] == 0, g["budget_tokens"] == 0))
    if p.kind == "ARR":
        inv["gen-fresh"] = ops.and_(g["going"], g["end"] == st.n, g["frontier"] == st.n)
    if not p.after("RP"):
        inv["ctx-fresh"] = g["cgoing"]
    if not p.after("PFP"):
        inv["det-fresh"] = ops.and_(ops.not_(g["det_gens"]), ops.not_(g["det_ctxs"]))
    if p.kind != "ARR":
        quiet_pass = calm(ops, st, p)
        inv["calm-pass"] = ops.implies(quiet_pass, ops.and_(g["end"] == st.n, g["frontier"] == st.n))
        if p.kind in ("GEN", "EV", "RP"):
            inv["gen-going"] = ops.implies(quiet_pass, g["going"])
        if p.kind in ("EV", "RP"):
            c = st.cell(p.c)
            inv["calm-allocation-failed"] = ops.implies(ops.and_(quiet_pass, g["ev_active"]), ops.and_(
                g["rp_active"] == bool(k.options.enable_recompute_pause), ops.not_(g["rp_done"]),
                c["in_list"], c["phase"] == DECODING, allocation_fails(ops, k, st, p.c, util)))
        if p.kind in ("CTX", "PFP"):
            inv["ctx-going"] = ops.implies(quiet_pass, g["cgoing"])
        if p.kind == "PFP":
            inv["calm-no-preemption"] = ops.implies(quiet_pass, ops.not_(g["pfp_active"]))
            c = st.cell(p.c)
            inv["preemption-loop"] = ops.implies(g["pfp_active"], ops.and_(
                g["cx_guard"], g["cx_first"], g["cx_act"] == STOP, c["pending"], ops.not_(c["ctx_s"]),
                ops.not_(c["scheduled"]), c["blocks"] == 0, c["computed"] == 0))
        if p.kind == "DET":
            inv["progress"] = ops.implies(g["Q"], ops.not_(quiet_pass))
            inv["det-idle"] = ops.implies(ops.not_(g["prog_any"]), ops.and_(ops.not_(g["det_gens"]),
                                                                           ops.not_(g["det_ctxs"])))
        if p.kind in ("FAIL", "EXEC"):
            inv["progress"] = ops.implies(g["Q"], ops.or_(g["sched_any"], g["S_chg"] > 0))
    if p.kind in PROGRESS_POINTS:
        u = g["u"]
        ru = st.cell(u)
        inv["witness-unfinished"] = ops.implies(g["Q"], ops.and_(
            u >= 0, u < st.n, ru["present"], unfinished(ops, ru["phase"])))
    return inv
