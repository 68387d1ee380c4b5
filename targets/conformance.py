"""Conformance of the `hf_cb` model to the real transformers engine, step by step.

`first_divergence(cfg, actions)` drives `ReferenceTarget` (the model) and `TransformersTarget` (the
engine) with the same actions and compares, after every step, what both expose: the scheduled list,
per request phase / computed / generated / blocks held (own + shared), free blocks, cached blocks and
the error (presence and kind). `random_actions` draws workloads the engine accepts; `main` runs many:

    python -m targets.conformance --workloads 1000 --seed 0 [--jobs 2]

and prints the agreement rate and, per distinct divergence kind, one minimal (shrunk) example.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random
import sys
import time
from typing import Optional, Sequence

from model.config import EngineConfig
from model.state import State

from .protocol import Action, Add, Cancel, Observation, Step, Target, TargetHung
from .reference import ReferenceTarget

QUIET_STEPS = 4          # stop once only Steps remain and neither side changed for this many steps
MAX_TRAILING_STEPS = 400


def run(target_cls: type, cfg: EngineConfig, actions: Sequence[Action], step_timeout_s: float = 10.0) -> list[Observation]:
    """Drive one target through the actions; one observation per Step."""
    target: Target = target_cls(cfg, step_timeout_s)
    try:
        out = []
        for a in actions:
            obs = target.apply(a)
            if obs is not None:
                out.append(obs)
        return out
    finally:
        target.close()


@dataclasses.dataclass
class Divergence:
    step: int
    field: str
    model_value: object
    engine_value: object
    model_state: Optional[State] = None
    engine_state: Optional[State] = None
    actions: tuple = ()

    @property
    def kind(self) -> str:
        """The divergence class used to group findings: the field, and for phases the phase pair."""
        if self.field.endswith(".phase"):
            return f"phase {self.model_value} (model) vs {self.engine_value} (engine)"
        if self.field.startswith("r") and "." in self.field:
            return "request " + self.field.split(".", 1)[1]
        return self.field

    def __str__(self) -> str:
        lines = [f"step {self.step}: {self.field}: model {self.model_value!r} != engine {self.engine_value!r}"]
        if self.model_state is not None and self.engine_state is not None:
            lines.append(f"  model : {describe(self.model_state)}")
            lines.append(f"  engine: {describe(self.engine_state)}")
        return "\n".join(lines)


def describe(s: State) -> str:
    reqs = " ".join(f"r{r.rid}:{r.phase.name[:4]}(c{r.computed},g{r.generated},b{r.blocks + r.shared_blocks})"
                    for r in s.requests)
    return f"free={s.free_blocks} cached={cached(s)} {reqs}" + (f" error={s.error!r}" if s.error else "")


def cached(s: State) -> int:
    """Blocks referenced by no request but kept for their content: the anonymous entry, plus the group prefix
    blocks whose reference count is 0 where the model keeps them (`Sched.slots` of hf_cb)."""
    if hasattr(s.sched, "cached_blocks"):    # the engine's own count (targets/transformers_cb.EngineView)
        return s.sched.cached_blocks
    slots = getattr(s.sched, "slots", None)
    if slots is None:
        return sum(e.blocks for e in s.prefix_cache if e.refs == 0)
    return (sum(e.blocks for e in s.prefix_cache if e.group == -1)
            + sum(1 for _, refs in slots for x in refs if x == 0))


def compare(m: Observation, e: Observation) -> Optional[tuple[str, object, object]]:
    """The first field (in a fixed order) on which the two observations differ."""
    if m.record.scheduled != e.record.scheduled:
        return "scheduled", m.record.scheduled, e.record.scheduled
    if (m.record.error is None) != (e.record.error is None) or m.record.error_kind != e.record.error_kind:
        return "error", (m.record.error_kind, m.record.error), (e.record.error_kind, e.record.error)
    for rm, re_ in zip(m.state.requests, e.state.requests):
        if rm.phase != re_.phase:
            return f"r{rm.rid}.phase", rm.phase.name, re_.phase.name
    for rm, re_ in zip(m.state.requests, e.state.requests):
        for f in ("computed", "generated"):
            if getattr(rm, f) != getattr(re_, f):
                return f"r{rm.rid}.{f}", getattr(rm, f), getattr(re_, f)
        if rm.blocks + rm.shared_blocks != re_.blocks + re_.shared_blocks:
            return f"r{rm.rid}.blocks", rm.blocks + rm.shared_blocks, re_.blocks + re_.shared_blocks
    if m.state.free_blocks != e.state.free_blocks:
        return "free_blocks", m.state.free_blocks, e.state.free_blocks
    if cached(m.state) != cached(e.state):
        return "cached_blocks", cached(m.state), cached(e.state)
    return None


def first_divergence(cfg: EngineConfig, actions: Sequence[Action], step_timeout_s: float = 10.0,
                     engine_cls: Optional[type] = None) -> Optional[Divergence]:
    if engine_cls is None:
        from .transformers_cb import TransformersTarget as engine_cls
    model, engine = ReferenceTarget(cfg), engine_cls(cfg, step_timeout_s)
    try:
        last_step = max((i for i, a in enumerate(actions) if not isinstance(a, Step)), default=-1)
        quiet, prev = 0, None
        for i, a in enumerate(actions):
            mo, eo = model.apply(a), engine.apply(a) if not isinstance(a, Step) else None
            if not isinstance(a, Step):
                continue
            try:
                eo = engine.step()
            except TargetHung as exc:
                return Divergence(mo.record.step, "hung", None, str(exc), mo.state, None, tuple(actions))
            diff = compare(mo, eo)
            if diff is not None:
                return Divergence(mo.record.step, *diff, mo.state, eo.state, tuple(actions))
            if i > last_step:   # only Steps remain: stop once both sides are done or stuck
                key = (mo.state.key(), eo.state.requests, eo.state.free_blocks)
                if all(r.phase.terminal for r in mo.state.requests) or mo.state.error is not None:
                    break
                quiet = quiet + 1 if key == prev else 0
                prev = key
                if quiet >= QUIET_STEPS:
                    break
        return None
    finally:
        engine.close()


# -- random workloads ------------------------------------------------------------------------

def random_config(rng: random.Random) -> EngineConfig:
    from model.policies.hf_cb import Options

    margin = rng.choice([None, None, None, 0.0, 0.1, 0.3])
    return EngineConfig(policy="hf_cb", block_size=rng.randint(4, 8), num_blocks=rng.randint(2, 24),
                        max_num_tokens=rng.randint(4, 64), max_batch_size=rng.randint(1, 8),
                        chunked_prefill=True,
                        options=Options(scheduler_type=rng.choice(["fifo", "prefill_first"]),
                                        safety_margin=margin, allow_block_sharing=rng.random() < 0.5))


def random_actions(rng: random.Random, cfg: Optional[EngineConfig] = None, max_requests: int = 6,
                   max_new: int = 16, shared_prefixes: bool = True) -> tuple[EngineConfig, list[Action]]:
    """A random configuration (unless given) and action list within what the engine accepts:
    page_size >= 4, chunked prefill, no CPU tier; prompts 1..capacity+4 tokens, max_new 1..16, some
    requests sharing a group prefix, cancellations at random times, trailing Steps to let it run out."""
    cfg = cfg or random_config(rng)
    capacity = cfg.num_blocks * cfg.block_size
    n = rng.randint(1, max_requests)
    actions: list[Action] = []
    rid = 0
    live: list[int] = []
    steps_budget = 0
    while rid < n or (live and rng.random() < 0.2):
        if rid < n and (rid == 0 or rng.random() < 0.5):
            big = rng.random() < 0.25
            prompt = rng.randint(1, capacity + 4) if big else rng.randint(1, min(capacity + 4, 24))
            group, plen = -1, 0
            if shared_prefixes and rng.random() < 0.4:
                group = rng.randint(0, 1)
                plen = rng.randint(1, prompt)
            actions.append(Add(rid, prompt, rng.randint(1, max_new), group, plen))
            live.append(rid)
            steps_budget += prompt + max_new
            rid += 1
        elif live and rng.random() < 0.15:
            actions.append(Cancel(live.pop(rng.randrange(len(live)))))
        else:
            for _ in range(rng.randint(1, 4)):
                actions.append(Step())
    actions.extend([Step()] * min(MAX_TRAILING_STEPS, 3 * steps_budget + 20))
    return cfg, actions


def workload(seed: int, index: int, prefixes: bool = True) -> tuple[EngineConfig, list[Action]]:
    """Workload `index` of a seeded series; prefixes=False drops every shared prefix (same draws)."""
    cfg, actions = random_actions(random.Random(f"{seed}:{index}"))
    if not prefixes:
        actions = [dataclasses.replace(a, prefix_group=-1, prefix_len=0) if isinstance(a, Add) else a
                   for a in actions]
    return cfg, actions


def identical_contexts(cfg: EngineConfig, actions: Sequence[Action]) -> bool:
    """Block sharing is on and two requests of one group have the same whole prompt (all of it the shared
    prefix): greedy decoding gives them the same output tokens, whose blocks the engine de-duplicates too."""
    seen = set()
    for a in actions:
        if isinstance(a, Add) and a.prefix_group >= 0 and a.prefix_len >= a.prompt:
            key = (a.prefix_group, a.prompt)
            if key in seen:
                return bool(cfg.options.allow_block_sharing)
            seen.add(key)
    return False


# The divergences docs/conformance.md lists, each with a predicate on the workload that exhibits it.
KNOWN = {
    "HF-IDENTICAL-CONTEXT-DEDUP": (
        "the engine de-duplicates every identical full block, output blocks of requests with one whole prompt "
        "included (cache_allocator.py:290-311); the model shares only the group prefix "
        "(model/policies/hf_cb.py 'Known divergences')", identical_contexts),
}


def known_divergence(cfg: EngineConfig, actions: Sequence[Action], d: Divergence) -> Optional[str]:
    """The id of the documented divergence that explains `d`, or None."""
    for key, (_, applies) in KNOWN.items():
        if applies(cfg, actions):
            return key
    return None


# -- shrinking ---------------------------------------------------------------------------------

def _drop_add(actions: list[Action], rid: int) -> list[Action]:
    out: list[Action] = []
    for a in actions:
        if isinstance(a, Add):
            if a.rid == rid:
                continue
            out.append(dataclasses.replace(a, rid=a.rid - 1) if a.rid > rid else a)
        elif isinstance(a, Cancel):
            if a.rid == rid:
                continue
            out.append(Cancel(a.rid - 1) if a.rid > rid else a)
        else:
            out.append(a)
    return out


def shrink(cfg: EngineConfig, actions: list[Action], kind: str, budget: int = 60) -> tuple[list[Action], Divergence]:
    """Greedy shrink keeping the divergence kind: drop requests, cancels and steps, shrink lengths,
    then cut the action list right after the divergent step."""
    d = first_divergence(cfg, actions)
    assert d is not None and d.kind == kind
    tries = 0

    def attempt(cand: list[Action]) -> Optional[Divergence]:
        nonlocal tries
        tries += 1
        try:
            dd = first_divergence(cfg, cand)
        except Exception:   # noqa: BLE001 - a candidate the engine refuses is just not smaller
            return None
        return dd if dd is not None and dd.kind == kind else None

    actions = _cut(actions, d.step)
    changed = True
    while changed and tries < budget:
        changed = False
        rids = [a.rid for a in actions if isinstance(a, Add)]
        cands: list[list[Action]] = [_drop_add(actions, r) for r in reversed(rids)]
        cands += [actions[:i] + actions[i + 1:] for i, a in enumerate(actions) if not isinstance(a, Add)]
        for i, a in enumerate(actions):
            if isinstance(a, Add):
                for f, lo in (("prompt", 1), ("max_new", 1), ("prefix_len", 0)):
                    v = getattr(a, f)
                    for nv in sorted({lo, v // 2, v - 1}):
                        if lo <= nv < v:
                            cands.append(actions[:i] + [dataclasses.replace(a, **{f: nv})] + actions[i + 1:])
        for c in cands:
            if tries >= budget:
                break
            dd = attempt(c)
            if dd is not None:
                actions, d, changed = _cut(c, dd.step), dd, True
                break
    return actions, d


def _cut(actions: list[Action], step: int) -> list[Action]:
    n = 0
    for i, a in enumerate(actions):
        if isinstance(a, Step):
            if n == step:
                return list(actions[:i + 1])
            n += 1
    return list(actions)


def as_code(cfg: EngineConfig, actions: Sequence[Action]) -> str:
    o = cfg.options
    head = (f"cfg: block_size={cfg.block_size} num_blocks={cfg.num_blocks} max_num_tokens={cfg.max_num_tokens} "
            f"max_batch_size={cfg.max_batch_size} scheduler_type={o.scheduler_type} safety_margin={o.safety_margin} "
            f"allow_block_sharing={o.allow_block_sharing}")
    parts, steps = [], 0
    for a in list(actions) + [None]:
        if isinstance(a, Step):
            steps += 1
            continue
        if steps:
            parts.append(f"Step()*{steps}" if steps > 1 else "Step()")
            steps = 0
        if a is not None:
            parts.append(repr(a))
    return head + "\nactions: [" + ", ".join(parts) + "]"


# -- the command ---------------------------------------------------------------------------------

def _one(args: tuple[int, int, bool]) -> tuple[int, Optional[str], Optional[str]]:
    seed, i, prefixes = args
    cfg, actions = workload(seed, i, prefixes)
    try:
        d = first_divergence(cfg, actions)
    except Exception as exc:   # noqa: BLE001 - reported as its own kind
        return i, f"exception {type(exc).__name__}", str(exc)
    return i, (d.kind if d else None), (str(d) if d else None)


def _known_id(cfg, actions, kind) -> str:
    if kind.startswith("exception"):
        return ""
    return known_divergence(cfg, actions, Divergence(0, kind, None, None)) or ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m targets.conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--no-prefixes", action="store_true", help="drop every shared prefix from the workloads")
    args = p.parse_args(argv)
    t0 = time.time()
    prefixes = not args.no_prefixes
    jobs = [(args.seed, i, prefixes) for i in range(args.workloads)]
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = list(pool.imap_unordered(_one, jobs, chunksize=4))
    else:
        results = [_one(j) for j in jobs]
    results.sort()
    kinds: dict[str, list[int]] = collections.defaultdict(list)
    explained: dict[str, int] = collections.Counter()
    for i, kind, _ in results:
        if kind is not None:
            kinds[kind].append(i)
            cfg, actions = workload(args.seed, i, prefixes)
            explained[_known_id(cfg, actions, kind)] += 1
    agree = sum(1 for _, k, _ in results if k is None)
    print(f"seed {args.seed}: {agree}/{len(results)} workloads agree step by step "
          f"({100.0 * agree / max(1, len(results)):.1f}%) in {time.time() - t0:.0f} s")
    for key, count in sorted(explained.items(), key=lambda kv: -kv[1]):
        print(f"  {count} divergent workload(s) {'explained by ' + key if key else 'NOT explained by a known divergence'}")
    for kind, idx in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"\n== {kind}: {len(idx)} workload(s), e.g. #{', #'.join(map(str, idx[:8]))}")
        cfg, actions = workload(args.seed, min(idx, key=lambda j: len(workload(args.seed, j, prefixes)[1])), prefixes)
        if kind.startswith("exception"):
            print(next(m for i, k, m in results if k == kind))
            continue
        if not args.no_shrink:
            actions, d = shrink(cfg, actions, kind)
        else:
            d = first_divergence(cfg, actions)
        print(as_code(cfg, actions))
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
