"""What `schedproof check` prints: the status line, the configuration, the workload, and the trace
with one labelled line per transition (what arrived, ran, was preempted, finished, ...)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from checkers.bmc import BmcResult, Counterexample, SearchEvent
from checkers.replay import Replay
from model.state import Phase
from model.symbolic.slots import SlotState

PHASE = {int(p): p.name for p in Phase}


def transition_label(cex: Counterexample, t: int) -> str:
    """What happened in transition t (0-based), from the states and the step record."""
    pre, post, m = cex.states[t], cex.states[t + 1], cex.macro[t]
    first = pre.g["step"]
    if m > 1:
        decoders = [i for i, (a, b) in enumerate(zip(pre.req, post.req)) if b["generated"] > a["generated"]]
        return (f"steps {first}-{first + m - 1} ({m} steps, one transition): "
                f"{_names(decoders)} decode one token each step")
    rec = cex.records[t]
    parts = []
    arrived = [i for i, (a, b) in enumerate(zip(pre.req, post.req))
               if a["phase"] == Phase.PENDING and b["phase"] != Phase.PENDING and not rec.flags["failed"][i]]
    if arrived:
        parts.append(f"{_names(arrived)} arrive")
    cancelled = [i for i, b in enumerate(post.req) if b["phase"] == Phase.CANCELLED and pre.req[i]["phase"] != Phase.CANCELLED]
    if cancelled:
        parts.append(f"{_names(cancelled)} cancelled")
    runs = [f"r{i} {'decodes' if pre.req[i]['phase'] == Phase.DECODING else f'context {tok}'}"
            for i, tok in enumerate(rec.tokens) if rec.flags["scheduled"][i]]
    if runs:
        total = sum(rec.tokens)
        parts.append(", ".join(runs) + f" ({total} token{'s' if total != 1 else ''})")
    for flag, verb in (("offloaded", "suspended/offloaded"), ("preempted", "preempted for recompute"),
                       ("finished", "finish"), ("rejected", "rejected"), ("failed", "fail")):
        who = [i for i, v in enumerate(rec.flags[flag]) if v]
        if who:
            parts.append(f"{_names(who)} {verb}")
    if rec.error:
        parts.append("the engine raises")
    if not parts:
        parts.append("nothing is scheduled and no request changes")
    return f"step {first}: " + "; ".join(parts)


def _names(ids) -> str:
    return ", ".join(f"r{i}" for i in ids)


def state_line(s: SlotState, present: int) -> str:
    cells = []
    for i, r in enumerate(s.req[:present]):
        cell = f"r{i} {PHASE[r['phase']].lower()} gen={r['generated']} kv={r['computed']} blocks={r['blocks']}"
        if r.get("suspended"):
            cell += " suspended"
        cells.append(cell)
    return f"free={s.g['free_blocks']} | " + " | ".join(cells)


def as_text(path: str, result: BmcResult, rep: Optional[Replay], proved_lines: list[str]) -> str:
    out = []
    if result.status == "violated":
        cex = result.cex
        certifying = result.seconds - result.found_seconds >= 0.1
        spent = f" ({result.seconds:.1f} s in all, certifying it)" if certifying else ""
        out.append(f"violated {cex.property} at depth {cex.depth} ({cex.steps} engine steps), "
                   f"found in {result.found_seconds:.1f} s{spent}")
        if not result.scope:
            out.append("shortest: no run with fewer transitions violates a property searched")
        elif result.certified is None:
            out.append(f"shortest among {result.scope}")
        else:
            out.append(f"shortest among {result.scope}; {result.certified_in or 'the whole space'} "
                       f"{'have' if result.certified_in else 'has'} no violation in at most "
                       f"{_transitions(result.certified)} (time ran out before the rest was covered)")
        out.append(f"replay: {rep.message}")
        out.extend(trace_lines(result))
    elif result.status == "bounded":
        out.append(f"bounded: no property searched is violated by any run of at most {result.depth} transitions "
                   f"({result.seconds:.1f} s); deeper runs are not covered")
    else:
        # a time-out inside a capped tier covered only that tier's runs: say which
        out.append(f"{result.status}: {result.reason} after depth {result.depth} ({result.seconds:.1f} s); "
                   f"no counterexample of at most {result.depth} transitions among "
                   f"{result.scope or 'all runs of the space'}")
    if result.status != "bounded" and len(result.reached) > 1:
        out.append("reached: " + "; ".join(f"{scope} ({slots} slot{'s' if slots != 1 else ''}): no violation up to "
                                           f"depth {depth}" for scope, slots, depth in result.reached))
    out.extend(f"note: {n}" for n in result.notes)
    out.extend(proved_lines)
    return "\n".join(out)


def trace_lines(result: BmcResult) -> list[str]:
    """The configuration, the workload and the trace, one labelled line per transition."""
    cex = result.cex
    out = ["configuration: " + _config_line(cex.cfg)]
    if result.minimised:
        out.append("smallest configuration among counterexamples of this length: " + ", ".join(result.minimised))
    out.append("workload:")
    for i, s in enumerate(cex.workload.requests):
        extra = (f" stops after {s.output_len}" if s.output_len else "") + \
                (f" cancelled at step {s.cancel_at}" if s.cancel_at is not None else "")
        out.append(f"  r{i}: prompt {s.prompt}, max_new {s.max_new}, arrives at step {s.arrival}{extra}")
    out.append("trace:")
    present = len(cex.workload.requests)
    for t in range(cex.depth):
        out.append(f"  #{t + 1} {transition_label(cex, t)}")
        out.append(f"      {state_line(cex.states[t + 1], present)}")
    if cex.lasso_start is not None:
        out.append(f"  the state after #{cex.depth} equals the state after #{cex.lasso_start}: a loop")
    return out


def found_text(result: BmcResult, rep: Replay, replaces: bool) -> str:
    """A counterexample as soon as the search has it, before certification decides how far it is
    shortest (the final report follows when the search ends)."""
    cex = result.cex
    head = (f"{'shorter counterexample' if replaces else 'counterexample'}: {cex.property} at depth {cex.depth} "
            f"({cex.steps} engine steps) after {result.found_seconds:.1f} s; shortest so far among "
            f"{result.scope or 'the whole space'}; certifying it goes on")
    return "\n".join([head, f"replay: {rep.message}"] + trace_lines(result))


def progress_line(event: SearchEvent) -> str:
    """One status line: the stage, the depth covered, the spaces, the time left."""
    spaces = "+".join(str(n) for n in event.slots)
    what = "searching" if event.stage == "search" else "certifying"
    return (f"{what}: no violation up to depth {event.depth} with {spaces} request slot"
            f"{'s' if spaces != '1' else ''}; {max(0.0, event.seconds_left):.0f} s left")


def _transitions(n: int) -> str:
    return f"{n} transition{'s' if n != 1 else ''}"


def _config_line(cfg) -> str:
    fields = ["block_size", "num_blocks", "max_num_tokens", "max_batch_size", "host_blocks", "chunked_prefill"]
    line = f"{cfg.policy}: " + ", ".join(f"{f}={getattr(cfg, f)}" for f in fields)
    return line


def as_dict(path: str, result: BmcResult, rep: Optional[Replay]) -> dict:
    out = {"file": path, "status": result.status, "seconds": round(result.seconds, 3), "depth": result.depth,
           "notes": list(result.notes),
           # how far each space of the search got: the whole one and its capped subsets
           "reached": [{"space": scope, "slots": slots, "clear_to_depth": depth}
                       for scope, slots, depth in result.reached]}
    if result.status == "violated":
        cex = result.cex
        out["property"] = cex.property
        out["found_seconds"] = round(result.found_seconds, 3)   # `seconds` includes certifying it
        out["engine_steps"] = cex.steps
        out["config"] = {**{f.name: getattr(cex.cfg, f.name) for f in dataclasses.fields(cex.cfg)
                            if f.name != "options"},
                         "options": dataclasses.asdict(cex.cfg.options) if cex.cfg.options is not None else None}
        out["minimised"] = result.minimised
        out["workload"] = [dataclasses.asdict(s) for s in cex.workload.requests]
        out["trace"] = [{"action": "initial", "steps": 0, "state": _state_dict(cex.states[0])}]
        for t in range(cex.depth):
            out["trace"].append({"action": transition_label(cex, t), "steps": cex.macro[t],
                                 "state": _state_dict(cex.states[t + 1])})
        out["lasso_start"] = cex.lasso_start
        out["shortest_in"] = result.scope or "the whole space"
        if result.scope and result.certified is not None:
            out["clear_in"] = result.certified_in or "the whole space"
            out["clear_to_depth"] = result.certified
        out["replay"] = rep.message
    else:
        out["property"] = None
        out["trace"] = None
        out["config"] = None
        if result.reason:
            out["reason"] = result.reason
        if result.status in ("unknown", "timeout"):
            out["clear_in"] = result.scope or "the whole space"   # where no run of at most `depth` transitions fails
    return out


def _state_dict(s: SlotState) -> dict:
    """A slot state as JSON, each request's phase by name ("decoding"), as every report names it."""
    return {"requests": [dict(r, phase=PHASE[r["phase"]].lower()) if r["phase"] in PHASE else dict(r)
                         for r in s.req], **s.g}
