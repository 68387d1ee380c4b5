"""What `check` says of the proofs behind a verdict (proofs/review.py), and the report folder of a
verdict with no trace: proved, bounded or unknown (`--report DIR`: verdict.json and report.html).

A violation's folder is written by reportdir.py (its trace, diagnosis and regression test); this one
says what the reviewer can rely on: what was proved, by which claim or inferred invariant, for which
runs and how many requests, what the search covered beside it, and where a proof failed, the
counterexample to induction (its pre and post states named as the trace reports name them).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Optional

from checkers.bmc import BmcResult
from proofs.reach import NONE
from proofs.review import Review

from .checkreport import state_line

FORMAT = "schedproof-verdict/1"


def proved_text(path: str, review: Review, slots: int) -> str:
    props = ", ".join(review.properties)
    out = [f"proved: {props} for every run of the file ({slots} request slots at most), at every depth "
           f"({review.seconds:.1f} s)"]
    out += [f"by {line}" for line in review.argument()]
    return "\n".join(out)


def review_lines(review: Review) -> list[str]:
    """The proofs beside a search's verdict: the proved parts, the claims that do not reach the file and
    why, inference that failed (with its counterexample to induction), routes not taken."""
    out = [f"proved part: {line}" for line in review.argument()]
    for r in review.reaches:
        if r.kind == NONE:
            out.append(f"claim {r.line()}")
    for name, why in review.refused:
        out.append(f"claim {name} reaches the file but was not proved here: {why}")
    for inf, cap in review.inferred:
        if inf.status == "proved":
            continue
        where = "" if cap is None else f" (runs of at most {cap} requests per group)"
        out.append(f"inference{where}: {inf.line()}")
        if inf.cti is not None:
            pre, post = inf.cti
            out.append(f"  counterexample to induction, pre:  {state_line(pre, inf.slots)}")
            out.append(f"  counterexample to induction, post: {state_line(post, inf.slots)}")
            out.append(f"  (every inductive candidate holds in pre; the step from it violates {inf.property}: "
                       f"a fact that rules pre out is missing)")
    out += [f"note: {n}" for n in review.notes]
    return out


def as_dict(review: Review) -> dict:
    return {
        "status": review.status,
        "properties": review.properties,
        "proved_for_every_run": dict(review.whole),
        "argument": review.argument(),
        "claims": [{"claim": p.claim.name, "statement": p.claim.statement, "class": p.claim.class_text,
                    "reach": p.kind, "scope": p.verdict.scope, "seconds": round(p.verdict.seconds, 3)}
                   for p in review.claims],
        "not_reaching": [{"claim": r.claim.name, "why": r.why} for r in review.reaches if r.kind == NONE],
        "refused": [{"claim": n, "why": why} for n, why in review.refused],
        "inferred": [_inference(inf, cap) for inf, cap in review.inferred],
        "notes": list(review.notes),
        "seconds": round(review.seconds, 3),
    }


def _inference(inf, cap) -> dict:
    d = {"property": inf.property, "status": inf.status, "slots": inf.slots, "cap": cap,
         "seconds": round(inf.seconds, 3), "candidates": inf.candidates, "invariant": list(inf.kept),
         "minimal": inf.minimal, "needed": dict(inf.needed), "pruned": dict(inf.dropped), "reason": inf.reason}
    if inf.cti is not None:
        d["cti"] = {"pre": state_line(inf.cti[0], inf.slots), "post": state_line(inf.cti[1], inf.slots)}
    return d


def rely_on(review: Review, result: Optional[BmcResult], slots: int) -> list[str]:
    """What the reviewer can rely on, in sentences."""
    if review.status == "proved":
        return [f"No run of this design and workload space violates {', '.join(review.properties)}, at any depth "
                f"and for every request count the file allows (up to {slots}): a proof, not a search."]
    out = []
    if review.argument():
        out.append("Proved parts (at every depth): " + "; ".join(review.argument()))
    if result is not None and result.status == "bounded":
        out.append(f"Beyond them, no run of at most {result.depth} transitions violates a property searched; "
                   f"longer runs are not covered.")
    elif result is not None:
        got = "; ".join(f"{scope} ({n} slots): clear to depth {d}" for scope, n, d in result.reached)
        out.append(f"Beyond them, the search ran out of time ({result.reason}); how far each part got: {got}. "
                   f"Nothing deeper is claimed.")
    return out


def write(folder: Path, path: str, name: str, review: Review, result: Optional[BmcResult], slots: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "file": path, "name": name, "verdict": review.status,
            "rely_on": rely_on(review, result, slots), "review": as_dict(review)}
    if result is not None:
        data["search"] = {"status": result.status, "depth": result.depth, "reason": result.reason,
                          "reached": [list(r) for r in result.reached], "notes": list(result.notes),
                          "seconds": round(result.seconds, 3)}
    (folder / "verdict.json").write_text(json.dumps(data, indent=2))
    (folder / "report.html").write_text(_html(data, review))
    return folder


def _html(data: dict, review: Review) -> str:
    e = html.escape
    rows = "".join(f"<li>{e(s)}</li>" for s in data["rely_on"])
    parts = [f"<h1>{e(data['name'])}: {e(data['verdict'])}</h1>", f"<p>{e(data['file'])}</p>",
             "<h2>What you can rely on</h2>", f"<ul>{rows}</ul>"]
    for c in data["review"]["claims"]:
        scope = "any number of requests" if c["scope"] == "any" else f"up to {c['scope']} requests"
        parts.append(f"<h2>Claim {e(c['claim'])} ({e(c['reach'])} of the space, proved for {e(scope)})</h2>"
                     f"<p>{e(c['statement'])}</p><p>Class: {e(c['class'])}</p>")
    for inf in data["review"]["inferred"]:
        where = "every run of the file" if inf["cap"] is None else f"runs of at most {inf['cap']} requests per group"
        parts.append(f"<h2>Inferred invariant for {e(inf['property'])}: {e(inf['status'])} ({e(where)}, "
                     f"{inf['seconds']:.1f} s)</h2>")
        if inf["invariant"]:
            needed = inf["needed"]
            items = "".join(f"<li><code>{e(f)}</code>" + (f": without it, {e(needed[f])}" if f in needed else "")
                            + "</li>" for f in inf["invariant"])
            parts.append(f"<p>{'Each one needed (removing any breaks the proof):' if inf['minimal'] else 'Invariants:'}"
                         f"</p><ul>{items}</ul>")
        if "cti" in inf:
            parts.append(f"<p>Counterexample to induction: every inductive candidate holds in</p>"
                         f"<pre>{e(inf['cti']['pre'])}</pre><p>and one step leads to a violation:</p>"
                         f"<pre>{e(inf['cti']['post'])}</pre>")
    if data.get("search"):
        s = data["search"]
        reached = "".join(f"<li>{e(str(r[0]))} ({r[1]} slots): no violation up to depth {r[2]}</li>"
                          for r in s["reached"])
        parts.append(f"<h2>Search: {e(s['status'])} ({s['seconds']:.1f} s)</h2><ul>{reached}</ul>")
    notes = data["review"]["notes"]
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + e(data["name"]) + "</title></head><body>"
            + "".join(parts) + "</body></html>\n")
