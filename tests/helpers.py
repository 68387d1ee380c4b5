"""Small builders for hand-made states and traces, shared by the tests."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os

import pytest

import model.policies  # noqa: F401  (registers every policy)
from model.config import EngineConfig
from model.policy import POLICIES, Env
from model.simulator import RequestSpec, Trace, Workload, initial_state, simulate
from model.state import Phase, Request, State


def config(policy: str, **kw) -> EngineConfig:
    options = kw.pop("options", {})
    opts = POLICIES[policy].Options(**options)
    base = dict(policy=policy, block_size=4, num_blocks=16, max_num_tokens=64, max_batch_size=8)
    base.update(kw)
    return EngineConfig(options=opts, **base)


def req(rid: int, prompt: int, max_new: int, phase: Phase = Phase.WAITING, **kw) -> Request:
    return Request(rid=rid, prompt=prompt, max_new=max_new, arrival=kw.pop("arrival", 0), phase=phase, **kw)


def decoding(rid: int, prompt: int, max_new: int, generated: int, block_size: int, **kw) -> Request:
    """A request in its decode phase, holding exactly the pages its KV needs."""
    computed = prompt + generated - 1
    blocks = kw.pop("blocks", -(-computed // block_size))
    return req(rid, prompt, max_new, Phase.DECODING, computed=computed, generated=generated, blocks=blocks, **kw)


def state(cfg: EngineConfig, *requests: Request, sched=None, step: int = 1) -> State:
    held = sum(r.blocks for r in requests)
    host = sum(r.host_blocks for r in requests)
    policy = POLICIES[cfg.policy]
    return State(step=step, requests=tuple(requests), free_blocks=cfg.num_blocks - held,
                 free_host_blocks=cfg.host_blocks - host,
                 sched=policy.initial_sched(cfg) if sched is None else sched)


def step(cfg: EngineConfig, s: State, env: Env = Env()):
    return POLICIES[cfg.policy].step(cfg, s, env)


def run(cfg: EngineConfig, *specs: RequestSpec, max_steps: int = 100_000) -> Trace:
    return simulate(cfg, Workload(tuple(specs)), max_steps=max_steps)


def phases(s: State) -> list[str]:
    return [r.phase.name for r in s.requests]


# heavy solver sizes run in the nightly profile only (SCHEDPROOF_PROFILE=nightly; tests/conftest.py)
NIGHTLY = os.environ.get("SCHEDPROOF_PROFILE", "ci") == "nightly"
nightly = pytest.mark.skipif(not NIGHTLY, reason="a heavy solver size: SCHEDPROOF_PROFILE=nightly")


def sized(ci, nightly):
    """A test's size by profile: `ci` in the default run (the README's test command, which must fit its time),
    `nightly` with SCHEDPROOF_PROFILE=nightly. The same assertions run at both sizes; only how much is searched
    (a budget, a depth, a count) differs."""
    return nightly if NIGHTLY else ci


def in_a_fresh_process(fn, *args):
    """`fn(*args)` in a new interpreter (spawned), for a test whose outcome rests on a budget of the checkers'
    clock: a verdict is a function of the file and the budget only in a fresh process. In a test worker that has
    run other solver tests, Z3's shared context holds their terms, the same queries are numbered and ordered
    differently, and the work they take (the clock) differs: the planted-bug review proved its partial claim with
    90 s alone and not after other tests in CI (2026-12-06). `fn` must be a module-level function and its result
    picklable."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def point_search(path: str, depth: int, budget: float) -> tuple:
    """The search of a scenario's design as a point (the environment fixed as the simulator has it), for
    tests/symbolic/test_check_scenarios.py to run `in_a_fresh_process`: (status, reason, depth, the trace's property
    or None, whether the trace replays). Here, not in that module, because a fresh process imports the function's
    module, and that one simulates every scenario as it is imported, to parametrize (2.8 s to import it, 0.2 s for
    what the search needs)."""
    import model.symbolic.cores  # noqa: F401  (registers every core)
    from checkers.bmc import search
    from checkers.replay import replay
    from model.symbolic.core import CORES
    from schedproof.checkspec import load_check
    from schedproof.scenario import load

    sc, spec = load(path), load_check(path)
    space = dataclasses.replace(spec.space, early_stops=False, cancellations=False)
    result = search(CORES[sc.cfg.policy], space, depth, timeout=budget)
    if result.cex is None:
        return result.status, result.reason, result.depth, None, None
    return result.status, result.reason, result.depth, result.cex.property, replay(result.cex).ok


def not_proved(parts) -> list:
    """The (action, name) of each part of a one-request argument (checkers/parametric/local*.py) not proved."""
    return [(action, name) for action, name, status, _, _ in parts if status != "proved"]


replace = dataclasses.replace
__all__ = ["config", "req", "decoding", "state", "step", "run", "phases", "replace", "RequestSpec", "Phase",
           "Env", "Workload", "initial_state", "not_proved", "nightly", "NIGHTLY", "sized",
           "in_a_fresh_process"]
