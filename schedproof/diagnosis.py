"""Why a run stopped making progress, and which changes remove it: derived from the trace.

Nothing here knows a bug by name. The diagnosis looks at the state in which progress stopped and
asks, for every request still owed an answer, which of the engine's limits it cannot meet:

- the step token budget, with chunked prefill off: its prompt (or, after a recompute preemption,
  its replay of prompt + generated tokens) is longer than one step may schedule, and a context
  only grows, so it can never be scheduled;
- the GPU pool as a whole: its context needs more pages than the pool has;
- the pages in use: it needs more pages than are free, and the rest are held by requests that
  do not advance either (or by the prefix cache);
- the step's accounting: a step ran more tokens than the budget (the scheduler charged fewer).

The requests that meet every limit but still do not run "wait behind" the blocked ones. The
changes are generated from the same numbers (the knob that binds, set to what the blocked
request needs; the pool at what the stuck requests need, or at every request's worst case
together) plus every on/off setting of the engine flipped, alone and in pairs, and each one is
re-checked by the caller's `recheck` (re-running the search with it applied). Only a change that
re-checks clean is suggested; the others are listed as tried.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Optional

from model.config import ConfigError, EngineConfig
from model.policy import POLICIES
from model.state import Phase, Request, State, StepRecord

CONTEXT_PHASES = (Phase.WAITING, Phase.PREEMPTED, Phase.PREFILLING)


@dataclasses.dataclass
class Blocker:
    rid: int
    limit: str          # "budget" | "pool" | "pages-held"
    sentence: str       # in the engine's terms, with the numbers
    need: int           # tokens (budget) or pages (pool, pages-held)


@dataclasses.dataclass
class Change:
    fields: dict        # scenario-file field -> value ("engine.chunked_prefill": True)
    why: str
    holds: Optional[bool] = None    # None: not re-checked (refused by the engine's validation)
    recheck: str = ""

    @property
    def text(self) -> str:
        return ", ".join(f"{k} = {_toml(v)}" for k, v in self.fields.items())

    def as_dict(self) -> dict:
        return {"change": dict(self.fields), "text": self.text, "why": self.why, "holds": self.holds,
                "recheck": self.recheck}


@dataclasses.dataclass
class Diagnosis:
    cause: str                          # one sentence
    mechanism: list[str]                # one line per blocked request (or the accounting fault)
    stall_step: Optional[int]           # the first step that changes nothing (or the fault's step)
    stuck: list[int]                    # the blocked requests
    waiting: list[int]                  # the others, unfinished, behind them
    changes: list[Change]               # re-checked and holding
    tried: list[Change]                 # re-checked and still failing, or refused

    def as_dict(self) -> dict:
        return {"cause": self.cause, "mechanism": self.mechanism, "stall_step": self.stall_step,
                "stuck": self.stuck, "waiting": self.waiting,
                "changes": [c.as_dict() for c in self.changes], "tried": [c.as_dict() for c in self.tried]}


# (the changed configuration, the scenario-file fields changed) -> (no property violated, what happened)
Recheck = Callable[[EngineConfig, dict], tuple[bool, str]]


def diagnose(cfg: EngineConfig, states: list[State], records: list[StepRecord], violations: list,
             recheck: Optional[Recheck] = None, max_rechecks: int = 40, account: Optional[str] = None) -> Diagnosis:
    """`violations`: the run's, each with `property`, `step`, `message` (the first is the headline).
    `account`: the model's message for the same failure of an engine, where it says more."""
    stall = _stall_step(violations)
    at = _state_at(states, stall)
    blockers = [b for r in at.requests if r.phase.unfinished for b in [_blocker(cfg, at, r)] if b is not None]
    stuck = [b.rid for b in blockers]
    waiting = [r.rid for r in at.requests if r.phase.unfinished and r.rid not in stuck]
    mechanism = [b.sentence for b in blockers[:3]]
    if len(blockers) > 3:
        mechanism.append(f"{_names([b.rid for b in blockers[3:]])} likewise")
    over = _over_budget(cfg, records)
    if over is not None:
        mechanism.insert(0, over)
    latch = POLICIES[cfg.policy].stall_reason(cfg, at)
    if latch is not None:
        mechanism.insert(0, latch)
    pressure = _pressure(states, records, stall)
    if pressure is not None:
        mechanism.append(pressure)
    cause = _cause(violations, stall, blockers, waiting, over, states[-1], at, latch, pressure, account)
    if account:
        mechanism.insert(0, f"the model, on the same actions: {account}")
    changes, tried = [], []
    if recheck is not None:
        singles, flips = _candidates(cfg, blockers, states[0], pressure is not None)
        singles[len(singles) - len(flips):len(singles) - len(flips)] = [      # the policy's own, before the flips
            Change(fields, why) for fields, why in POLICIES[cfg.policy].stall_changes(cfg, at)]
        for change in singles[:max_rechecks]:
            _recheck(cfg, change, recheck)
            (changes if change.holds else tried).append(change)
        # two settings together only where neither alone removes the failure (the smallest repair)
        alone = {next(iter(c.fields.items())) for c in changes if len(c.fields) == 1}
        for pair in itertools.combinations([f for f in flips if f not in alone], 2):
            if len(singles) + len(changes) + len(tried) >= 2 * max_rechecks:
                break
            change = Change(dict(pair), "the two settings together")
            _recheck(cfg, change, recheck)
            if change.holds:
                changes.append(change)
    return Diagnosis(cause, mechanism, stall, stuck, waiting, changes, tried)


# -- where progress stopped, and why each request cannot advance ---------------------------------------------

def _stall_step(violations: list) -> Optional[int]:
    for wanted in ("LIVE-NO-PROGRESS", "LIVE-LIVELOCK", "ENGINE-ERROR"):
        steps = [v.step for v in violations if v.property == wanted]
        if steps:
            return min(steps)
    return min((v.step for v in violations), default=None)


def _state_at(states: list[State], step: Optional[int]) -> State:
    """The state the stalled step starts from (states[k] precedes step k)."""
    if step is None or step >= len(states):
        return states[-1]
    return states[step]


def _blocker(cfg: EngineConfig, s: State, r: Request) -> Optional[Blocker]:
    policy = POLICIES[cfg.policy]
    budget, knob = policy.step_token_budget(cfg)
    if not cfg.chunked_prefill and r.phase in CONTEXT_PHASES and r.remaining_context > budget:
        what = (f"replay of {r.prompt} + {r.generated} = {r.context_len} tokens" if r.generated
                else f"prompt of {r.prompt} tokens")
        return Blocker(r.rid, "budget", f"r{r.rid}'s {what} exceeds {knob} {budget} and chunked prefill is "
                                        f"off, so r{r.rid} can never be scheduled (a context only grows)",
                       r.context_len)
    tokens = r.context_len if r.phase != Phase.DECODING else r.computed + 1
    pages = cfg.blocks_for(tokens)
    if pages > cfg.num_blocks:
        return Blocker(r.rid, "pool", f"r{r.rid}'s context of {tokens} tokens needs {pages} pages of "
                                      f"{cfg.block_size} tokens, more than the whole GPU pool of {cfg.num_blocks} "
                                      f"pages{'' if cfg.host_blocks else ' (and there is no host tier)'}", pages)
    if not r.started and r.phase != Phase.OFFLOADED and not r.suspended:
        missing = pages
    else:
        missing = max(0, pages - r.blocks - r.shared_blocks)
    if missing > s.free_blocks + s.cached_blocks:     # cached blocks are evicted for a new allocation
        holders = [q for q in s.requests if q.blocks and q.rid != r.rid]
        held = ", ".join(f"r{q.rid} ({q.blocks}{', suspended' if q.suspended else ''})" for q in holders[:8])
        more = f" and {len(holders) - 8} more" if len(holders) > 8 else ""
        parts = []
        if held:
            parts.append(f"held by {held}{more}")
        if s.cached_blocks:
            parts.append(f"{s.cached_blocks} by the prefix cache")
        if r.blocks:
            parts.append(f"{r.blocks} by r{r.rid} itself")
        where = "; ".join(parts) or "in use"
        return Blocker(r.rid, "pages-held", f"r{r.rid} needs {missing} more page{'s' if missing != 1 else ''} "
                                            f"and {s.free_blocks} of the {cfg.num_blocks} are free (the rest: "
                                            f"{where}), and nothing frees one", missing - s.free_blocks)
    return None


def _pressure(states: list[State], records: list[StepRecord], stall: Optional[int]) -> Optional[str]:
    """The pool ran out on the way to the stall: the requests preempted or offloaded before it."""
    hit = [(rec.step, rid, "preempted" if rid in rec.preempted else "suspended/offloaded")
           for rec in records if stall is None or rec.step < stall for rid in rec.preempted + rec.offloaded]
    if not hit:
        return None
    step, rid, how = hit[0]
    more = len({r for _, r, _ in hit}) - 1
    return (f"on the way there the pool ran out: r{rid} was {how} at step {step}"
            + (f" (and {more} other request{'s' if more != 1 else ''} later)" if more else ""))


def _over_budget(cfg: EngineConfig, records: list[StepRecord]) -> Optional[str]:
    for rec in records:
        if rec.num_tokens > cfg.max_num_tokens:
            return (f"step {rec.step} runs {rec.num_tokens} tokens against max_num_tokens {cfg.max_num_tokens}: "
                    f"the scheduler charged only {rec.charged} of them to the budget")
    return None


def _cause(violations, stall, blockers, waiting, over, final: State, at: State, latch: Optional[str],
           pressure: Optional[str], account: Optional[str]) -> str:
    if not violations:
        return "no property is violated"
    head = violations[0]
    when = ""
    if over is not None:
        text = over[0].upper() + over[1:]
    elif latch is not None:
        text = latch + (f"; {pressure}" if pressure else "")
        if stall is not None:
            when = f"No progress from step {stall}: "
    elif blockers:
        lead = blockers[0]
        text = lead.sentence
        same = [b.rid for b in blockers[1:] if b.limit == lead.limit]
        other = [b.rid for b in blockers[1:] if b.limit != lead.limit]
        if same:
            text += f"; {_names(same)} {'is' if len(same) == 1 else 'are'} blocked likewise"
        if other:
            text += f"; {_names(other)} wait for pages that others hold"
        suspended = [rid for rid in waiting if at.req(rid).suspended]
        behind = [rid for rid in waiting if rid not in suspended]
        if suspended:
            text += f"; {_names(suspended)} stay suspended, holding their pages"
        if behind:
            text += f"; {_count(behind)} ({_names(behind)}) wait behind {'it' if len(blockers) == 1 else 'them'}"
        if stall is not None:
            no_progress = any(v.property == "LIVE-NO-PROGRESS" for v in violations)
            when = f"No progress from step {stall}: " if no_progress else f"At step {stall}: "
    else:       # no limit explains it: the property's own words (the model's, where it says more), at its step
        text = head.message if account is None else f"{account} (the engine: {head.message})"
        when = f"At step {head.step} ({head.property}): "
    tail = ""
    if final.error and final.error not in text:
        tail = f"; the engine then raises: {_first_sentence(final.error)}"
    return when + text + tail + "."


def _first_sentence(text: str) -> str:
    head = text.split(". ")[0].rstrip(".")
    return head if len(head) <= 160 else head[:157] + "..."


def _names(rids: list[int]) -> str:
    rids = sorted(rids)
    if len(rids) > 2 and rids == list(range(rids[0], rids[-1] + 1)):
        return f"r{rids[0]}-r{rids[-1]}"
    return ", ".join(f"r{i}" for i in rids)


def _count(rids: list[int]) -> str:
    return "1 other" if len(rids) == 1 else f"{len(rids)} others"


# -- the changes, each re-checked --------------------------------------------------------------------------------

def _candidates(cfg: EngineConfig, blockers: list[Blocker], initial: State,
                pressure: bool) -> tuple[list[Change], list]:
    """The single changes (knob values from the blockers' numbers, then each setting flipped) and
    the flips, for the caller to pair."""
    out: list[Change] = []
    policy = POLICIES[cfg.policy]
    budget, knob = policy.step_token_budget(cfg)
    budget_need = [b for b in blockers if b.limit == "budget"]
    if budget_need:
        need = max(b.need for b in budget_need)
        worst = max(r.prompt + r.max_new - 1 for r in initial.requests)
        for value, why in ((need, f"the blocked replay needs {need} tokens in one step"),
                           (worst, f"every request's longest replay (prompt + max_new - 1) is at most {worst}")):
            fields = {f"engine.{knob}": value}
            if knob != "max_num_tokens" and cfg.max_num_tokens < value:
                fields["engine.max_num_tokens"] = value
            if value > budget and fields not in [c.fields for c in out]:
                out.append(Change(fields, why))
    pool_need = [b for b in blockers if b.limit in ("pool", "pages-held")]
    if pool_need or pressure:
        worst_pages = [cfg.blocks_for(r.prompt + r.max_new) for r in initial.requests]
        tight = cfg.num_blocks + max((b.need if b.limit == "pages-held" else b.need - cfg.num_blocks
                                      for b in pool_need), default=0)
        everyone = sum(worst_pages) + (cfg.num_blocks - _usable(cfg))
        for value, why in ((tight, "the pages the stuck request lacks"),
                           (everyone, "every request's worst case (prompt + max_new) at once, so none is "
                                      "preempted")):
            if value > cfg.num_blocks and {"engine.num_blocks": value} not in [c.fields for c in out]:
                out.append(Change({"engine.num_blocks": value}, f"a GPU pool of {value} pages: {why}"))
        per_request = max(worst_pages)
        fit = max(1, _usable(cfg) // per_request)
        if fit < cfg.max_batch_size:
            out.append(Change({"engine.max_batch_size": fit},
                              f"at most {fit} request{'s' if fit != 1 else ''} at once, each worst case ({per_request} pages) held together"))
    flips = _flips(cfg)
    out.extend(Change(dict([f]), f"turn {f[0].split('.')[-1]} {'on' if f[1] else 'off'}") for f in flips)
    return out, flips


def _usable(cfg: EngineConfig) -> int:
    return cfg.num_blocks - POLICIES[cfg.policy].reserved_blocks


def _flips(cfg: EngineConfig) -> list[tuple[str, bool]]:
    """Every on/off setting of the design, flipped: the generic settings, then the policy's options."""
    out = [("engine.chunked_prefill", not cfg.chunked_prefill)]
    if cfg.options is not None:
        for f in dataclasses.fields(cfg.options):
            value = getattr(cfg.options, f.name)
            if isinstance(value, bool):
                out.append((f"engine.options.{f.name}", not value))
    return out


def apply(cfg: EngineConfig, fields: dict) -> EngineConfig:
    """The configuration with the scenario-file fields set; ConfigError where the engine refuses it."""
    top, opts = {}, {}
    for key, value in fields.items():
        name = key.removeprefix("engine.")
        if name.startswith("options."):
            opts[name.removeprefix("options.")] = value
        else:
            top[name] = value
    options = dataclasses.replace(cfg.options, **opts) if opts else cfg.options
    new = dataclasses.replace(cfg, options=options, **top)
    POLICIES[new.policy].check_config(new)
    return new


def _recheck(cfg: EngineConfig, change: Change, recheck: Recheck) -> None:
    try:
        new = apply(cfg, change.fields)
    except ConfigError as exc:
        change.holds, change.recheck = None, f"refused by the engine: {exc.field}: {exc.reason}"
        return
    ok, text = recheck(new, change.fields)
    change.holds, change.recheck = ok, text


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
