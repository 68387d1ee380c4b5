"""Every bundled scenario's design can be given to `schedproof check`, and on the small ones the
symbolic verdict agrees with the simulator's.

- All scenarios: `check` accepts the file as it is (a point design, no refusal).
- The small ones (a few requests, a run of a few dozen BMC transitions): the design as a point with
  the environment fixed as the simulator has it (no early stops or cancellations beyond the
  file's), searched to one transition past the simulator's whole run (`checkers.replay.transitions`; the ci
  profile searches vllm-prefix-caching to depth 6 of its 11 and two TensorRT-LLM V1 reuse designs to 5 of 9, see
  SIZES). Where the simulator's run violates a
  property, `check` finds a violation no later (its last step, or the stuck step after a run that ends in a
  fixpoint), of the same kind, and it replays; where the run ends with every request answered, `check` proves
  that no run of the design violates anything to that depth, which, the design being a point, is every step of
  the run (at the nightly size). The large scenarios (12-24 requests,
  thousands of steps) are beyond a point unrolling; their failure classes are found from ranges
  by the files of scenarios/check/ (tests/symbolic/test_core_<policy>.py, test_bmc.py).
"""

from pathlib import Path

import pytest

import model.symbolic.cores  # noqa: F401  (registers every core)
from cases import SCENARIOS_OUTSIDE_THE_CORE
from checkers.replay import transitions
from helpers import in_a_fresh_process, point_search, sized
from model.simulator import simulate
from model.symbolic.core import CORES
from schedproof.check import _unsupported_groups
from schedproof.checkspec import load_check
from schedproof.scenario import load

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
# Point designs the search cannot decide within the profile's budget, kept visible as expected failures:
# hf-cb-shared-prefix (3 slots with a prefix group, 10 transitions) ends unknown with the ci budget of 5 s (and of
# 15 s and 60 s, 114 s of wall time in the clean clone of 2026-12-06: the ci size only keeps it visible); with
# the nightly's 300 s on the clock it is decided (it passed as an unexpected success in the clean-clone run of
# 2026-12-05), so the nightly asserts it.
UNDIAGNOSED = sized(ci={"hf-cb-shared-prefix": "unknown with the ci budget of 5 s: 3 slots with a prefix group; "
                                               "the nightly size (300 s) decides it"},
                    nightly={})
# The search's budget (seconds of checkers/clock.py's solving) and the depth it must clear, where the default
# (300 s, the whole run) is not what the profile runs. A search spends up to half its budget proving lemmas and
# a third of the rest on acceleration before it unrolls, so a large budget costs minutes on a point design whose
# violation lies at depth 2 or 3. Nightly: vllm-prefix-caching (2 slots of one prefix group, 11 transitions) gets
# 1800 s for its whole run (bounded in 238-565 s of wall time alone before the clock). The ci sizes, measured on
# the clock in a fresh process, as each search runs here (tests/helpers.py in_a_fresh_process), so they hold on a
# loaded machine; each is the smallest measured budget with the nightly's verdict, or the next with room
# (bench/point_budgets.py, docs/benchmarks.md "The point searches' ci budgets", 2026-12-07):
# hf-cb-fatal-request-too-large and vllm-chunked-off-head-of-line find their violation (depth 3, 2) with 10 s (5 s
# suffices; 30 s, the size before, took twice to three times as long), trtllm-v1-reuse-budget-overshoot its (depth 4)
# with 20 s (12 s suffices; the default 300 s took 2.3 times as long); vllm-prefix-caching clears depth 8 of 11 with
# 40 s (30 s suffices, 20 s ends unknown at depth 7; 60 s took 1.3 times as long: the lemmas take most of it); the
# expected failure needs no more than 5 s to end unknown (at depth 5 in 9.4 s, against depth 7 in 25.6 s with 15 s,
# the size before). The two TensorRT-LLM V1 reuse designs that end ok (8 transitions each): the ci size stops at
# depth 6, the nightly searches the whole run (depth 9); the first took 106 s at depth 9 in the clean clone of
# 162ab39 and 45 s at depth 6 in that of 2845589 with 300 s, and clears depth 6 with 30 s in half the time of 300 s
# (20 s suffices); the second keeps 300 s (no gain shown with 30 s). Later that day (docs/benchmarks.md, the same
# section) the three designs that end ok were searched one depth or two less in ci: vllm-prefix-caching to depth 6
# with 30 s (29 s of CPU against 49 s at depth 8 with 40 s), the two V1 reuse designs to depth 5 with 20 s and 30 s
# (18 s and 21 s against 24 s and 28 s); the nightly still searches each whole run.
SIZES = sized(ci={"hf-cb-fatal-request-too-large": (10, None), "vllm-chunked-off-head-of-line": (10, None),
                  "trtllm-v1-reuse-budget-overshoot": (20, None),
                  "hf-cb-shared-prefix": (5, None), "vllm-prefix-caching": (30, 6),
                  "trtllm-v1-reuse-budget-trimmed": (20, 5), "trtllm-v1-reuse-trim-floor-budget-ok": (30, 5)},
              nightly={"vllm-prefix-caching": (1800, None)})
DEFAULT_SIZE = (300, None)
SMALL_REQUESTS = 5
SMALL_TRANSITIONS = 12
PREFIX_STEPS = 100
# what a failing run's verdict is, as the properties the search reports
FAILURES = {"deadlock": {"LIVE-NO-PROGRESS", "ENGINE-ERROR", "LIVE-LIVELOCK"},
            "crash": {"ENGINE-ERROR"}, "livelock": {"LIVE-LIVELOCK"}}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_check_accepts_every_scenario(path):
    """Accepted as it is: no scenario's design is refused, but those outside their core's subset, which `check`
    refuses naming the field (cases.SCENARIOS_OUTSIDE_THE_CORE)."""
    spec = load_check(str(path))
    core = CORES[spec.space.template.policy]
    refused = _unsupported_groups(core, spec)
    if path.stem in SCENARIOS_OUTSIDE_THE_CORE:
        assert refused is not None and SCENARIOS_OUTSIDE_THE_CORE[path.stem] in str(refused)
        return
    assert refused is None


def _small():
    out = []
    for path in SCENARIOS:
        sc = load(path)
        if len(sc.workload.requests) > SMALL_REQUESTS or path.stem in SCENARIOS_OUTSIDE_THE_CORE:
            continue
        last = len(simulate(sc.cfg, sc.workload, max_steps=20_000).records) - 1
        # a prefix of the run splits into no more transitions than the whole run, so a long run (three TensorRT-LLM
        # V2 scenarios have over a thousand steps) is ruled out on its first steps without running the core to its
        # end; this runs at collection and in each fresh process below, which imports this module
        prefix = transitions(sc.cfg, sc.workload, min(last, PREFIX_STEPS))
        if len(prefix) > SMALL_TRANSITIONS:
            continue
        n = len(prefix) if last <= PREFIX_STEPS else len(transitions(sc.cfg, sc.workload, last))
        if n <= SMALL_TRANSITIONS:
            marks = [pytest.mark.xfail(reason=UNDIAGNOSED[path.stem], strict=False)] if path.stem in UNDIAGNOSED else []
            out.append(pytest.param(path, n, id=path.stem, marks=marks))
    return out


@pytest.mark.parametrize("path,n", _small())
def test_the_symbolic_verdict_agrees_with_the_simulator(path, n):
    sc = load(path)
    budget, depth = SIZES.get(path.stem, DEFAULT_SIZE)
    depth = n + 1 if depth is None else min(depth, n + 1)
    # in a fresh process: the ci budgets are cut to what suffices there (helpers.in_a_fresh_process says why)
    status, reason, reached, prop, replays = in_a_fresh_process(point_search, str(path), depth, budget)
    verdict = sc.expect.verdict
    if verdict in FAILURES:
        assert status == "violated", (status, reason)
        # no later than the run: its last step, or for a run that ends in a fixpoint the stuck step after it
        assert prop in FAILURES[verdict] and reached <= n + 1
        assert replays
    else:
        assert verdict == "ok"
        # the whole run (the nightly size), or its first `depth` transitions (the ci size)
        assert status == "bounded" and reached == depth, (status, reason)
