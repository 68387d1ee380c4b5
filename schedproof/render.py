"""report.md and report.html from a report's data (report.json) and its trace (trace.itf.json).

Both say the same things in the same order, for a scheduler engineer who has not read the code:
the cause in one sentence, what to change (each change re-checked), the timeline picture (HTML
only), the mechanism, how complete the verdict is, the design and the workload, the trace as a table
with named phases and long runs folded, and how to reproduce it. The HTML is one file: styles and
the SVG picture inline, no script, nothing fetched.
"""

from __future__ import annotations

import html as _html

from .itf import ItfTrace
from .timeline import timeline_svg
from .tracetable import rows

VERDICT_WORDS = {
    "deadlock": "deadlock: unfinished work and a scheduler that issues none",
    "livelock": "livelock: a cycle of states in which nothing completes",
    "crash": "crash: the engine raised",
    "violation": "a safety or fairness property failed",
    "ok": "ok: no property violated",
    "unknown": "unknown: nothing is claimed",
}


def _sections(data: dict, trace: ItfTrace, folder: str) -> dict:
    d = data["diagnosis"]
    cfg = data["config"]
    design = ([("loop", data["loop"])] if data.get("loop") else []) + \
        ([("release", data["release"])] if data.get("release") else []) + \
        [(k, v) for k, v in cfg.items() if k != "options" and k != "version"] + \
        [(f"options.{k}", v) for k, v in (cfg.get("options") or {}).items() if v is not None]
    return {
        "title": f"{data['name']}: {data['verdict']}",
        "verdict": VERDICT_WORDS.get(data["verdict"], data["verdict"]),
        "changes": [(c["text"], c["why"], c["recheck"]) for c in d["changes"]],
        "tried": [(c["text"], c["recheck"]) for c in d["tried"]],
        "mechanism": d["mechanism"],
        "design": design,
        "rows": rows(trace.cfg, trace.states, trace.records),
        "reproduce": [f"schedproof replay {folder}", f"python -m pytest {folder}/regression_test.py",
                      f"schedproof report {folder}    # re-render report.md and report.html"],
    }


def markdown(data: dict, trace: ItfTrace, folder: str = "REPORT_DIR") -> str:
    s = _sections(data, trace, folder)
    out = [f"# {s['title']}", ""]
    if data.get("description"):
        out += [data["description"].strip(), ""]
    out += ["## What happened", "", data["cause"], "",
            f"Verdict: {s['verdict']}. First property violated: `{data['property']}` at step {data['step']}: "
            f"{data['message']}", "",
            f"How complete: {data['completeness']}.", "", "## What to change", ""]
    if s["changes"]:
        out += [f"- `{text}`: {why}. Re-checked: {recheck}." for text, why, recheck in s["changes"]]
    else:
        out.append("No change tried removes the failure (see below).")
    if s["tried"]:
        out += ["", "Tried, and they do not remove it:", ""]
        out += [f"- `{text}`: {recheck}." for text, recheck in s["tried"]]
    out += ["", "## Mechanism", ""] + [f"- {m}" for m in s["mechanism"] or ["(no limit explains the stall; see "
                                                                              "the trace)"]]
    out += ["", "## Design", "", "| knob | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in s["design"]]
    out += ["", "## Workload", ""] + _workload_lines(data)
    out += ["", f"## Trace ({data['engine_steps']} engine steps, {len(s['rows'])} rows; long runs folded)", "",
            "| steps | what happened | phase changes | GPU pages in use | tokens / budget |", "|---|---|---|---|---|"]
    out += [f"| {r.steps} | {r.what} | {r.changes} | {r.pages} | {r.tokens} |" for r in s["rows"]]
    out += ["", "## Reproduce", ""] + [f"    {c}" for c in s["reproduce"]]
    out += ["", f"Versions: {_versions(data)}. Written {data['written']}."]
    return "\n".join(out) + "\n"


def _workload_lines(data: dict) -> list[str]:
    if data.get("workload") is not None:
        out = []
        for i, r in enumerate(data["workload"]):
            extra = "".join([f", stops after {r['output_len']}" if r.get("output_len") else "",
                             f", cancelled at step {r['cancel_at']}" if r.get("cancel_at") is not None else "",
                             f", prefix group {r['prefix_group']} ({r['prefix_len']} tokens)"
                             if r.get("prefix_group", -1) >= 0 else "",
                             f", priority {r['priority']}" if r.get("priority") else ""])
            out.append(f"- r{i}: prompt {r['prompt']}, max_new {r['max_new']}, arrives at step {r['arrival']}{extra}")
        return out
    return [f"Actions on the `{data['target']}` target:", ""] + [f"    {a}" for a in data["actions"]]


def _versions(data: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in data["versions"].items())


CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;margin:24px auto;padding:0 16px;color:#1d1d1f}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
.verdict{display:inline-block;background:#b3261e;color:#fff;border-radius:4px;padding:2px 8px;font-size:13px}
.verdict.ok{background:#2e7d32}
.cause{font-size:17px;background:#fff4f2;border-left:5px solid #b3261e;padding:10px 14px;margin:12px 0}
.fix{background:#f1f8f1;border-left:5px solid #2e7d32;padding:6px 12px;margin:6px 0}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;font-size:13px;width:100%} td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f6f6} .muted{color:#666;font-size:13px} figure{margin:8px 0} figure svg{width:100%;height:auto}
details summary{cursor:pointer}
"""


def html(data: dict, trace: ItfTrace, folder: str = "REPORT_DIR") -> str:
    s = _sections(data, trace, folder)
    e = _html.escape
    d = data["diagnosis"]
    svg = timeline_svg(trace.cfg, trace.states, trace.records, stuck=tuple(d["stuck"]),
                       stall_step=d["stall_step"], title=data["name"])
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(s['title'])}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>{e(data['name'])} <span class='verdict {'ok' if data['verdict'] == 'ok' else ''}'>"
             f"{e(data['verdict'])}</span></h1>",
             f"<div class='muted'>{e(s['verdict'])}; {e(data['completeness'])}</div>"]
    if data.get("description"):
        parts.append(f"<p class='muted'>{e(data['description'].strip())}</p>")
    parts += ["<h2>What happened</h2>", f"<div class='cause' id='cause'>{e(data['cause'])}</div>",
              f"<p class='muted'>First property violated: <code>{e(str(data['property']))}</code> at step "
              f"{data['step']}: {e(str(data['message']))}</p>",
              "<h2>What to change</h2>"]
    if s["changes"]:
        parts += [f"<div class='fix'><code>{e(t)}</code>: {e(w)}.<br><span class='muted'>Re-checked: {e(r)}."
                  f"</span></div>" for t, w, r in s["changes"]]
    else:
        parts.append("<p>No change tried removes the failure.</p>")
    if s["tried"]:
        parts.append("<details><summary>Tried, and they do not remove it "
                     f"({len(s['tried'])})</summary><ul>")
        parts += [f"<li><code>{e(t)}</code>: {e(r)}.</li>" for t, r in s["tried"]]
        parts.append("</ul></details>")
    parts += ["<h2>Timeline</h2>", f"<figure id='timeline'>{svg}</figure>",
              "<h2>Mechanism</h2><ul>"] + [f"<li>{e(m)}</li>" for m in s["mechanism"]] + ["</ul>"]
    parts += ["<h2>Design</h2><table><tr><th>knob</th><th>value</th></tr>"]
    parts += [f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in s["design"]]
    parts += ["</table>", "<h2>Workload</h2><pre>", e("\n".join(_workload_lines(data))), "</pre>"]
    parts += [f"<h2>Trace <span class='muted'>({data['engine_steps']} engine steps; long runs folded)</span></h2>",
              "<table><tr><th>steps</th><th>what happened</th><th>phase changes</th><th>GPU pages in use</th>"
              "<th>tokens / budget</th></tr>"]
    parts += [f"<tr><td>{e(r.steps)}</td><td>{e(r.what)}</td><td>{e(r.changes)}</td><td>{e(r.pages)}</td>"
              f"<td>{e(r.tokens)}</td></tr>" for r in s["rows"]]
    parts += ["</table>", "<h2>Reproduce</h2><pre>", e("\n".join(s["reproduce"])), "</pre>",
              f"<p class='muted'>Versions: {e(_versions(data))}. Written {e(data['written'])}.</p>",
              "</body></html>"]
    return "\n".join(parts) + "\n"
