"""Random (configuration, workload) cases per policy core, for the one differential harness
(tests/symbolic/test_core_differential.py) that holds every core to its engine-checked policy.

Each module `cases/<policy>.py` gives:
- `random_case(seed) -> (cfg, workload)`: a case inside the core's subset (the harness asserts the
  core accepts it), drawn so that every mechanism of the policy shows up in `DIFF_RUNS` seeds;
- `coverage(trace, seen)` and `MUST_SEE`: what the simulator runs of those seeds must exercise (so a
  generator that drifts away from a mechanism fails instead of passing vacuously);
- `structures()`: (id, template) pairs, one relation per structure (options and chunking are
  concrete in a relation; the numeric knobs are symbolic), and `structure_case(template, rng)`: a
  case with that structure; `RELATION_RUNS` per structure over `SLOTS` request slots;
- `relation(template, n)`: the compiled relation for a structure (a core with numeric options
  makes them symbolic too);
- `MAX_STEPS`: the step limit of a run (a run that livelocks grows forever).
"""

import dataclasses
import importlib
import random

POLICIES = ("trtllm_v2", "trtllm_v1", "vllm_v1", "hf_cb", "sglang")
CASES = {p: importlib.import_module(f"cases.{p}") for p in POLICIES}

# Bundled scenarios whose design is outside their core's subset, each with the field the core refuses first:
# SGLang's radix cache on, whose tree is not expressed symbolically (docs/symbolic.md). Every other scenario is
# inside.
SCENARIOS_OUTSIDE_THE_CORE = {"sglang-page-rounding-stall-default-cache": "engine.options.disable_radix_cache",
                              "sglang-page-rounding-nine-pages": "engine.options.disable_radix_cache",
                              "sglang-priority-memory-short": "engine.options.disable_radix_cache"}


def long_case(policy: str, count: int, seed: int, draw=None):
    """A random case's design with the batch cap, pool and budget grown, and the requests of consecutive
    random cases until there are `count`; None where the design's own checks or the core refuse it. `draw`
    (default: the policy's `random_case`) draws a case from a seed (test_core_vllm_async.py: in async mode)."""
    from model.simulator import Workload
    from model.symbolic.core import CORES
    from model.symbolic.slots import Params
    draw = draw or CASES[policy].random_case
    rng = random.Random(seed)
    cfg, workload = draw(seed * 97)
    reqs, k = list(workload.requests), 1
    while len(reqs) < count:
        reqs += draw(seed * 97 + k)[1].requests
        k += 1
    try:
        cfg = dataclasses.replace(cfg, max_batch_size=max(cfg.max_batch_size, rng.randint(8, 17)),
                                  num_blocks=cfg.num_blocks * rng.randint(2, count),
                                  max_num_tokens=cfg.max_num_tokens * rng.randint(2, count))
    except ValueError:
        return None
    workload = Workload(tuple(reqs[:count]))
    return None if CORES[policy].unsupported(cfg, Params.of(workload)) else (cfg, workload)


def relation_runs(checker, draw, runs: int, cross_checked: int, max_steps: int = 200):
    """The simulator traces of `runs` cases drawn by `draw()`, each asserted accepted by the compiled relation
    `checker` step by step, and the first `cross_checked` of them also asserted to agree with Z3's own simplifier
    (the relation tests of every core test file)."""
    from model.simulator import simulate
    for run in range(runs):
        cfg, workload = draw()
        trace = simulate(cfg, workload, max_steps=max_steps)
        if run < cross_checked:
            assert checker.agrees_with_z3_simplifier(cfg, workload, trace), f"run {run}\n  {cfg}\n  {workload}"
        why = checker.rejects(cfg, workload, trace)
        assert why is None, f"run {run}: {why}\n  {cfg}\n  {workload}"
        yield trace


def widest_long_run(policy: str, count: int, wanted: int, draw=None) -> int:
    """`wanted` long cases of `count` requests (`long_case`), each asserted to agree field for field with the
    simulator (checkers.differential.diverges); the most requests one step of them scheduled, so a caller can
    assert the cases were not vacuous. Fails too when the cases are refused 20 times as often as wanted."""
    from checkers.differential import diverges
    from model.simulator import simulate
    max_steps = CASES[policy].MAX_STEPS
    agreed, seed, widest = 0, 0, 0
    while agreed < wanted:
        case = long_case(policy, count, seed, draw)
        seed += 1
        assert seed < 20 * wanted, "the long cases are refused"
        if case is None:
            continue
        cfg, workload = case
        d = diverges(cfg, workload, max_steps=max_steps)
        assert d is None, f"{policy} long case {seed - 1}: {d}\n  {cfg}\n  {workload}"
        widest = max([widest] + [len(r.scheduled) for r in simulate(cfg, workload, max_steps).records])
        agreed += 1
    return widest
