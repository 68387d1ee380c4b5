"""`schedproof check` on any check file: a status or a one-line refusal, never a traceback.

Hypothesis writes check files (TOML) for every policy with a symbolic core: engine knobs and
request fields as values or ranges, each policy's `[engine.options]` drawn from its Options
dataclass, a `[check]` table, and sometimes exactly one deliberately invalid value. Each file is
checked in process through the command line's own entry (`schedproof.cli.main`) with a small
time-out, and the outcome is held to what `check` promises:
- exit 0 bounded or proved, 1 violated, 3 unknown, or 2 with one line `schedproof: FILE: FIELD: reason`;
- a file with an invalid value is refused, naming that value's field;
- a violation was replayed in both simulators, and written back as a `run` file (the design in
  the file's own terms, the counterexample's workload) `schedproof run` loads it and finds the
  same property violated: the counterexample is a design the engine accepts, not only a state
  the solver reached;
- `unknown` is never a trace that failed to replay (run_check turns that defect into `unknown`).
Refusals of features a core does not model yet are valid outcomes: the test does not depend on
which features are refused.

Sizes: SCHEDPROOF_PROFILE=ci (the default; derandomized, a few minutes on 2 cores) or nightly
(more examples, larger spaces, longer time-outs), the names of targets/stateful.py PROFILES.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import typing

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import model.policies  # noqa: F401  (registers every policy)
from checkers.space import MAX_SLOTS, MAX_VALUE
from model.policy import POLICIES
from properties.symbolic import PRIORITY
from schedproof.checkspec import load_check
from schedproof.cli import main
from schedproof.scenario import ScenarioError

PROFILE = os.environ.get("SCHEDPROOF_PROFILE", "ci")
# timeout: seconds per check; slots: request slots at most; depth: --max-depth at most. The ci size spends most of
# each check's budget (a file decided within 8 s of solving is rare: the review's proofs and the search take their
# share first), so its examples are its time: 15 (about 2 minutes of one worker; 30 took 220-250 s in the clean
# clones of 2026-12-06, docs/benchmarks.md); the nightly's 600 are the search. A budget of 5 s ends each of the 15 in
# the same exit status as 8 s did (`--hypothesis-show-statistics`: the same events, per policy and status), in 89 s
# against 163 s, run side by side on this machine (2026-12-07); later that day 3 s did too (the same events), in 52 s of
# user CPU against 78 s with 5 s.
SIZES = {"ci": {"examples": 15, "timeout": 3.0, "slots": 4, "depth": 4},
         "nightly": {"examples": 600, "timeout": 15.0, "slots": 6, "depth": 8}}[PROFILE]
settings.register_profile("check-files-ci", derandomize=True, max_examples=SIZES["examples"], deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          print_blob=True)
settings.register_profile("check-files-nightly", max_examples=SIZES["examples"], deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          print_blob=True)
PROFILE_SETTINGS = settings.get_profile(f"check-files-{PROFILE}")

POLICY_NAMES = ("trtllm_v2", "trtllm_v1", "vllm_v1", "hf_cb")
RANGED_REQUEST = ("count", "prompt", "max_new", "arrival", "output_len", "cancel_at", "prefix_len", "priority")
RANGED_ENGINE = ("block_size", "num_blocks", "max_num_tokens", "max_batch_size", "host_blocks")


# -- TOML -------------------------------------------------------------------------------------
def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(v)


def to_toml(doc: dict) -> str:
    """The few shapes a check file has: top-level values, [engine] with [engine.options],
    [[requests]], [check]."""
    lines = [f"{k} = {_value(v)}" for k, v in doc.items()
             if not isinstance(v, dict) and not (k == "requests" and isinstance(v, list))]
    for table in ("engine", "check"):
        if isinstance(doc.get(table), dict):
            body = doc[table]
            lines.append(f"\n[{table}]")
            lines += [f"{k} = {_value(v)}" for k, v in body.items() if not isinstance(v, dict)]
            for sub, inner in body.items():
                if isinstance(inner, dict):
                    lines.append(f"\n[{table}.{sub}]")
                    lines += [f"{k} = {_value(v)}" for k, v in inner.items()]
    for g in doc["requests"] if isinstance(doc.get("requests"), list) else []:
        lines.append("\n[[requests]]")
        lines += [f"{k} = {_value(v)}" for k, v in g.items()]
    return "\n".join(lines) + "\n"


# -- strategies -------------------------------------------------------------------------------
@st.composite
def number(draw, low: int, high: int, ranged: bool = True):
    """A value in [low, high], or a closed range inside it."""
    if ranged and draw(st.booleans()):
        a, b = sorted((draw(st.integers(low, high)), draw(st.integers(low, high))))
        return [a, b]
    return draw(st.integers(low, high))


def lo(v):
    return v[0] if isinstance(v, list) else v


def hi(v):
    return v[1] if isinstance(v, list) else v


FLOATS = (0.0, 0.05, 0.1, 0.15, 0.5, 0.9, 0.95, 1.0)


@st.composite
def option_value(draw, field: dataclasses.Field, hint):
    """A valid value for one Options field, from its type and its metadata (build_options' checks)."""
    meta = field.metadata
    allowed = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
    if "choices" in meta:
        return draw(st.sampled_from(meta["choices"]))
    if bool in allowed:
        return draw(st.booleans())
    if str in allowed:
        return draw(st.text("abc", min_size=1, max_size=3))
    if float in allowed:
        values = [f for f in FLOATS if (f > 0 or not meta.get("positive")) and f <= meta.get("max", 1.0)]
        return draw(st.sampled_from(values))
    return draw(st.integers(1 if meta.get("positive") else 0, min(meta.get("max", 24), 24)))


@st.composite
def options_table(draw, policy_name: str) -> dict:
    opts_cls = POLICIES[policy_name].Options
    hints = typing.get_type_hints(opts_cls)
    pool = POLICIES[policy_name].pool_option
    out = {}
    for f in dataclasses.fields(opts_cls):
        if f.name == pool:
            continue                       # the pool is drawn with num_blocks
        if draw(st.integers(0, 3)) == 0:   # most options keep their defaults
            out[f.name] = draw(option_value(f, hints[f.name]))
    return out


@st.composite
def engine_table(draw, policy_name: str) -> dict:
    """A design the policy mostly accepts (its check_config's rules are followed most of the time,
    so most files are searched), sometimes one it refuses."""
    # small pools and budgets against prompts up to 12: violations within a few transitions
    page = draw(number(4 if policy_name == "hf_cb" else 1, 6))
    batch = draw(number(1, 4))
    # vLLM: max_num_batched_tokens >= max_num_seqs at every corner of the ranges
    tokens = draw(number(hi(batch) if policy_name == "vllm_v1" else 1, 16))
    eng = {"policy": policy_name, "block_size": page, "max_num_tokens": tokens, "max_batch_size": batch}
    opts = draw(options_table(policy_name))
    pool = POLICIES[policy_name].pool_option
    if pool and draw(st.integers(0, 4)) == 0:
        opts[pool] = draw(st.integers(1, 64))   # the engine's own pool knob instead of num_blocks
        eng["block_size"] = lo(page)            # the conversion depends on the page size: one value
        if policy_name == "trtllm_v2":
            # with the default 12 KiB per token a 2 MiB quota is over 40 pages; larger tokens keep it small
            opts["kv_bytes_per_token"] = draw(st.sampled_from([65536, 262144]))
    elif policy_name == "vllm_v1":
        eng["num_blocks"] = draw(number(3, 8))   # one block is vLLM's null block
    else:
        eng["num_blocks"] = draw(number(1, 6))
    if draw(st.integers(0, 4 if policy_name == "trtllm_v2" else 15)) == 0:
        eng["host_blocks"] = draw(number(0, 4))
        opts.pop("fix_worst_case_admission", None)   # trtllm_v2: fix B needs host_blocks = 0
    chunked = draw(st.booleans()) if policy_name != "hf_cb" else draw(st.integers(0, 9)) > 0
    if chunked or draw(st.booleans()):
        eng["chunked_prefill"] = chunked
    if policy_name == "trtllm_v1" and not chunked:
        opts.pop("chunking_policy", None)            # only applies with chunked prefill
    if policy_name.startswith("trtllm"):
        opts["disable_overlap_scheduler"] = draw(st.booleans())   # both loops (the cores express both)
    if draw(st.integers(0, 7)) == 0:
        eng["chunk_unit"] = draw(st.integers(0, 4 if policy_name.startswith("trtllm") else 1))
    if policy_name == "vllm_v1":
        # vLLM refuses max_model_len over the token budget without chunking and over what the
        # pool holds beside the null block
        longest = 32 if chunked else max(2, lo(tokens))
        longest = min(longest, max(2, (lo(eng["num_blocks"]) - 1) * lo(page)))
        opts["max_model_len"] = draw(st.integers(2, longest))
        opts["async_scheduling"] = draw(st.booleans())   # both loops (the core expresses both)
        opts.setdefault("enable_prefix_caching", draw(st.integers(0, 3)) == 0)
        if opts.get("max_num_active_seqs", 0) > lo(batch):
            opts["max_num_active_seqs"] = lo(batch)
        if opts.get("long_prefill_token_threshold", 0) > opts["max_model_len"]:
            opts["long_prefill_token_threshold"] = opts["max_model_len"]
    if opts:
        eng["options"] = opts
    return eng


@st.composite
def request_groups(draw, slots: int) -> list:
    n = draw(st.integers(1, min(3, slots)))
    left = slots - n            # slots beyond one per group
    groups = []
    for k in range(n):
        g = {}
        extra = draw(st.integers(0, left))
        left -= extra
        if extra or draw(st.booleans()):
            g["count"] = draw(number(1, 1 + extra)) if extra else 1
        g["prompt"] = draw(number(1, 16))
        g["max_new"] = draw(number(1, 6))
        if draw(st.booleans()):
            g["arrival"] = draw(number(0, 3))
        if draw(st.integers(0, 3)) == 0:
            g["output_len"] = draw(number(1, hi(g["max_new"])))
        if draw(st.integers(0, 3)) == 0:
            g["cancel_at"] = draw(number(hi(g.get("arrival", 0)), 6))
        sharing = draw(st.integers(0, 7))
        if sharing < 2:
            g["prefix_group"] = sharing
            g["prefix_len"] = draw(number(1, lo(g["prompt"])))
        elif sharing == 2:
            g["prefix_group"] = -1            # no shared prefix, said explicitly
        if draw(st.integers(0, 3)) == 0:
            g["priority"] = draw(number(-2, 3))
        groups.append(g)
    return groups


@st.composite
def check_table(draw) -> dict:
    out = {}
    for flag in ("early_stops", "cancellations"):
        if draw(st.booleans()):
            out[flag] = draw(st.booleans())
    if draw(st.booleans()):
        out["max_depth"] = draw(st.integers(1, 6))
    if draw(st.integers(0, 3)) == 0:
        out["properties"] = draw(st.lists(st.sampled_from(PRIORITY), min_size=1, max_size=3, unique=True))
    return out


@st.composite
def check_files(draw, slots: int) -> dict:
    policy_name = draw(st.sampled_from(POLICY_NAMES))
    doc = {"name": "drawn", "engine": draw(engine_table(policy_name)), "requests": draw(request_groups(slots))}
    check = draw(check_table())
    if check:
        doc["check"] = check
    return doc


# One invalid value: (the field it must be refused at, how the file is changed). Each is outside
# what the loader accepts whatever the rest of the file holds.
def _set(path):
    def put(doc, value):
        table = doc
        for key in path[:-1]:
            table = table[key] if isinstance(key, int) else table.setdefault(key, {})
        table[path[-1]] = value
    return put


@st.composite
def invalid_edit(draw, doc: dict) -> tuple[str, typing.Callable]:
    """(field, edit): the edit puts an invalid value at the field."""
    k = draw(st.integers(0, len(doc["requests"]) - 1))
    g = doc["requests"][k]
    ranged_here = [("engine", f) for f in RANGED_ENGINE if f in doc["engine"]] + \
                  [("requests", k, f) for f in RANGED_REQUEST if f in g]
    place = draw(st.sampled_from(ranged_here))
    name = ".".join(place) if place[0] == "engine" else f"requests[{k}].{place[2]}"
    kind = draw(st.sampled_from(["reversed", "three", "bool", "huge", "not-rangeable", "check", "option",
                                 "unknown-key", "count", "arrival", "max_new", "shape", "point-huge"]))
    if kind == "reversed":
        return name, lambda d: _set(place)(d, [5, 2])
    if kind == "three":
        return name, lambda d: _set(place)(d, [1, 2, 3])
    if kind == "bool":
        return name, lambda d: _set(place)(d, [1, True])
    if kind == "huge":
        return name, lambda d: _set(place)(d, [1, MAX_VALUE + 1])
    if kind == "point-huge" and name != f"requests[{k}].count":
        return name, lambda d: _set(place)(d, MAX_VALUE + 1)
    if kind == "shape":    # a table or a list of tables given as a number
        table = draw(st.sampled_from(["requests", "engine", "check", "options"]))
        if table == "options":
            return "engine.options", lambda d: _set(("engine", "options"))(d, 3)
        return table, lambda d: _set((table,))(d, 3)
    if kind == "not-rangeable":
        field = draw(st.sampled_from(["chunked_prefill", "policy", "prefix_group"]))
        if field == "prefix_group":
            return f"requests[{k}].prefix_group", lambda d: _set(("requests", k, "prefix_group"))(d, [0, 1])
        return f"engine.{field}", lambda d: _set(("engine", field))(d, [0, 1])
    if kind == "check":
        key, value = draw(st.sampled_from([("max_depth", 0), ("max_depth", -3), ("max_depth", True),
                                           ("max_depth", "4"), ("early_stops", 1), ("cancellations", "yes"),
                                           ("properties", []), ("properties", ["LIVE-NOPE"]),
                                           ("properties", "LIVE-NO-PROGRESS"), ("depth", 3)]))
        return f"check.{key}", lambda d: _set(("check", key))(d, value)
    if kind == "option":
        opts_cls = POLICIES[doc["engine"]["policy"]].Options
        field = draw(st.sampled_from(dataclasses.fields(opts_cls)))
        hint = typing.get_type_hints(opts_cls)[field.name]
        allowed = typing.get_args(hint) or (hint,)
        bad = "no" if (bool in allowed or int in allowed or float in allowed) else 3
        if draw(st.booleans()):
            return "engine.options.no_such_option", lambda d: _set(("engine", "options", "no_such_option"))(d, 1)
        return f"engine.options.{field.name}", lambda d: _set(("engine", "options", field.name))(d, bad)
    if kind == "unknown-key":
        if draw(st.booleans()):
            return "engine.no_such_knob", lambda d: _set(("engine", "no_such_knob"))(d, 1)
        return f"requests[{k}].no_such_field", lambda d: _set(("requests", k, "no_such_field"))(d, 1)
    if kind in ("count", "point-huge"):
        count = draw(st.sampled_from([0, [0, 2], MAX_SLOTS + 1]))
        return f"requests[{k}].count", lambda d: _set(("requests", k, "count"))(d, count)
    if kind == "arrival":
        return f"requests[{k}].arrival", lambda d: _set(("requests", k, "arrival"))(d, [-1, 2])
    # max_new = 0: invalid unless output_len (which needs max_new >= output_len >= 1) is given
    return f"requests[{k}].max_new", lambda d: (d["requests"][k].pop("output_len", None),
                                                _set(("requests", k, "max_new"))(d, 0))


# -- running it -------------------------------------------------------------------------------
LINE = re.compile(r"^schedproof: (?P<path>\S+): (?P<field>\S+): (?P<reason>.+)$")
FIELD = re.compile(r"^(name|description|engine|requests|check|properties|expect|--property)(\[\d+\])?(\.\w+)*$")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def refusal(err: str, path: str) -> str:
    """The field named by the one-line refusal on stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"a refusal is one line, got {lines!r}"
    m = LINE.match(lines[0])
    assert m and m["path"] == path, f"the refusal names the file: {lines[0]!r}"
    assert FIELD.match(m["field"]), f"the refusal names a field: {lines[0]!r}"
    return m["field"]


def as_run_file(doc: dict, out: dict) -> dict:
    """The counterexample as a `run` scenario: the design in the file's own terms (a pool given as
    an engine option stays one, so the engine's conversion is checked too), its workload one
    request per group."""
    cfg = out["config"]
    eng = {"policy": cfg["policy"], "block_size": cfg["block_size"], "max_num_tokens": cfg["max_num_tokens"],
           "max_batch_size": cfg["max_batch_size"], "host_blocks": cfg["host_blocks"],
           "chunked_prefill": cfg["chunked_prefill"], "chunk_unit": cfg["chunk_unit"]}
    opts = {k: v for k, v in (cfg["options"] or {}).items() if v is not None}
    pool = POLICIES[cfg["policy"]].pool_option
    if "num_blocks" in doc["engine"]:
        eng["num_blocks"] = cfg["num_blocks"]
        opts.pop(pool, None)
    if opts:
        eng["options"] = opts
    reqs = []
    for r in out["workload"]:
        g = {"prompt": r["prompt"], "max_new": r["max_new"], "arrival": r["arrival"], "priority": r["priority"]}
        if r["output_len"] is not None:
            g["output_len"] = r["output_len"]
        if r["cancel_at"] is not None:
            g["cancel_at"] = r["cancel_at"]
        if r["prefix_group"] >= 0:
            g["prefix_group"], g["prefix_len"] = r["prefix_group"], r["prefix_len"]
        reqs.append(g)
    return {"name": "counterexample", "engine": eng, "requests": reqs}


@PROFILE_SETTINGS
@given(data=st.data())
def test_any_check_file_ends_in_a_status_or_a_one_line_refusal(tmp_path_factory, data):
    doc = data.draw(check_files(SIZES["slots"]), label="file")
    policy_name = doc["engine"]["policy"]
    folder = tmp_path_factory.mktemp("check")
    path = str(folder / "design.toml")
    invalid = None
    if data.draw(st.integers(0, 3), label="invalid?") == 0:
        base = folder / "base.toml"
        base.write_text(to_toml(doc))
        try:
            load_check(str(base))
            base_loads = True
        except ScenarioError:
            base_loads = False
        invalid, edit = data.draw(invalid_edit(doc), label="invalid")
        edit(doc)
    text = to_toml(doc)
    note(text)
    with open(path, "w") as fh:
        fh.write(text)

    as_json = data.draw(st.booleans(), label="json")
    argv = ["check", path, "--budget", str(SIZES["timeout"])]
    if data.draw(st.integers(0, 4), label="depth given") > 0:
        argv += ["--max-depth", str(data.draw(st.integers(1, SIZES["depth"]), label="depth"))]
    if data.draw(st.integers(0, 5), label="property given") == 0:
        argv += ["--property", data.draw(st.sampled_from(PRIORITY), label="property")]
    if data.draw(st.integers(0, 5), label="no accel") == 0:
        argv.append("--no-accelerate")
    if as_json:
        argv.append("--json")
    code, out, err = run_cli(argv)
    note(f"exit {code}\nstdout:\n{out}\nstderr:\n{err}")

    assert code in (0, 1, 2, 3)
    event(f"{policy_name}: exit {code}")
    if code == 2:
        field = refusal(err, path)
        event("refused at " + re.sub(r"\[[0-9]+\]", "[k]", field))
        note(err)
        assert not out
        if invalid is not None and base_loads:
            assert field == invalid, f"refused at {field}, not at the invalid {invalid}"
        return
    assert invalid is None, f"the invalid {invalid} was not refused"
    status = {0: "bounded", 1: "violated", 3: "unknown"}[code]
    if as_json:
        report = json.loads(out)
        if code == 0 and report["status"] == "proved":      # proofs/review.py: a claim or an inferred invariant
            status = "proved"
        assert report["status"] == status
        replay_line = report.get("replay") or ""
        reason = report.get("reason", "")
    else:
        if code == 0 and out.startswith("proved"):
            status = "proved"
        assert out.startswith(status)
        replay_line = next((line[len("replay: "):] for line in out.splitlines() if line.startswith("replay: ")), "")
        reason = out.splitlines()[0]
    assert "did not replay" not in reason, "a solver trace the simulators do not reproduce"
    if status != "violated":
        return
    assert replay_line.startswith("replayed"), replay_line
    if not as_json:
        return
    run_path = str(folder / "counterexample.toml")
    with open(run_path, "w") as fh:
        fh.write(to_toml(as_run_file(doc, report)))
    run_code, run_out, run_err = run_cli(["run", run_path, "--json"])
    assert run_code == 1, f"`run` on the counterexample: exit {run_code} {run_err}"
    found = {v["property"] for v in json.loads(run_out)["violations"]}
    assert report["property"] in found, (report["property"], found)


# -- regressions: each an explicit small file the property test found ---------------------------
def write_file(tmp_path, text: str) -> str:
    path = tmp_path / "design.toml"
    path.write_text(text)
    return str(path)


def check_json(path: str, *extra: str) -> tuple[int, dict]:
    code, out, err = run_cli(["check", path, "--json", "--budget", "120", *extra])
    return code, json.loads(out) if code != 2 else err


HF_CB_TOO_LARGE = """
name = "hf-cb-too-large"
[engine]
policy = "hf_cb"
block_size = 4
num_blocks = 1
max_num_tokens = 8
max_batch_size = 4
chunked_prefill = true
[[requests]]
count = [1, 3]
prompt = [1, 8]
max_new = [1, 4]
[check]
early_stops = false
cancellations = false
max_depth = 3
"""


def test_a_condition_simplified_to_a_python_bool_is_not_evaluated_in_the_model(tmp_path):
    """A prompt over the one-page cache fails at step 0. At depth 1 the LIVE-NO-PROGRESS condition
    is the Python False (in the initial state no request has arrived, so none is unfinished); it
    reached `model.eval` (AttributeError: 'bool' object has no attribute 'as_ast') before the
    violation could be reported."""
    code, out = check_json(write_file(tmp_path, HF_CB_TOO_LARGE))
    assert code == 1, out
    assert out["property"] == "ENGINE-ERROR" and out["depth"] == 1
    assert out["replay"].startswith("replayed")
    assert out["workload"][0]["prompt"] > 4


def refused_at(tmp_path, text: str) -> tuple[str, str]:
    path = write_file(tmp_path, text)
    code, out, err = run_cli(["check", path, "--budget", "60"])
    assert code == 2 and not out, (code, out, err)
    return refusal(err, path), err


V2 = """
name = "v2"
[engine]
policy = "trtllm_v2"
block_size = {page}
{pool}
max_num_tokens = 8
max_batch_size = 2
[[requests]]
count = {count}
prompt = {prompt}
max_new = [1, 4]
"""


def test_requests_that_are_not_tables_are_refused_in_one_line(tmp_path):
    """`requests = 3` reached a loop over the groups before the loader's check (TypeError: 'int'
    object is not iterable)."""
    text = V2.format(page=4, pool="num_blocks = 4", count=1, prompt=4).replace("[[requests]]\ncount = 1\n"
                                                                               "prompt = 4\nmax_new = [1, 4]\n", "")
    field, _ = refused_at(tmp_path, text.replace('name = "v2"', 'name = "v2"\nrequests = 3'))
    assert field == "requests"


def test_a_page_size_range_with_the_pool_as_an_engine_option_is_refused(tmp_path):
    """The pool converted from kv_cache_max_tokens at the smallest page size was searched with
    every page size of the range: 24 pages of 1 token and 24 pages of 8 tokens, where the engine
    has 3 of 8."""
    pool = "[engine.options]\nkv_cache_max_tokens = 16\nkv_bytes_per_token = 262144"
    text = V2.format(page="[1, 8]", pool="", count=1, prompt=4).replace("[[requests]]", pool + "\n[[requests]]")
    field, _ = refused_at(tmp_path, text)
    assert field == "engine.block_size"


VLLM = """
name = "vllm"
[engine]
policy = "vllm_v1"
block_size = 4
num_blocks = 8
max_num_tokens = [2, 8]
max_batch_size = [1, 4]
chunked_prefill = true
[engine.options]
max_model_len = 8
enable_prefix_caching = false
async_scheduling = false
[[requests]]
prompt = [1, 6]
max_new = [1, 4]
"""


def test_knob_ranges_are_validated_at_every_corner(tmp_path):
    """Both ends pass vLLM's max_num_batched_tokens >= max_num_seqs (2 >= 1, 8 >= 4), the corner
    2 < 4 does not: the search could report a design vLLM refuses to start."""
    field, err = refused_at(tmp_path, VLLM)
    assert field == "engine.max_batch_size" and "max_num_tokens = 2, max_batch_size = 4" in err
    path = write_file(tmp_path, VLLM.replace("max_batch_size = [1, 4]", "max_batch_size = [1, 2]"))
    from schedproof.checkspec import load_check
    assert load_check(path).space.knobs["max_batch_size"] == (1, 2)


@pytest.mark.parametrize("change, field", [
    (dict(prompt=MAX_VALUE + 1), "requests[0].prompt"),     # a single number, as a range's high end is
    (dict(count=f"[1, {MAX_SLOTS + 1}]"), "requests[0].count"),
])
def test_numbers_and_slots_beyond_what_a_check_unrolls_are_refused(tmp_path, change, field):
    values = dict(page=4, pool="num_blocks = 4", count=1, prompt=4)
    values.update(change)
    assert refused_at(tmp_path, V2.format(**values))[0] == field


def test_no_proof_is_built_once_the_time_is_out(tmp_path):
    """Lemma and acceleration obligations take seconds to build at a few slots, whatever their
    time-out: asked with no time left they ran 5 and 8 s checks to 14 and 26 s. Now neither is
    built."""
    import time

    import model.symbolic.cores  # noqa: F401
    from checkers import clock
    from checkers.accel import prove_acceleration
    from checkers.bmc import AccelerationProofs, prove_lemmas
    from model.symbolic.core import CORES

    spec = load_check(write_file(tmp_path, HF_CB_TOO_LARGE))
    core = CORES["hf_cb"]
    gone = clock.now() - 1
    lemmas = prove_lemmas(core, spec.space, gone)
    assert lemmas.obligations == [] and not lemmas.names
    accel = AccelerationProofs(core)
    assert accel.holds(spec.space, lemmas, gone) is False and accel.proved == {}
    # past its own time-out prove_acceleration decides nothing more (it went on building the page
    # facts and the exact obligations: 15 s on a 1 s budget at 3 hf_cb slots)
    obligations = prove_acceleration(core, spec.space.template, 2, 0.0)
    assert obligations and all(o.status == "unknown" and o.reason == "time-out" for o in obligations)


V1_PROMPT_OVER_POOL = """
name = "v1-prompt-over-pool"
[engine]
policy = "trtllm_v1"
block_size = 4
num_blocks = 2
max_num_tokens = 16
max_batch_size = 2
[engine.options]
disable_overlap_scheduler = true   # _executor_loop
[[requests]]
prompt = [1, 12]
max_new = [1, 4]
[check]
early_stops = false
cancellations = false
"""


def test_a_fixpoint_is_not_reported_as_a_livelock(tmp_path):
    """A prompt over the pool is never admitted: the run is a fixpoint (LIVE-NO-PROGRESS). Searched
    for LIVE-LIVELOCK alone, the lasso closed on the fixpoint and reported a livelock the
    simulator's run does not have ("the solver's trace did not replay", exit 3)."""
    path = write_file(tmp_path, V1_PROMPT_OVER_POOL)
    code, out = check_json(path, "--max-depth", "4", "--property", "LIVE-LIVELOCK")
    assert code == 0 and out["status"] == "bounded" and out["depth"] == 4, out
    code, out = check_json(path, "--max-depth", "4")
    assert code == 1 and out["property"] == "LIVE-NO-PROGRESS" and out["replay"].startswith("replayed"), out
