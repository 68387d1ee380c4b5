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
