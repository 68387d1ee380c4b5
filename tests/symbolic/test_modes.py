"""Each claim in its engine's default loop (proofs/modes.py): the twin changes exactly the loop's knob, is decided only
where the core expresses that loop, and `prove` lists every claim's default-loop entry, a refusal in one line naming
the knob."""

import contextlib
import dataclasses
import io
import json

import pytest

import proofs.claims as C
import proofs.run as R
from model.policy import POLICIES
from model.symbolic.core import CORES
from proofs import modes
from schedproof.cli import main
from helpers import in_a_fresh_process


def _without_loop(cfg):
    knob = POLICIES[cfg.policy].loop_knob
    return cfg if knob is None else dataclasses.replace(cfg, options=dataclasses.replace(cfg.options, **{knob: None}))


@pytest.mark.parametrize("claim", C.CLAIMS, ids=lambda c: c.name)
def test_every_claim_has_a_default_loop_entry(claim):
    entry = modes.entry(claim)
    knob = POLICIES[claim.policy].loop_knob
    if knob is None:
        assert entry["status"] == "same" and modes.in_default_loop(claim) is None
        return
    twin = modes.in_default_loop(claim)
    if entry["status"] == "not decided":
        # the core's own refusal of that design, naming the loop's knob, one line
        assert twin is None
        assert entry["reason"].startswith(f"engine.options.{knob}: ") and "\n" not in entry["reason"]
        assert CORES[claim.policy].unsupported(dataclasses.replace(claim.design, options=dataclasses.replace(
            claim.design.options, **{knob: modes.default_value(claim.design.options, knob)}))) is not None
        return
    assert entry["status"] == "decided" and twin is not None and twin.name == entry["twin"]
    # exactly the loop's knob changed, to the engine's default; the class, property and method kept
    assert getattr(twin.design.options, knob) == modes.default_value(claim.design.options, knob)
    assert getattr(twin.design.options, knob) != getattr(claim.design.options, knob)
    assert _without_loop(twin.design) == _without_loop(claim.design)
    if claim.space is not None:
        assert _without_loop(twin.space.template) == _without_loop(claim.space.template)
        assert dataclasses.replace(twin.space, template=claim.space.template) == claim.space
    assert (twin.property, twin.method, twin.slots, twin.knob_bounds, twin.workload, twin.invariants) == \
        (claim.property, claim.method, claim.slots, claim.knob_bounds, claim.workload, claim.invariants)
    # no argument for any number of requests is carried into a loop it was not made for
    assert twin.parametric is None and not twin.any_n
    assert modes.original(twin.name) == twin and modes.original(claim.name) is claim
    assert CORES[claim.policy].unsupported(twin.design) is None


def test_the_claims_written_for_a_synchronous_loop_say_so():
    """Where an engine has two loops the claims name the synchronous one, so each has a default-loop entry that is
    a twin or a refusal, never 'same' (which would mean a claim silently decided in an unexpected loop)."""
    for claim in C.CLAIMS:
        if POLICIES[claim.policy].loop_knob is not None:
            assert not modes.runs_default_loop(claim), claim.name


def _prove(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["prove", *argv])
    return code, out.getvalue()


def test_prove_lists_each_claim_in_the_default_loop():
    """SGLang's core expresses event_loop_overlap (model/symbolic/cores/sglang.py): `prove sglang --loop default`
    decides each claim's twin there and lists it under its claim: the two expected to hold survive, proved for up to
    3 requests (a twin carries no argument for any number of requests), the two refuted fail there too, their
    traces replayed (text and --json). About 10 s each."""
    claims = C.claims_for("sglang")
    code, out = _prove("sglang", "--loop", "default", "--budget", "60", "--workers", "1")
    assert code == 0, out
    listing = out[out.index("in the engine's default loop:"):].splitlines()
    assert len(listing) == 1 + len(claims)
    for claim, line in zip(claims, listing[1:]):
        assert line.startswith(f"  {claim.name}: {claim.name}{modes.SUFFIX}: "), line
        assert ("survives, proved for up to 3 requests" if claim.expected == C.HOLDS else
                "fails there too: refuted as expected: LIVE-NO-PROGRESS at depth 2, trace replayed") in line, line
    code, out = _prove("sglang", "--loop", "default", "--budget", "60", "--workers", "1", "--json")
    rows = json.loads(out)
    assert [r["twin_of"] for r in rows] == [c.name for c in claims] and all(r["as_expected"] for r in rows)
    assert all(r["loop"].startswith("Scheduler.event_loop_overlap") for r in rows)


def test_a_core_that_refuses_the_default_loop_gets_its_claims_listed_not_decided(monkeypatch):
    """The listing's refusal path, whichever cores express their default loop today: with the sglang core refusing
    event_loop_overlap (its refusal as the core would word it), no twin is built or decided, and `prove` lists the
    claims on one line, not decided, with the refusal naming the knob; the claims themselves are decided."""
    core = CORES["sglang"]
    own = core.unsupported
    reason = ("engine.options.disable_overlap_schedule", "the overlap loop, refused for this test")

    def refusing(cfg, params=None):
        return reason if not cfg.options.disable_overlap_schedule else own(cfg, params)

    monkeypatch.setattr(core, "unsupported", refusing)
    claims = C.claims_for("sglang")
    assert all(modes.in_default_loop(c) is None for c in claims)
    code, out = _prove("sglang", "--budget", "60", "--workers", "1")
    assert code == 0, out
    listing = out[out.index("in the engine's default loop:"):].splitlines()
    assert listing[1:] == [f"  {', '.join(c.name for c in claims)}: not decided: "
                           f"engine.options.disable_overlap_schedule: the overlap loop, refused for this test"], listing
    assert f"{len(claims)}/{len(claims)} claims as expected" in out


def test_what_is_recorded_of_the_default_loop_names_twins_that_exist():
    """proofs/modes.py MEASURED: each entry a claim with a twin, a recorded depth deeper than its claim's (the default
    loop's search takes engine steps one by one), and an outcome that is one of a claim's."""
    names = {c.name: c for c in C.CLAIMS}
    for name, measured in modes.MEASURED.items():
        claim = names[name]
        twin = modes.in_default_loop(claim)
        assert twin is not None, f"{name}: recorded, but its core does not express the default loop"
        assert measured.expected in (C.HOLDS, C.FAILS, C.OPEN) and measured.why and "\n" not in measured.why
        assert twin.expected == measured.expected
        if measured.max_depth is not None:
            assert claim.method == "bmc" and twin.max_depth == measured.max_depth > claim.max_depth


def test_prove_decides_the_twins_and_says_which_claims_survive(monkeypatch):
    """TensorRT-LLM's cores express the overlap executor: `prove` decides each claim in `_executor_loop` and its
    twin in the default loop, and the listing says the one survives (with its scope) and the other fails there
    too, its trace replayed."""
    names = ("v1-budget-without-reuse-max-util", "v2-fix-a-alone")
    picked = [c for c in C.CLAIMS if c.name in names]
    monkeypatch.setattr(C, "claims_for", lambda policy: picked)
    code, out = _prove("--budget", "200", "--workers", "1")
    assert code == 0, out
    listing = out[out.index("in the engine's default loop:"):]
    assert ("v1-budget-without-reuse-max-util: v1-budget-without-reuse-max-util@default-loop: survives, proved for "
            "up to 3 requests\n") in listing
    assert ("v2-fix-a-alone: v2-fix-a-alone@default-loop: fails there too: refuted as expected: LIVE-NO-PROGRESS at "
            "depth 7, trace replayed\n") in listing
    assert "loop: PyExecutor._executor_loop_overlap" in out and "2/2 claims" not in out and "4/4 claims" in out
    code, out = _prove("--budget", "200", "--workers", "1", "--json", "--loop", "default")
    rows = {r["twin_of"]: r for r in json.loads(out)}
    assert sorted(rows) == sorted(names) and all(r["claim"] == n + modes.SUFFIX for n, r in rows.items())
    assert all(r["as_expected"] for r in rows.values())
    assert rows[names[0]]["scope"] == {"requests": 3} and rows[names[1]]["detail"]["replayed"]


def test_the_c3_twin_survives_with_in_flight_requests_never_suspended():
    """v2-ab-outgrowing-first in the overlap loop, once recorded open (fix A's invariant, paused-replay-fits, alone is
    not inductive there: a paused request's in-flight token lands after A's check): with `in-flight-not-suspended`
    (proofs/claims.py `paused_replay_fits_overlap`, the C3 set in that loop only) the twin comes out as its claim's
    expectation, proved for up to 3 requests, so MEASURED no longer records it."""
    assert "v2-ab-outgrowing-first" not in modes.MEASURED
    twin = modes.in_default_loop(next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing-first"))
    assert twin.expected == C.HOLDS
    # in a fresh process (tests/helpers.py): 9.3 s alone, 19.6 s in the suite's worker (docs/benchmarks.md)
    status, as_expected, line, labels, lines, code = in_a_fresh_process(_decide_the_c3_twin)
    assert status == "proved" and as_expected, line
    assert labels == ["n=2", "n=3"]
    assert any("in-flight-not-suspended" in o for o in lines)
    assert code == 0


def _decide_the_c3_twin():
    twin = modes.in_default_loop(next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing-first"))
    [v] = R.decide_claims([twin], 120)
    return (v.status, v.as_expected, v.line, sorted({label for label, _ in v.obligations}),
            [o.line() for _, o in v.obligations], R.exit_code([v]))


def test_without_that_invariant_the_twin_is_open_and_said_so():
    """The control for the invariant above, and for OPEN: with C3's synchronous set (reservation, paused-replay-fits)
    the twin's induction fails at n=3 on paused-replay-fits (a victim's in-flight token lands after fix A's check);
    recorded open, the line says "not proved", never "refuted", and it does not fail the run."""
    twin = modes.in_default_loop(next(c for c in C.CLAIMS if c.name == "v2-ab-outgrowing-first"))
    synchronous_set = lambda ops, k, p, s: {**C.reservation(ops, k, p, s), **C.paused_replay_fits(ops, k, p, s)}  # noqa: E731
    open_twin = dataclasses.replace(twin, invariants=synchronous_set, expected=C.OPEN)
    [v] = R.decide_claims([open_twin], 120)
    assert v.status == "failed" and v.as_expected, v.line
    assert v.line.startswith("not proved, as recorded: counterexample to induction at n=3") and \
        "paused-replay-fits" in v.line
    assert R.exit_code([v]) == 0


def test_a_twin_searched_only_as_deep_as_its_claim_misses_the_wedge():
    """The control for MEASURED's depths: v2-ab-mixed's twin at its claim's depth (12) finds no wedge, one engine
    step a transition, and that is not as expected (exit 1); at the recorded depth it is found and replayed."""
    twin = modes.in_default_loop(next(c for c in C.CLAIMS if c.name == "v2-ab-mixed"))
    shallow = dataclasses.replace(twin, max_depth=12)
    [v] = R.decide_claims([shallow], 120)
    assert v.status == "not-refuted" and not v.as_expected and R.exit_code([v]) == 1
    [v] = R.decide_claims([twin], 120)
    assert v.status == "refuted" and v.as_expected and v.detail["replayed"] and v.detail["depth"] == 14


def test_a_file_in_the_default_loop_is_reached_by_a_twin_not_by_its_claim(tmp_path):
    """Design review (proofs/reach.py): the loop's knob is part of a claim's structure, so a file in TensorRT-LLM's
    default loop lies outside every claim's class; the twin's class holds it (the runs of up to 3 requests: the
    twin's scope), and `check`/`prove FILE` prove that part by the twin's own induction."""
    from pathlib import Path

    from checkers.space import encode
    from proofs import reach
    from schedproof.checkspec import load_check
    text = (Path(__file__).resolve().parents[2] / "scenarios/check/claims/v2-ab-within-budget.toml").read_text()
    path = tmp_path / "overlap.toml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("disable_overlap_scheduler")))
    space = load_check(str(path)).space
    found = {c.name: c for c in reach.candidates(space, ["LIVE-NO-PROGRESS"])}
    claim, twin = found["v2-ab-within-budget"], found["v2-ab-within-budget" + modes.SUFFIX]
    assert reach.structure(claim, space).startswith("engine.options.disable_overlap_scheduler is False")
    assert reach.structure(twin, space) == ""
    assert reach.reach(twin, encode(space), max(twin.slots), 60).kind == reach.PART
    other = found["v2-ab-outgrowing-first" + modes.SUFFIX]            # a twin of another class: outside it
    assert reach.structure(other, space).startswith("engine.options.max_util_for_resume")
