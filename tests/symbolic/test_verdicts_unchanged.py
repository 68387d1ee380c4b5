"""The move of the checkers out of model/ (and every change since) left `check`'s verdicts as they were:
on the benchmark's small design and the quick check files, the status, property, depth and smallest
configuration are those `bench/verdicts.py` printed at 41f7af5, before the move (run there with the same
script; the engine steps and the certification scope are not compared, see its docstring). The V1 reuse check
file left this list when issue 16 changed what the model claims about #13318 on purpose (its verdict is pinned
in tests/symbolic/test_core_trtllm_v1.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("verdicts", ROOT / "bench" / "verdicts.py")
verdicts = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = verdicts
_spec.loader.exec_module(verdicts)

AT_41F7AF5 = {
    "bench/trtllm-v2-field-ranges-small.toml": ("violated", "LIVE-NO-PROGRESS", 5, []),
    "scenarios/check/hf-cb-fatal-ranges.toml": ("violated", "ENGINE-ERROR", 3, []),
    "scenarios/check/vllm-chunked-off-wedge-ranges.toml":
        ("violated", "LIVE-NO-PROGRESS", 4, ["num_blocks = 3", "max_batch_size = 2", "requests = 2"]),
}


@pytest.mark.parametrize("path", sorted(AT_41F7AF5))
def test_the_verdict_is_the_one_before_the_move(path):
    out = verdicts.outcome(path, timeout=900)
    assert (out["status"], out.get("property"), out["depth"], out.get("minimised")) == AT_41F7AF5[path]
    assert out["replayed"]
