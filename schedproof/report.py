"""Turn a run into what a scheduler engineer reads: a per-request table, the violations, a verdict."""

from __future__ import annotations

from pathlib import Path

from model import releases
from model.policy import POLICIES

from .diagnosis import diagnose
from .finding import from_run
from .runner import RunResult

VERDICT_LINE = {
    "ok": "ok: no property violated (every request answered)",
    "deadlock": "deadlock: unfinished work and a scheduler step that changes nothing",
    "livelock": "livelock: a cycle of states in which nothing completes",
    "crash": "crash: the engine raised",
    "violation": "violation: a safety or fairness property failed",
    "unknown": "unknown: the step limit was reached before the run ended; nothing is claimed",
}


def answered_at(result: RunResult) -> dict[int, int]:
    steps = {}
    for rec in result.trace.records:
        for rid in rec.finished + rec.failed + rec.rejected:
            steps.setdefault(rid, rec.step)
    return steps


def request_rows(result: RunResult) -> list[dict]:
    at = answered_at(result)
    rows = []
    for r in result.trace.final.requests:
        rows.append({
            "rid": r.rid, "prompt": r.prompt, "max_new": r.max_new, "arrival": r.arrival,
            "outcome": r.phase.name.lower(), "generated": r.generated, "preemptions": r.preemptions,
            "step": at.get(r.rid), "reason": r.reason,
        })
    return rows


def as_dict(result: RunResult) -> dict:
    s = result.scenario
    return {
        "scenario": s.name,
        "file": s.path,
        "policy": s.cfg.policy,
        # the engine's loop where the policy has a choice of it (vLLM: true = AsyncScheduler), else null
        "async_scheduling": getattr(s.cfg.options, "async_scheduling", None),
        "loop": POLICIES[s.cfg.policy].loop(s.cfg.options),
        "release": releases.named(s.cfg),   # the engine release the model runs ([engine] version, model/releases.py)
        "verdict": result.verdict,
        "complete": result.evaluation.complete,
        "completed": result.completed,
        "failed": result.failed,
        "total": result.total,
        "steps": result.steps,
        "end": result.trace.end,
        "gpu_blocks": s.cfg.num_blocks,
        "violations": [v.as_dict() for v in result.evaluation.violations],
        "witnessed": result.evaluation.witnessed,
        "requests": request_rows(result),
        "seconds": round(result.seconds, 3),
    }


def as_text(result: RunResult) -> str:
    s = result.scenario
    lines = [f"scenario {s.name} ({s.path})"]
    if s.description:
        lines += ["  " + line for line in s.description.strip().splitlines()]
    lines += [
             f"policy {s.cfg.policy}: {s.cfg.num_blocks} GPU blocks x {s.cfg.block_size} tokens, "
             f"{s.cfg.host_blocks} host blocks, budget {s.cfg.max_num_tokens} tokens / {s.cfg.max_batch_size} "
             f"requests per step, chunked prefill {'on' if s.cfg.chunked_prefill else 'off'}",
             f"loop: {POLICIES[s.cfg.policy].loop(s.cfg.options)}",
             f"release: {releases.named(s.cfg)}",
             ""]
    header = f"{'req':>4} {'prompt':>6} {'max_new':>7} {'arrive':>6} {'outcome':<10} {'gen':>5} {'preempt':>7} {'at step':>7}  reason"
    lines.append(header)
    for row in request_rows(result):
        lines.append(f"{row['rid']:>4} {row['prompt']:>6} {row['max_new']:>7} {row['arrival']:>6} "
                     f"{row['outcome']:<10} {row['generated']:>5} {row['preemptions']:>7} "
                     f"{'' if row['step'] is None else row['step']:>7}  {_short(row['reason'])}")
    lines.append("")
    lines.append(f"{result.completed}/{result.total} completed, {result.failed} failed, "
                 f"{result.steps} steps (run ended: {result.trace.end})")
    for v in result.evaluation.violations:
        lines.append(f"  [{v.property}] step {v.step}: {v.message}")
    seen = ", ".join(f"{k} at step {v}" for k, v in result.evaluation.witnessed.items()) or "none"
    lines.append(f"witnessed: {seen}")
    lines.append(f"verdict: {VERDICT_LINE[result.verdict]}")
    if result.verdict not in ("ok", "unknown"):
        lines.append(f"cause: {cause(result)}")
    return "\n".join(lines)


def cause(result: RunResult) -> str:
    """The one-sentence cause, derived from the trace (schedproof/diagnosis.py), without re-checks."""
    f = from_run(result)
    return diagnose(f.cfg, f.states, f.records, f.lead_first()).cause


def corpus_summary(results: list[RunResult], unexpected: int, written: list) -> str:
    """The closing table: every scenario that violates a property, its cause and its report folder."""
    lines = ["", f"{len(results) - unexpected}/{len(results)} scenarios as expected"]
    failing = [r for r in results if r.verdict not in ("ok", "unknown")]
    if not failing:
        return "\n".join(lines)
    folders = {Path(w).name: w for w in written}
    lines += ["", f"{len(failing)} scenarios violate a property (as their [expect] says, where it does):", ""]
    for r in failing:
        lines.append(f"  {r.scenario.name:<44} {r.verdict:<9} {_short(cause(r), 110)}")
        if r.scenario.name in folders:
            lines.append(f"  {'':<44} report: {folders[r.scenario.name]}/report.html")
    if written:
        lines += ["", f"report folders ({len(written)}): {Path(written[0]).parent}/<scenario>/ "
                      "(report.html, report.md, report.json, trace.itf.json, regression_test.py)"]
    return "\n".join(lines)


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def corpus_line(result: RunResult, problems: list[str]) -> str:
    mark = "as expected" if not problems else "UNEXPECTED: " + "; ".join(problems)
    source = result.scenario.expect.source or "source unstated"
    return (f"{result.scenario.name:<44} {result.scenario.cfg.policy:<10} {result.verdict:<9} "
            f"{result.completed:>3}/{result.total:<3} {source:<13} {mark}")

