"""Model traces in the Informal Trace Format (schedproof/itf.py): written and read back identically for every
policy, read by an independent reader (itf-py), and bad input refused as one line naming the field."""

import dataclasses
import functools
import json
from pathlib import Path

import itf_py
import pytest

from model.policy import POLICIES
from model.simulator import simulate
from model.state import Phase, Request, State, StepRecord
from schedproof import scenario
from schedproof.itf import ItfError, VARS, itf_to_trace, read_itf, trace_to_itf, write_itf

ROOT = Path(__file__).resolve().parents[1]
MAX_STATES = 150   # long traces are cut here: encoding is per state, so more states add time, not coverage

# Every policy, and what each scenario adds: an engine error, a lasso (fixpoint), vLLM's block pool
# (Sched tuples holding None and nested tuples), HF offload and the prefix cache, a host tier.
SCENARIOS = [
    "trtllm-v2-replay-within-budget.toml",
    "trtllm-v2-small-host-tier.toml",
    "trtllm-v1-draft-budget.toml",             # no Sched: sched is None
    "trtllm-v1-reuse-budget-overshoot.toml",   # ends in an engine error
    "vllm-prefix-caching.toml",
    "vllm-chunked-off-recompute-wedge.toml",   # a fixpoint: written with its loop
    "sglang-ignore-eos-below-clip.toml",       # new_token_ratio kept as its float bits
    "sglang-page-rounding-nine-pages.toml",    # the radix tree: a record inside the Sched
    "hf-cb-shared-prefix-offload-frees-nothing.toml",
    "hf-cb-fatal-request-too-large.toml",
    "hf-cb-cancel-after-soft-reset.toml",
]


@functools.cache
def run(name: str):
    """(scenario, states, records, loop) of a bundled scenario, cut to MAX_STATES."""
    s = scenario.load(ROOT / "scenarios" / name)
    t = simulate(s.cfg, s.workload)
    states, records = t.states[:MAX_STATES], t.records[:MAX_STATES - 1]
    loop = t.cycle_start if len(states) == len(t.states) else None
    return s, states, records, loop


def through_json(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def assert_identical(back, s, states, records, loop=None):
    assert back.cfg == s.cfg
    assert back.workload == s.workload
    assert back.states == states
    assert back.records == records
    assert back.loop == loop


# -- round trips ----------------------------------------------------------------------------------

def test_the_scenarios_cover_every_policy():
    assert {run(name)[0].cfg.policy for name in SCENARIOS} == set(POLICIES)


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_simulated_trace_reads_back_identical(name):
    s, states, records, loop = run(name)
    doc = trace_to_itf(s.cfg, states, records, workload=s.workload, loop=loop)
    assert_identical(itf_to_trace(through_json(doc)), s, states, records, loop)


def test_the_scenarios_exercise_what_the_encoding_must_handle():
    every = [st for name in SCENARIOS for st in run(name)[1]]
    assert any(st.error is not None for st in every)
    assert any(st.sched is None for st in every)
    assert any(st.prefix_cache for st in every)
    assert any(run(name)[3] is not None for name in SCENARIOS)
    vllm_pool = [st.sched for st in run("vllm-prefix-caching.toml")[1]]
    assert any(None in sc.ident and any(isinstance(b, tuple) for b in sc.ident) for sc in vllm_pool)


def test_the_file_round_trip_keeps_actions_meta_and_loop(tmp_path):
    s, states, records, _ = run("vllm-prefix-caching.toml")
    actions = [f"a{i}" for i in range(len(records))]
    meta = {"source": "scenarios/vllm-prefix-caching.toml", "verdict": "ok", "ratio": 0.5}
    path = tmp_path / "t.itf.json"
    write_itf(path, s.cfg, states, records, workload=s.workload, actions=actions, meta=meta, loop=3)
    back = read_itf(path)
    assert_identical(back, s, states, records, loop=3)
    assert back.actions == actions
    assert back.meta["source"] == meta["source"] and back.meta["verdict"] == "ok" and back.meta["ratio"] == 0.5
    # deterministic, valid JSON, one state per line
    text = path.read_text()
    write_itf(tmp_path / "again.json", s.cfg, states, records, workload=s.workload, actions=actions, meta=meta, loop=3)
    assert (tmp_path / "again.json").read_text() == text
    assert len(json.loads(text)["states"]) == len(states)
    assert sum(line.lstrip().startswith('{"#meta":{"index":') for line in text.splitlines()) == len(states)


def test_the_document_follows_itf():
    s, states, records, _ = run("hf-cb-shared-prefix-offload-frees-nothing.toml")
    doc = trace_to_itf(s.cfg, states, records, workload=s.workload)
    head = doc["#meta"]
    assert head["format"] == "ITF" and head["format-description"].startswith("https://apalache-mc.org/")
    assert head["config"]["policy"] == "hf_cb" and len(head["workload"]) == len(s.workload.requests)
    assert doc["vars"] == list(VARS) and "loop" not in doc
    for i, st in enumerate(doc["states"]):
        assert st["#meta"] == {"index": i} and set(st) == {"#meta", *VARS}
    first, second = doc["states"][0], doc["states"][1]
    assert (first["action"], first["record"]["tag"]) == ("init", "Init")
    assert second["action"].startswith("step 0: ") and second["record"]["tag"] == "Step"
    assert first["requests"][0]["phase"] == "PENDING"
    assert first["error"] == {"tag": "Nothing", "value": "U_OF_UNIT"}
    assert first["sched"]["tag"] == "Sched" and first["sched"]["value"]["active"] == {"#tup": []}
    # no JSON null and no float anywhere in the states: ITF has neither
    assert not [v for v in leaves(doc["states"]) if v is None or isinstance(v, float)]


def leaves(j):
    if isinstance(j, dict):
        j = list(j.values())
    if isinstance(j, list):
        return [leaf for v in j for leaf in leaves(v)]
    return [j]


def test_big_integers_are_bigints_and_floats_are_refused():
    s, states, records, _ = run("trtllm-v1-draft-budget.toml")
    big = [*states[:-1], dataclasses.replace(states[-1], free_blocks=2 ** 60, free_host_blocks=-(2 ** 53))]
    doc = trace_to_itf(s.cfg, big, records)
    last = doc["states"][-1]
    assert last["free_blocks"] == {"#bigint": str(2 ** 60)}
    assert last["free_host_blocks"] == {"#bigint": str(-(2 ** 53))}
    assert itf_to_trace(through_json(doc)).states == big
    floaty = [*states[:-1], dataclasses.replace(states[-1], free_blocks=3.0)]
    with pytest.raises(ItfError) as err:
        trace_to_itf(s.cfg, floaty, records)
    assert err.value.field == f"states[{len(states) - 1}].free_blocks" and "float" in err.value.reason


def test_each_state_says_what_the_step_into_it_did():
    """The `action` of a state is the trace table's words for the step (schedproof/tracetable.py)."""
    before = State(step=3, requests=(Request(0, 512, 8, 0, phase=Phase.WAITING),
                                     Request(1, 16, 8, 0, phase=Phase.DECODING, computed=20, generated=5),
                                     Request(2, 16, 8, 0, phase=Phase.DECODING, computed=23, generated=8)),
                   free_blocks=10, free_host_blocks=0)
    after = State(step=4, requests=(Request(0, 512, 8, 0, phase=Phase.DECODING, computed=512, generated=1),
                                    Request(1, 16, 8, 0, phase=Phase.DECODING, computed=21, generated=6),
                                    Request(2, 16, 8, 0, phase=Phase.FINISHED, computed=24, generated=8)),
                  free_blocks=8, free_host_blocks=0)
    record = StepRecord(step=3, scheduled=((0, 512), (1, 1), (2, 1)), finished=(2,))
    cfg = scenario.load(ROOT / "scenarios" / "vllm-chunked-off-recompute-wedge.toml").cfg
    doc = trace_to_itf(cfg, [before, after], [record])
    assert [s["action"] for s in doc["states"]] == ["init", "step 3: r0 context 512; r1, r2 decode; r2 finish"]


# -- the independent reader -----------------------------------------------------------------------

def test_itf_py_reads_what_we_write_and_writes_what_we_read(tmp_path):
    s, states, records, loop = run("vllm-chunked-off-recompute-wedge.toml")
    path = tmp_path / "t.itf.json"
    write_itf(path, s.cfg, states, records, workload=s.workload, loop=loop)
    theirs = itf_py.trace_from_json(json.loads(path.read_text()))
    assert len(theirs.states) == len(states) and theirs.vars == list(VARS) and theirs.loop == loop
    last = theirs.states[-1].values
    assert last["requests"][0].phase == states[-1].requests[0].phase.name
    assert last["free_blocks"] == states[-1].free_blocks
    assert type(last["sched"]).__name__ == "Sched" and last["sched"].running == states[-1].sched.running
    assert type(last["error"]).__name__ == "Nothing"   # a variant: the namedtuple Nothing(value='U_OF_UNIT')
    assert type(theirs.states[1].values["record"]).__name__ == "Step"
    # Back through itf-py's writer: it writes every int as {"#bigint": ...}, records and variants from its
    # namedtuples, and "loop": null for no loop; our reader takes all of these and gives the same trace.
    again = itf_py.trace_to_json(theirs)
    assert again["states"][-1]["free_blocks"] == {"#bigint": str(states[-1].free_blocks)}
    assert_identical(itf_to_trace(through_json(again)), s, states, records, loop)


def test_itf_py_round_trip_keeps_the_vllm_block_pool():
    s, states, records, _ = run("vllm-prefix-caching.toml")
    theirs = itf_py.trace_from_json(through_json(trace_to_itf(s.cfg, states, records, workload=s.workload)))
    assert_identical(itf_to_trace(through_json(itf_py.trace_to_json(theirs))), s, states, records)


# -- bad input ------------------------------------------------------------------------------------

def written(name="vllm-prefix-caching.toml") -> dict:
    s, states, records, _ = run(name)
    return through_json(trace_to_itf(s.cfg, states, records, workload=s.workload))


def refusal(data, source="t.json") -> ItfError:
    with pytest.raises(ItfError) as err:
        itf_to_trace(data, source)
    message = str(err.value)
    assert "\n" not in message and message == f"{source}: {err.value.field}: {err.value.reason}"
    return err.value


def test_a_file_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"#meta": {}, "states": [')
    with pytest.raises(ItfError) as err:
        read_itf(path)
    assert str(err.value).startswith(f"{path}: -: not JSON") and "\n" not in str(err.value)
    with pytest.raises(ItfError, match="cannot read"):
        read_itf(tmp_path / "absent.json")


def test_a_state_missing_a_variable_is_refused():
    data = written()
    del data["states"][3]["requests"]
    assert refusal(data).field == "states[3].requests"


def test_a_phase_that_is_not_a_phase_is_refused():
    data = written()
    data["states"][3]["requests"][1]["phase"] = "RUNNING"
    err = refusal(data)
    assert err.field == "states[3].requests[1].phase" and "not a phase" in err.reason


def _set(path, value):
    def change(data):
        *parents, last = path
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    return change


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("states"), "states"),
    (lambda d: d["#meta"].pop("config"), "#meta.config"),
    (_set(["#meta", "config", "block_size"], 0), "#meta.config.block_size"),
    (_set(["#meta", "workload", 1, "prompt"], "long"), "#meta.workload[1].prompt"),
    (_set(["states"], []), "states"),
    (_set(["loop"], 99), "loop"),
    (_set(["states", 2, "free_blocks"], 1.5), "states[2].free_blocks"),
    (_set(["states", 2, "free_blocks"], {"#bigint": "12x"}), "states[2].free_blocks"),
    (_set(["states", 2, "error"], None), "states[2].error"),
    (_set(["states", 2, "requests", 0], [1, 2]), "states[2].requests[0]"),
    (_set(["states", 2, "requests", 0, "extra"], 1), "states[2].requests[0].extra"),
    (_set(["states", 2, "sched", "tag"], "Other"), "states[2].sched"),
    (_set(["states", 2, "sched", "value", "ident", "#tup", 1], [0]), "states[2].sched.ident[1]"),
    (_set(["states", 2, "record"], {"tag": "Init", "value": "U_OF_UNIT"}), "states[2].record"),
    (_set(["states", 2, "record", "value", "scheduled", "#tup", 0], {"#tup": [0]}), "states[2].record.scheduled[0]"),
])
def test_a_value_of_the_wrong_shape_is_refused_naming_its_field(change, field):
    data = written()
    change(data)
    assert refusal(data).field == field


def test_a_document_that_is_not_an_object_is_refused():
    assert refusal([1, 2]).field == "-"
