"""bench/time_to_counterexample.py at its small size: the simulator-side searches find the replay-over-budget
deadlock, and what they find replays. BMC is left out (about 10 s of CPU here; the core it searches is held
to the policy by tests/symbolic)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("time_to_counterexample", ROOT / "bench" / "time_to_counterexample.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench     # dataclasses look their module up while the file runs
_spec.loader.exec_module(bench)


def small_space():
    return bench.load_check(str(ROOT / bench.SMALL_SCENARIO)).space


def test_hypothesis_finds_the_deadlock_on_the_small_space():
    o = bench.run_hypothesis(small_space(), budget=60, seed=0, max_examples=5000, shrink_budget=0)
    assert o.found, o.notes


def test_bfs_finds_the_deadlock_on_the_small_grid_and_it_replays():
    o = bench.run_bfs(small_space(), budget=60, points=2, max_states=1_000_000)
    assert o.found, o.notes
    assert any("simulate replays it" in n for n in o.notes), o.notes


def test_grid_is_evenly_spaced_and_ends_at_the_top_of_the_range():
    assert bench.grid(1, 16, 2) == [8, 16]
    assert bench.grid(1, 2048, 4) == [512, 1024, 1536, 2048]
    assert bench.grid(1, 1024, 4) == [256, 512, 768, 1024]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_rare_failures_draws_cover_every_ranged_number_and_stay_in_checks_space():
    """bench/rare_failures.py samples exactly the numbers a check file leaves open, and refuses what
    check's encoding excludes (a cancellation before the request arrives)."""
    rare = _load("rare_failures")
    space = rare.load_check(str(ROOT / "bench" / "rare" / "hf-cb-cancel-window.toml")).space
    draws = rare.Draws.of(space)
    assert [n for n, _, _ in draws.names] == ["g1.0.arrival", "g1.0.cancel_at"]
    cfg, wl = draws.build([3, 5])
    assert [(r.arrival, r.cancel_at) for r in wl.requests] == [(0, None), (3, 5)]
    assert rare.violated(cfg, wl, {"LIVE-NO-PROGRESS"}) == "LIVE-NO-PROGRESS"   # the engine finding
    assert rare.violated(*draws.build([3, 4]), {"LIVE-NO-PROGRESS"}) is None    # before the soft reset
    assert rare.violated(*draws.build([3, 11]), {"LIVE-NO-PROGRESS"}) is None   # after r1 finished
    assert draws.build([3, 2]) is None                                         # cancelled before it arrives


def test_rare_scan_counts_the_failing_points_of_a_box(capsys):
    """bench/rare_scan.py, the evidence for the failing bands the rare spaces state: check's counterexample on
    trtllm-v2-replay-window (prompt0 50, prompt1 699,289, 16 new tokens each) fails, the same pair with prompt1
    19 tokens lower (its replay then fits the budget) does not."""
    _load("rare_failures")
    scan = _load("rare_scan")
    path = str(ROOT / "bench" / "rare" / "trtllm-v2-replay-window.toml")
    assert scan.main([path, "g0.0.prompt=50:50", "g0.0.max_new=16:16", "g1.0.prompt=699270:699289:19",
                      "g1.0.max_new=16:16"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "1 of 2 points fail (LIVE-NO-PROGRESS)"
    assert "g1.0.prompt: 699289..699289" in out


def test_rare_scan_refuses_a_box_that_leaves_a_number_out():
    _load("rare_failures")
    scan = _load("rare_scan")
    path = str(ROOT / "bench" / "rare" / "trtllm-v2-replay-window.toml")
    with pytest.raises(SystemExit, match="give a range for each of g0.0.max_new"):
        scan.main([path, "g0.0.prompt=1:2", "g1.0.prompt=1:2", "g1.0.max_new=1:1"])
    with pytest.raises(SystemExit, match="want NAME=LO:HI"):
        scan.main([path, "g9.prompt=1:2"])


@pytest.mark.engine
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (see tests/test_target_vllm.py)")
def test_vllm_overhead_runs_every_level_on_the_same_scheduling_work(capsys):
    """bench/vllm_overhead.py at one repeat: the bare scheduler loop and the three target levels take the same
    steps (the script asserts it) and the table has a row each. No time is asserted."""
    vo = _load("vllm_overhead")
    vo.main(["--repeats", "1"])
    out = capsys.readouterr().out
    assert "16 requests, 319 steps per run on every side" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| measure")]
    assert [r.split(" | ")[0] for r in rows] == ["| bare scheduler loop", "| (1) target (time limit + observation)",
                                                 "| (2) target + property checks",
                                                 "| (3) target + property checks + lockstep model (as the suite runs it)"]
    assert "goal (level 1, the target itself)" in out
    vo.main(["--parts", "--repeats", "1"])
    out = capsys.readouterr().out
    parts = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ") and "us per step" not in line]
    assert len(parts) == 4 and parts[1].startswith("| the time limit"), out


def test_slot_depths_finds_a_replayed_wedge_at_the_small_size_and_none_before_it():
    """bench/slot_depths.py, the evidence for how far check's unrolling reaches per request count: on the small
    field design 3 requests wedge at depth 5 (the depths before it say none), and the wedge replays."""
    depths = _load("slot_depths")
    _, accelerated, rows = depths.deepen(str(ROOT / "bench" / "trtllm-v2-field-ranges-small.toml"), 3, 0, 8, 120)
    assert accelerated
    assert [r.result for r in rows] == ["none"] * 4 + ["violated"]
    assert rows[-1].replayed and len(rows[-1].workload.requests) == 3


def test_slot_depths_shape_limit_keeps_runs_of_equal_requests():
    """`--shapes 2`: the found workload has at most 2 runs of equal requests (a subset of the file's runs), and
    the wedge found still replays; the constraint itself admits 2 runs of 4 slots and refuses 3."""
    depths = _load("slot_depths")
    _, _, rows = depths.deepen(str(ROOT / "bench" / "trtllm-v2-field-ranges-small.toml"), 4, 2, 6, 120)
    found = rows[-1]
    assert found.result == "violated" and found.replayed
    reqs = [(r.prompt, r.max_new, r.arrival, r.output_len, r.cancel_at) for r in found.workload.requests]
    assert 1 + sum(a != b for a, b in zip(reqs, reqs[1:])) <= 2

    import z3
    slots = [{f: z3.Int(f"s{i}.{f}") for f in depths.SHAPE_FIELDS} for i in range(4)]
    for prompts, sat in (((1, 1, 2, 2), z3.sat), ((1, 2, 2, 3), z3.unsat), ((1, 2, 1, 1), z3.unsat)):
        solver = z3.Solver()
        solver.add(*depths.at_most_shapes(slots, 2))
        solver.add(*[slot["prompt"] == p for slot, p in zip(slots, prompts)])
        assert solver.check() == sat, prompts


def test_mutants_table_names_the_part_that_stops_a_planted_bug(capsys):
    """bench/mutants.py, the evidence for the mutation suite's table in docs/symbolic.md: a planted trtllm_v1 bug,
    its witness breaking the claim on the mutated simulator only, and the argument stopped at the layouts."""
    mutants = _load("mutants")
    mutants.table("v1-fifth-uncharged", False)
    out = capsys.readouterr().out
    assert "real simulator keeps SAFE-BUDGET, mutated violates it" in out
    assert out.count("not for any n: sealed the same step among") == 2 and "PROVED FOR ANY n" not in out


def test_mutants_find_prints_a_witness_in_the_catalogues_form(capsys):
    mutants = _load("mutants")
    mutants.find("v1-drafts-past-fourth", 0, 200)
    out = capsys.readouterr().out
    assert "found in" in out and "at('v1-budget-without-reuse', block_size=" in out and "W((" in out


def test_search_turns_logs_each_opening_and_the_finding_query(capsys):
    """bench/search_turns.py, the log docs/benchmarks.md quotes for the openings' cost: every unit it opens gets
    a line, the query that finds the trace too, and the result is the search's own."""
    turns = _load("search_turns")
    turns.main([str(ROOT / "scenarios/check/vllm-chunked-off-wedge-ranges.toml"), "--timeout", "120",
                "--min-seconds", "0"])
    out = capsys.readouterr().out
    assert "open    1 slots" in out and "open    2 slots" in out
    assert any(" depth " in line and line.endswith("violated") for line in out.splitlines())
    assert "violated at depth 4" in out
    from checkers import bmc
    assert bmc._Search.open.__name__ == "open" and bmc._Deepening.deeper.__name__ == "deeper"   # unwrapped after


def test_junit_compare_puts_the_tests_in_a_fresh_process_apart(tmp_path, capsys, monkeypatch):
    """bench/junit_compare.py, the evidence for the fresh-context table in docs/benchmarks.md: a test whose body calls
    in_a_fresh_process is found in the source and grouped apart, and each group's sums and ratios are printed."""
    compare = _load("junit_compare")
    tests = [("tests.symbolic.test_review", "test_a_bug_planted_in_the_core_makes_the_proved_file_fail_to_prove"),
             ("tests.symbolic.test_bmc", "test_capped_search_finds_a_shortest_trace_of_the_whole_space"),
             ("tests.test_cli", "test_sglang_in_its_default_loop_runs_and_check_takes_it")]
    for name, seconds in (("before.xml", (10, 20, 4)), ("after.xml", (8, 10, 4))):
        cases = "".join(f'<testcase classname="{m}" name="{n}" time="{t}"/>' for (m, n), t in zip(tests, seconds))
        (tmp_path / name).write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    monkeypatch.setattr(sys, "argv", ["junit_compare.py", str(tmp_path / "before.xml"), str(tmp_path / "after.xml")])
    compare.main()
    out = capsys.readouterr().out
    assert "junit sums: 34 s before, 22 s after" in out
    assert "| deciding in a fresh process | 1 | 10 | 8 | 0.80 | 0.80 |" in out
    assert "| other solver tests (tests/symbolic/) | 1 | 20 | 10 | 0.50 | 0.50 |" in out
    assert "| the rest | 1 | 4 | 4 | 1.00 | 1.00 |" in out


def test_junit_sizes_buckets_the_tests_and_lists_the_slowest(tmp_path, capsys, monkeypatch):
    """bench/junit_sizes.py, the tables of docs/benchmarks.md's test-command durations: each test in its bucket by
    time, the shares of the sum, and the slowest first with its node id."""
    sizes = _load("junit_sizes")
    cases = "".join(f'<testcase classname="tests.symbolic.test_bmc" name="t{i}" time="{t}"/>'
                    for i, t in enumerate((0.5, 2, 2, 45.5)))
    (tmp_path / "junit.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    monkeypatch.setattr(sys, "argv", ["junit_sizes.py", str(tmp_path / "junit.xml"), "--slowest", "2"])
    sizes.main()
    out = capsys.readouterr().out
    assert "4 tests, 50 s of a worker in all" in out
    assert "| under 1 s | 1 | 0 | 1% |" in out and "| 1-5 s | 2 | 4 | 8% |" in out
    assert "| 5-15 s | 0 | 0 | 0% |" in out and "| 40 s and over | 1 | 46 | 91% |" in out
    assert out.index("`tests/symbolic/test_bmc.py::t3`") < out.index("| 2 | `tests/symbolic/test_bmc.py::t")
    assert out.count("`tests/symbolic/test_bmc.py::") == 2


def test_cpu_per_test_tells_a_test_that_waits_from_one_that_computes(tmp_path, capsys, monkeypatch):
    """bench/cpu_per_test.py, the plugin and its summary for docs/benchmarks.md: in a real pytest run, a test that
    sleeps is off a core for its time and one that spins is not."""
    plugin = _load("cpu_per_test")
    # 2 s asleep against 0.3 s of CPU: the one that computes stays less time off a core even beside 6 busy processes
    (tmp_path / "test_two.py").write_text("import time\n\ndef test_waits():\n    time.sleep(2.0)\n\n"
                                          "def test_computes():\n    t = time.process_time()\n"
                                          "    while time.process_time() - t < 0.3:\n        pass\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench"), "CPU_PER_TEST_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "cpu_per_test", "-p", "no:cacheprovider",
                           "test_two.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    [record] = tmp_path.glob("cpu_per_test.*.tsv")
    rows = {node.split("::")[1]: (wall, own + children) for node, wall, own, children in plugin.rows([str(record)])}
    assert rows["test_waits"][0] >= 2.0 and rows["test_waits"][1] < 0.5
    assert rows["test_computes"][1] >= 0.3
    monkeypatch.setattr(sys, "argv", ["cpu_per_test.py", str(record), "--top", "1"])
    plugin.main()
    out = capsys.readouterr().out
    assert out.startswith("2 tests: ") and " s not on a core (" in out     # the wall times vary with the load
    assert "`test_two.py::test_waits` |" in out
    assert "test_computes" not in out


def test_pyspy_split_counts_a_sample_under_the_search_as_the_searchs(tmp_path, capsys, monkeypatch):
    """bench/pyspy_split.py: a stack with Z3's check anywhere in it is the search's, a z3py leaf the wrappers'."""
    split = _load("pyspy_split")
    raw = tmp_path / "raw"
    raw.write_text("process 1:\"pytest\";search (checkers/bmc.py:10);check (z3/z3.py:7);"
                   "Z3_solver_check_assumptions (z3/z3core.py:4331) 7\n"
                   "process 1:\"pytest\";encode (model/symbolic/ops.py:3);And (z3/z3.py:1900) 2\n"
                   "process 1:\"pytest\";simulate (model/simulator.py:5) 1\n")
    assert split.split(str(raw)) == (10, {"Z3's search": 7, "z3py's wrappers": 2, "elsewhere": 1})
    monkeypatch.setattr(sys, "argv", ["pyspy_split.py", str(raw)])
    split.main()
    assert capsys.readouterr().out.splitlines() == ["10 samples", " 70.0%  Z3's search", " 20.0%  z3py's wrappers",
                                                    " 10.0%  elsewhere"]
