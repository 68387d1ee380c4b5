"""The rare-failure spaces of bench/rare_failures.py: `check`'s search finds each one's failure, of the property
the file names, and the trace replays in the simulator. (The benchmark measures that random search does not; this
keeps the spaces honest: a space whose failure the search no longer finds is not a benchmark of anything.)"""

from pathlib import Path

import pytest

import model.symbolic.cores  # noqa: F401  (registers every core)
from checkers.bmc import search
from checkers.replay import replay
from model.symbolic.core import CORES
from schedproof.checkspec import load_check

SPACES = sorted((Path(__file__).resolve().parents[2] / "bench" / "rare").glob("*.toml"))


def test_there_is_a_space_per_engine():
    policies = {load_check(str(p)).space.template.policy for p in SPACES}
    assert policies == {"hf_cb", "vllm_v1", "trtllm_v1", "trtllm_v2", "sglang"}


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_check_finds_the_rare_failure_and_it_replays(path):
    spec = load_check(str(path))
    res = search(CORES[spec.space.template.policy], spec.space, spec.max_depth, 300, list(spec.properties))
    assert res.status == "violated", (res.status, res.reason)
    assert res.cex.property in spec.properties
    rep = replay(res.cex)
    assert rep.ok, rep
