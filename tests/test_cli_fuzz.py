"""The command line under generated bad input: scenario files, check files, argument lists and
environment values with wrong types, NaN, infinities, huge and negative numbers, unknown keys and
bad paths, for every command. Each call ends with exit 0, 1, 2 or 3 and no traceback, within a
bounded time (every search is given a short time-out, every number is held to model/limits.py, so
no call can run long or grow past memory).

Sizes: the `ci` Hypothesis profile (tests/conftest.py, derandomized); SCHEDPROOF_PROFILE=nightly
runs many more."""

import itertools
import os
import resource
import time
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

from helpers import sized
from schedproof.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sized(ci=30, nightly=400)     # ci: 30 since the valid run and check calls were added (2026-12-07)
SECONDS_PER_CALL = 60     # a check or prove is given 1-2 s; loading, replay and reporting the rest
PEAK_MEMORY_BYTES = 4 << 30   # the test process's peak, whatever else it ran before: a sixth of the machine

# One small valid design per policy; the fuzz mutates its fields.
BASE = {
    "vllm_v1": {"engine": {"policy": '"vllm_v1"', "block_size": "4", "num_blocks": "6", "max_num_tokens": "8",
                           "max_batch_size": "2"},
                "options": {"max_model_len": "8", "watermark": "0.0"}},
    "trtllm_v2": {"engine": {"policy": '"trtllm_v2"', "block_size": "4", "num_blocks": "6",
                             "max_num_tokens": "8", "max_batch_size": "2"},
                  "options": {"max_util_for_resume": "0.95", "kv_bytes_per_token": "12288",
                              "disable_overlap_scheduler": "true"}},   # the loop the symbolic cores encode
    "trtllm_v1": {"engine": {"policy": '"trtllm_v1"', "block_size": "4", "num_blocks": "6",
                             "max_num_tokens": "8", "max_batch_size": "2"},
                  "options": {"draft_len": "0", "disable_overlap_scheduler": "true"}},
    "hf_cb": {"engine": {"policy": '"hf_cb"', "block_size": "4", "num_blocks": "6", "max_num_tokens": "8",
                         "max_batch_size": "2", "chunked_prefill": "true"},
              "options": {"safety_margin": "0.1"}},
}
REQUEST = {"count": "2", "prompt": "3", "max_new": "3", "arrival": "0"}
CHECK = {"max_depth": "3", "early_stops": "false", "cancellations": "false"}

BAD_VALUES = ["nan", "inf", "-inf", "-1", "0", str(2**62), str(-(2**62)), "1e300", '"ten"', "true", "[]",
              "[1, 2, 3]", "[5, 2]", "[1, 4611686018427387904]", "[1, nan]", "{}", "1.5", "-0.0"]
RANGES = ["[1, 3]", "[2, 4]", "[0, 2]"]
CALLS = itertools.count()
CHECK_IS_SHORT = ["--budget", "1.5", "--timeout", "30", "--progress", "off"]


def render(design: dict) -> str:
    lines = [f'name = "{design["name"]}"', "[engine]"]
    lines += [f"{k} = {v}" for k, v in design["engine"].items()]
    lines += ["[engine.options]"] + [f"{k} = {v}" for k, v in design["options"].items()]
    for group in design["requests"]:
        lines += ["[[requests]]"] + [f"{k} = {v}" for k, v in group.items()]
    if design.get("check"):
        lines += ["[check]"] + [f"{k} = {v}" for k, v in design["check"].items()]
    return "\n".join(lines) + "\n"


@st.composite
def designs(draw, ranges: bool):
    policy = draw(st.sampled_from(sorted(BASE)))
    design = {"name": "fuzzed", "engine": dict(BASE[policy]["engine"]), "options": dict(BASE[policy]["options"]),
              "requests": [dict(REQUEST)], "check": dict(CHECK) if ranges else {}}
    tables = ["engine", "options", "request"] + (["check"] if ranges else [])
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):    # a valid design as often as a broken one
        table = draw(st.sampled_from(tables))
        target = design["requests"][0] if table == "request" else design[table]
        kind = draw(st.sampled_from(["bad", "range", "unknown", "missing"]))
        key = draw(st.sampled_from(sorted(target) or ["x"]))
        if kind == "bad":
            target[key] = draw(st.sampled_from(BAD_VALUES))
        elif kind == "range" and ranges:
            target[key] = draw(st.sampled_from(RANGES))
        elif kind == "unknown":
            target["no_such_" + key] = "1"
        elif kind == "missing":
            target.pop(key, None)
    return render(design)


FLAGS = {
    "run": [["--max-steps", v] for v in ("0", "-5", "nan", "1e9", "50", "abc")] + [["--json"]],
    "check": [["--max-depth", v] for v in ("0", "nan", "2", "100000")] + [["--property", "NOPE"]]
             + [[flag, v] for flag in ("--timeout", "--budget") for v in ("nan", "inf", "-1", "0.0001")]
             + [["--json"], ["--no-accelerate"]],
    "prove": [[flag, v] for flag in ("--timeout", "--budget") for v in ("nan", "inf", "-1", "abc", "0.001")]
             + [["no_such_policy"]],
    "fuzz": [["--examples", v] for v in ("0", "-1", "nan", "3")] + [["--steps", v] for v in ("0", "5", "1e12")]
            + [["--step-timeout", v] for v in ("0.0001", "nan", "-1", "inf")]
            + [["--seed", v] for v in ("-1", str(2**40), "x")] + [["--profile", "weekly"]]
            + [["--fitting-only"], ["--no-empty-prompts"], ["--drain"]],
    "corpus": [["--max-steps", v] for v in ("0", "nan")] + [["--json"]],
}


@st.composite
def calls(draw, tmp: Path):
    """(argv, environment overrides) for one command, its files written in a fresh folder under `tmp`."""
    tmp = tmp / f"call{next(CALLS)}"
    tmp.mkdir()
    command = draw(st.sampled_from(sorted(FLAGS) + ["properties", "nope"]))
    # prove decides every claim of the policies its flags leave: on one worker, in this process (the default, a
    # process per core, imports the checkers again in each and took twice the CPU for the same calls)
    argv = [command, "--workers", "1"] if command == "prove" else [command]
    env = {}
    if command in ("run", "check"):
        where = draw(st.sampled_from(["file", "file", "file", "missing", "folder", "not-toml"]))
        path = tmp / "design.toml"
        if where == "file":
            path.write_text(draw(designs(ranges=command == "check")))
        elif where == "folder":
            path.mkdir(exist_ok=True)
        elif where == "not-toml":
            path.write_bytes(draw(st.binary(max_size=40)))
        argv.append(str(path))
    if command == "corpus":
        folder = tmp / "corpus"
        folder.mkdir()
        (folder / "a.toml").write_text(draw(designs(ranges=False)))
        argv.append(str(folder))
    if command == "fuzz":
        argv += ["--target", draw(st.sampled_from(["reference", "reference", "nope"])), "--examples", "3",
                 "--steps", "5", "--out", str(draw(st.sampled_from([tmp / "reports", tmp / "reports" / "x.json",
                                                                     Path("/proc/no/such")])))]
        if draw(st.booleans()):
            env["SCHEDPROOF_PROFILE"] = draw(st.sampled_from(["ci", "nightly", "weekly", "", "CI"]))
    if draw(st.booleans()):     # half the calls with the flags a user would give, half with fuzzed ones
        for flags in draw(st.lists(st.sampled_from(FLAGS.get(command, [["--json"]])), max_size=3)):
            argv += flags
    if command == "check":
        argv += CHECK_IS_SHORT      # later flags win: every search is short
    if command == "prove":
        argv += ["--budget", "1", "--timeout", "30"]
    if command == "fuzz":
        argv += ["--examples", "3", "--steps", "5"]     # later flags win: every search is short
    return argv, env


def test_every_generated_call_ends_in_a_status_without_a_traceback(tmp_path_factory, capsys):
    tmp = tmp_path_factory.mktemp("cli-fuzz")
    ended = {}     # (command, exit status) -> calls

    # A valid `run` and a valid `check` call first, so that each command's path past the validation is taken
    # whatever Hypothesis draws: a drawn call gets there about once in 30 draws, and the derandomized draws change
    # with the modules the worker has loaded (Hypothesis draws some numbers from the constants of local modules)
    valid = {"name": "valid", "engine": BASE["trtllm_v2"]["engine"], "options": BASE["trtllm_v2"]["options"],
             "requests": [REQUEST]}
    (tmp / "run.toml").write_text(render(valid))
    (tmp / "check.toml").write_text(render({**valid, "check": CHECK}))

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @example(call=(["run", str(tmp / "run.toml")], {}))
    @example(call=(["check", str(tmp / "check.toml"), *CHECK_IS_SHORT], {}))
    @given(call=calls(tmp))
    def one(call):
        argv, env = call
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        start = time.monotonic()
        try:
            code = main(argv)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        took = time.monotonic() - start
        out, err = capsys.readouterr()
        assert code in (0, 1, 2, 3), (argv, code, err[-1000:])
        assert "Traceback" not in out + err, (argv, err[-2000:])
        if code == 2:
            # bad input: one line on stderr naming what is wrong
            assert err.strip() and len(err.strip().splitlines()) == 1, (argv, err)
        assert took < SECONDS_PER_CALL, (argv, took)
        ended[argv[0], code] = ended.get((argv[0], code), 0) + 1

    one()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: kilobytes
    assert peak < PEAK_MEMORY_BYTES, peak
    # past the validation too: some calls ran a command to a result (the valid calls above among them)
    ran = {cmd for (cmd, code) in ended if code != 2}
    assert {"run", "check"} <= ran and any(code == 2 for (_, code) in ended), ended
