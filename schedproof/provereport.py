"""`schedproof prove`'s output: each `ProofEvent` as it happens (one line per obligation, the trace
of a refutation, one verdict line per claim), the closing count, and the JSON form. Text only; the
command line prints it."""

from __future__ import annotations


from checkers.induction import Obligation
from model import releases
from model.policy import POLICIES
from model.state import Phase
from model.symbolic.slots import SlotState
from proofs import modes
from proofs.run import ProofEvent, Verdict

PHASE_VALUES = {int(p) for p in Phase}


def compact(s: SlotState) -> str:
    """A slot state in words: the pool, the step, the stall counter, then each request by name with
    its phase named and its numbers labelled (the same words as `check`'s trace)."""
    reqs = " | ".join(_request(i, r) for i, r in enumerate(s.req))
    return f"free={s.g['free_blocks']} step={s.g['step']} stalls={s.g.get('stalls', '-')} | {reqs}"


def _request(i: int, r: dict) -> str:
    phase = r["phase"]
    name = Phase(phase).name.lower() if phase in PHASE_VALUES else str(phase)
    text = f"r{i} {name} kv={r['computed']} gen={r['generated']} blocks={r['blocks']}"
    return text + (" suspended" if r.get("suspended") else "")


def cti_lines(o: Obligation) -> list[str]:
    if o.cti is None:
        return []
    pre, post = o.cti
    return [f"      pre : {compact(pre)}", f"      post: {compact(post)}"]


def loop(c) -> str:
    """The engine loop a claim is decided in: its design's (a twin's: the engine's default, proofs/modes.py)."""
    return POLICIES[c.policy].loop(c.design.options)


def default_loop_lines(claims: list, verdicts: list) -> list[str]:
    """Each claim in its engine's default loop: where it runs it already, its twin's verdict where the core
    expresses that loop (decided in this run, or not asked for), or the core's refusal (one line for the claims
    it refuses alike)."""
    by_name = {v.claim.name: v for v in verdicts}
    lines = ["in the engine's default loop:"]
    refused: dict[str, list[str]] = {}
    for c in claims:
        e = modes.entry(c)
        if e["status"] == "not decided":
            refused.setdefault(e["reason"], []).append(c.name)
            continue
        if e["status"] == "same":
            text = "decided above (its design runs the default loop)"
        else:
            twin = by_name.get(e["twin"])
            text = f"{e['twin']}: " + ("not decided in this run" if twin is None else
                                       _survives(c, twin))
            if e.get("differs"):
                text += f" [differs from the claim's loop: {e['differs']}]"
        lines.append(f"  {c.name}: {text}")
    for reason, names in refused.items():
        lines.append(f"  {', '.join(names)}: not decided: {reason}")
    return lines


def _survives(claim, twin: Verdict) -> str:
    """Whether a claim survives its engine's default loop, and with what scope, from its twin's verdict (the class,
    the same as the claim's, left out)."""
    line = twin.line.split(" (class: ")[0]
    if not twin.as_expected:
        return f"NOT AS EXPECTED: {line}"
    if twin.claim.expected == "open":
        return f"open: {line}"
    if claim.expected == "holds":
        if claim.any_n and twin.scope != "any":
            line += " (the claim's argument for any number of requests is about its own loop)"
        return f"survives, {line}"
    return f"fails there too: {line}"


def event_lines(e: ProofEvent) -> list[str]:
    c = e.claim
    if e.kind == "claim":
        return [f"{c.name} [{c.policy}] expected {c.expected}: {c.statement}", f"  loop: {loop(c)}"]
    if e.kind == "skipped":
        return [f"  unknown  {e.label}: time-out before it started"]
    if e.kind == "obligation":
        o = e.obligation
        return [f"  {e.label:22s} {o.line()}" + (f"  [{o.reason}]" if o.reason else "")] + cti_lines(o)
    if e.kind == "trace":
        v = e.verdict
        d, cex = v.detail, v.cex
        return ([f"  bmc: {c.property} at depth {d['depth']} ({d['steps']} engine steps) in {v.seconds:.1f} s; "
                 f"{d['replay']}", f"  configuration: {d['config']}", f"  workload: {d['workload']}"] +
                [f"    s{t}: {compact(s)}" for t, s in enumerate(cex.states)])
    if e.kind == "verdict":
        v = e.verdict
        carried = v.detail.get("releases")   # proofs/release_carry.py: the other releases the verdict holds at
        return [f"{c.name}: {v.line}  ({v.seconds:.1f} s)"] + ([f"  {carried['line']}"] if carried else []) + [""]
    raise ValueError(f"unknown proof event {e.kind!r}")


def summary(verdicts: list[Verdict]) -> str:
    ok = sum(v.as_expected for v in verdicts)
    text = f"{ok}/{len(verdicts)} claims as expected"
    lost = [v.claim.name for v in verdicts if v.lost_scope]
    if lost:
        text += f"; lost 'for any number of requests': {', '.join(lost)}"
    return text


def as_dict(v: Verdict) -> dict:
    c = v.claim
    return {"claim": c.name, "policy": c.policy, "loop": loop(c), "release": releases.named(c.design),
            # the claim in the engine's default loop (proofs/modes.py): the same loop, its twin, or a refusal
            **({"default_loop": modes.entry(c)} if not c.name.endswith(modes.SUFFIX) else
               {"twin_of": c.name[:-len(modes.SUFFIX)]}),
            "expected": c.expected, "status": v.status,
            "as_expected": v.as_expected, "verdict": v.line, "method": c.method,
            "obligations": [{"action": o.action, "invariant": o.invariant, "status": o.status,
                             "seconds": round(o.seconds, 3), "case": label} for label, o in v.obligations],
            "seconds": round(v.seconds, 3), "class": c.class_text,
            # the request counts a proof covers: "any" (checkers/parametric) or the largest slot count
            "scope": None if v.scope is None else {"requests": v.scope},
            # what the claim is expected to reach, and (an argument that did not go through) why not "any"
            "expected_scope": {"requests": "any" if c.any_n else max(c.slots)} if c.expected == "holds" and
            c.method == "induction" else None,
            "lost_scope": v.lost_scope, "any_n_open": v.any_n_open or None,
            **({"detail": v.detail} if v.detail else {})}


