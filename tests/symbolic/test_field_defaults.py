"""The field failure found from the field ranges with the default [check] (early stops and cancellations left
to the solver): scenarios/check/trtllm-v2-field-ranges-defaults.toml. The time it takes is measured in
docs/benchmarks.md, not here; this keeps the measured claim reproducible: the search finds a LIVE-NO-PROGRESS
trace in that space, and the simulator replays it."""

import model.symbolic.cores  # noqa: F401  (registers every core)
from checkers.bmc import search
from checkers.replay import replay
from model.symbolic.core import CORES
from schedproof.checkspec import load_check

DEFAULTS = "scenarios/check/trtllm-v2-field-ranges-defaults.toml"


def test_the_field_failure_is_found_with_early_stops_and_cancellations_allowed():
    spec = load_check(DEFAULTS)
    assert spec.space.early_stops and spec.space.cancellations
    found = search(CORES["trtllm_v2"], spec.space, spec.max_depth, 600, list(spec.properties), shortest=False)
    assert found.status == "violated" and found.cex.property == "LIVE-NO-PROGRESS", (found.status, found.reason)
    assert replay(found.cex).ok
