"""Hypothesis stateful testing of a target: a `RuleBasedStateMachine` per target.

The engine configuration is drawn in `@initialize`; the rules are what a user of the engine can
do at any time (submit a request of any length, with or without a shared prefix; cancel any
request; let the engine step) and, where the target picks the sampled tokens (`early_stops`: vLLM's
scheduler runs with no model), what the model's outputs decide (end a request early: `Stop`); after
every step the property registry's checks and the greedy output oracle run through `StepChecker`. A failure raises `PropertyFailure`, Hypothesis shrinks
the action list, and the last (minimal) failing run is kept in `LAST_FAILURE` for the report.

Prompts may be empty (a user can submit one; the engine accepts it). What a user can do but this machine
does not: on transformers, early stops (EOS) cannot be chosen on a random-weights model, so outputs run
to `max_new`; several return sequences per request
(`num_return_sequences`) are not modelled by the hf_cb policy.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

import model.policies  # noqa: F401
from model.config import EngineConfig
from model.policies import hf_cb, sglang, vllm_v1
from model.policy import POLICIES, refusal
from properties.registry import Violation

from .checking import StepChecker
from .protocol import Action, Add, Cancel, Step, Stop, TargetHung


class PropertyFailure(AssertionError):
    def __init__(self, violation: Violation):
        super().__init__(f"[{violation.property}] step {violation.step}: {violation.message}")
        self.violation = violation


_FAILURE_TYPES: dict[str, type] = {}


def failure_type(violation: Violation, kind: Optional[str]) -> type:
    """One exception type per (property, error kind): Hypothesis tells failures apart by type and
    place, so a shrink cannot slip from one finding to another (say, from the fatal cache error to
    the empty-prompt crash, both ENGINE-ERROR)."""
    key = violation.property + (f"/{kind}" if kind else "")
    name = "".join(part.capitalize() for part in key.replace("/", "-").split("-")) + "Failure"
    return _FAILURE_TYPES.setdefault(key, type(name, (PropertyFailure,), {}))


@dataclasses.dataclass
class Failure:
    cfg: EngineConfig
    actions: list[Action]
    violation: Violation


LAST_FAILURE: Optional[Failure] = None

# Search budgets: `ci` is bounded and seeded (what the test suite and CI run), `nightly` goes deep.
PROFILES = {"ci": {"examples": 60, "steps": 30}, "nightly": {"examples": 3000, "steps": 80}}
DRAIN_STEPS = 200   # a conformance run's steps after the last action, until every request is answered


@st.composite
def hf_cb_configs(draw) -> EngineConfig:
    """Everything transformers' ContinuousBatchingConfig accepts for the scheduler, small enough
    that pressure, soft resets and the fatal error are all a few requests away."""
    page = draw(st.integers(4, 8))
    scheduler = draw(st.sampled_from(["fifo", "prefill_first"]))
    margin = draw(st.none() | st.sampled_from([0.0, 0.1, 0.15, 0.3, 0.5]))
    options = hf_cb.Options(scheduler_type=scheduler, safety_margin=margin,
                            allow_block_sharing=draw(st.booleans()))
    return EngineConfig(policy="hf_cb", block_size=page, num_blocks=draw(st.integers(1, 12)),
                        max_num_tokens=draw(st.integers(4, 48)), max_batch_size=draw(st.integers(1, 8)),
                        chunked_prefill=True, options=options)


@st.composite
def vllm_v1_configs(draw, head_of_line: bool = True, async_scheduling: bool = True) -> EngineConfig:
    """vLLM V1 scheduler knobs the `vllm_v1` policy models (budgets, max_num_seqs, chunked prefill,
    prefix caching, long-prefill threshold, fcfs/priority, watermark, full-ISL reservation, block size,
    pool size), small enough that preemption and prefix hits are a few requests away; only
    configurations vLLM starts with (the policy's check_config, which mirrors vLLM's own checks).
    `head_of_line=False` keeps max_num_scheduled_tokens >= max_model_len when chunked prefill is off, which
    searches past the known B7 deadlock (docs/known_bugs.md: a prompt over the step budget at the head).
    `async_scheduling` is the engine's loop: on (vLLM's default, `AsyncScheduler` under the batch queue) or off."""
    block = draw(st.sampled_from([4, 8, 16]), label="block_size")
    chunked = draw(st.booleans(), label="chunked_prefill")
    mml = draw(st.integers(4, 48), label="max_model_len")
    need = -(-mml // block) + vllm_v1.NULL_BLOCKS
    num_blocks = draw(st.integers(need, need + 3), label="num_blocks")   # tight: preemption within reach
    seqs = draw(st.integers(1, 6), label="max_num_seqs")
    low = max(seqs, 1 if chunked else mml)
    tokens = draw(st.integers(low, max(low, 64)), label="max_num_batched_tokens")
    options = vllm_v1.Options(
        max_model_len=mml,
        max_num_scheduled_tokens=draw(st.none() | st.integers(1 if (chunked or head_of_line) else mml,
                                                               max(tokens, mml)), label="max_num_scheduled_tokens"),
        max_num_active_seqs=draw(st.none() | st.integers(1, seqs), label="max_num_active_seqs"),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 4, 8]).filter(lambda v: v <= mml),
                                          label="long_prefill_token_threshold"),
        policy=draw(st.sampled_from(["fcfs", "priority"]), label="policy"),
        enable_prefix_caching=draw(st.booleans(), label="enable_prefix_caching"),
        scheduler_reserve_full_isl=draw(st.booleans(), label="scheduler_reserve_full_isl"),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3]), label="watermark"),
        async_scheduling=async_scheduling)
    cfg = EngineConfig(policy="vllm_v1", block_size=block, num_blocks=num_blocks, max_num_tokens=tokens,
                       max_batch_size=seqs, chunked_prefill=chunked, options=options)
    vllm_v1.VllmV1().check_config(cfg)
    return cfg


def _budget_below_max_model_len(draw, cfg):
    """SC:315-326: chunked prefill off and max_num_batched_tokens < max_model_len."""
    mml = max(cfg.options.max_model_len, 2)
    tokens = draw(st.integers(1, mml - 1), label="max_num_batched_tokens")
    return dataclasses.replace(cfg, chunked_prefill=False, max_num_tokens=tokens,
                               max_batch_size=min(cfg.max_batch_size, tokens),
                               options=dataclasses.replace(cfg.options, max_model_len=mml))


def _budget_below_max_num_seqs(draw, cfg):
    """SC:328-332: max_num_batched_tokens < max_num_seqs (chunked prefill on, so the rule above holds)."""
    tokens = draw(st.integers(1, 5), label="max_num_batched_tokens")
    seqs = draw(st.integers(tokens + 1, 6), label="max_num_seqs")
    o = cfg.options
    return dataclasses.replace(cfg, chunked_prefill=True, max_num_tokens=tokens, max_batch_size=seqs,
                               options=dataclasses.replace(o, max_num_active_seqs=None))


def _active_above_max_num_seqs(draw, cfg):
    """SC:334-341: max_num_active_seqs > max_num_seqs."""
    extra = draw(st.integers(1, 3), label="max_num_active_seqs over max_num_seqs")
    return dataclasses.replace(cfg, options=dataclasses.replace(cfg.options,
                                                                max_num_active_seqs=cfg.max_batch_size + extra))


def _threshold_above_max_model_len(draw, cfg):
    """SC:350-355: long_prefill_token_threshold > max_model_len."""
    extra = draw(st.integers(1, 8), label="long_prefill_token_threshold over max_model_len")
    o = cfg.options
    return dataclasses.replace(cfg, options=dataclasses.replace(o, long_prefill_token_threshold=o.max_model_len + extra))


def _pool_below_one_request(draw, cfg):
    """KU:1003-1040 `_check_enough_kv_cache_memory`: the usable pool holds less than one max_model_len request."""
    o = cfg.options
    usable = draw(st.integers(1, 3), label="usable blocks")
    mml = max(o.max_model_len, usable * cfg.block_size + 1)       # needs usable + 1 blocks at least
    tokens = cfg.max_num_tokens if cfg.chunked_prefill else max(cfg.max_num_tokens, mml)
    return dataclasses.replace(cfg, num_blocks=usable + vllm_v1.NULL_BLOCKS, max_num_tokens=tokens,
                               options=dataclasses.replace(o, max_model_len=mml))


# The refusals of vLLM 0.32.0 (SC = vllm/config/scheduler.py `verify_max_model_len`; KU = v1/core/kv_cache_utils.py)
# that `vllm_v1_refused_configs` breaks, one per configuration; the policy's check_config mirrors each.
REFUSALS = {"budget below max_model_len, chunked prefill off": _budget_below_max_model_len,
            "budget below max_num_seqs": _budget_below_max_num_seqs,
            "max_num_active_seqs above max_num_seqs": _active_above_max_num_seqs,
            "long_prefill_token_threshold above max_model_len": _threshold_above_max_model_len,
            "pool below one max_model_len request": _pool_below_one_request}


@st.composite
def vllm_v1_refused_configs(draw) -> EngineConfig:
    """The labelled mode (`refused=True` of `machine_for`): configurations vLLM refuses to start with, each an
    accepted draw of `vllm_v1_configs` with one of `REFUSALS` broken, to see what its validation protects
    against. Nothing found here is a finding about a configuration a user can run. The accepted draw searches past
    the known B7 head-of-line deadlock (`head_of_line=False`), so what a workload violates is the broken check's."""
    cfg = draw(vllm_v1_configs(head_of_line=False))
    cfg = REFUSALS[draw(st.sampled_from(sorted(REFUSALS)), label="refusal")](draw, cfg)
    assert refusal(cfg) is not None, cfg
    return cfg


@st.composite
def sglang_configs(draw, disable_overlap_schedule: bool = False) -> EngineConfig:
    """SGLang scheduler knobs the `sglang` policy models (page size, pool, --max-prefill-tokens,
    --max-running-requests, chunked prefill and its size, --schedule-conservativeness, ignore_eos, the context
    length, the radix cache on or off, drawn first, which in Hypothesis's generation spreads its retractions over
    both; priority scheduling in a third of them, with its preemption, direction and threshold), small enough
    that the latch and the arrival clip are a few requests away. A third of the draws are under pressure: page 1,
    a 16-28 token pool, ignore_eos off and conservativeness 0.01 (or 1.0 for half the ranked ones), where
    admission counts on almost none of the running requests' remaining tokens, so requests admitted in turn
    outgrow the pool and decode retraction follows. `disable_overlap_schedule` is the engine's loop:
    event_loop_overlap (SGLang's default) or event_loop_normal."""
    radix_off = draw(st.booleans(), label="disable_radix_cache")
    ranked = draw(st.integers(0, 2), label="enable_priority_scheduling") == 0
    pressure = draw(st.integers(0, 2), label="pressure") == 0
    page = 1 if pressure else draw(st.sampled_from([1, 1, 2, 4]), label="page_size")
    chunked = draw(st.booleans(), label="chunked_prefill")
    chunk_size = page * draw(st.integers(1, 8), label="chunked_prefill_size / page")
    # under pressure the ratio is near 0; ranked designs also get one whose offsets take two preemptions to cover
    if pressure and not ranked:
        conservativeness = 0.01
    else:
        choices = [0.01, 1.0] if pressure else [0.1, 0.3, 1.0]
        conservativeness = draw(st.sampled_from(choices), label="schedule_conservativeness")
    options = sglang.Options(
        chunked_prefill_size=chunk_size, schedule_conservativeness=conservativeness,
        ignore_eos=False if pressure else draw(st.booleans(), label="ignore_eos"),
        context_len=None if pressure else draw(st.none() | st.integers(16, 64), label="context_len"),
        disable_radix_cache=radix_off, enable_priority_scheduling=ranked,
        schedule_low_priority_values_first=ranked and draw(st.booleans(), label="schedule_low_priority_values_first"),
        disable_priority_preemption=ranked and draw(st.integers(0, 3), label="disable_priority_preemption") == 0,
        priority_scheduling_preemption_threshold=draw(st.sampled_from([10, 0, 20]), label="preemption threshold")
        if ranked else 10,
        disable_overlap_schedule=disable_overlap_schedule)
    pool = draw(st.integers(16, 28) if pressure else st.integers(12, 64), label="pool")
    cfg = EngineConfig(policy="sglang", block_size=page, num_blocks=pool // page,
                       max_num_tokens=draw(st.integers(4, 64), label="max_prefill_tokens"),
                       # priority preemption needs the request rows full: fewer rows with priority scheduling
                       max_batch_size=draw(st.integers(1, 3 if ranked else 6), label="max_running_requests"),
                       chunked_prefill=chunked, options=options)
    sglang.Sglang().check_config(cfg)
    return cfg


CONFIGS = {"hf_cb": hf_cb_configs, "vllm_v1": vllm_v1_configs, "sglang": sglang_configs}
# the synchronous loop, for the policies whose engine's default overlaps scheduling with the forward pass: the options
# that choose it (their configurations are CONFIGS' drawn with them)
SYNC_OPTIONS = {"vllm_v1": {"async_scheduling": False}, "sglang": {"disable_overlap_schedule": True}}


def pipelined(cfg: EngineConfig) -> bool:
    """Whether `cfg` runs an engine loop that schedules the next batch before the previous one's output is processed:
    its policy has a synchronous loop (SYNC_OPTIONS) and `cfg` does not choose it."""
    sync = SYNC_OPTIONS.get(cfg.policy)
    return sync is not None and any(getattr(cfg.options, k) != v for k, v in sync.items())


def loop_of(target_cls, sync: bool = False) -> str:
    """The engine loop a search of `target_cls` drives, its default or with `sync` its synchronous one, as its
    policy names it (`Policy.loop`)."""
    if not target_cls.real:
        return "the model's step (no engine)"
    policy = getattr(target_cls, "policy", "hf_cb")   # a target names its policy; transformers' is hf_cb
    p = POLICIES[policy]
    return p.loop(p.Options(**(SYNC_OPTIONS.get(policy, {}) if sync else {})))


def sync_configs(target_cls):
    """The configurations of `target_cls`'s engine in its synchronous loop (`--sync`), or ValueError naming why
    there is no such choice."""
    policy = getattr(target_cls, "policy", "hf_cb")
    if policy not in SYNC_OPTIONS:
        raise ValueError(f"--sync: only the vllm and sglang targets choose their engine's loop (async_scheduling, "
                         f"disable_overlap_schedule); the {target_cls.name} target runs one loop (docs/targets.md)")
    return CONFIGS[policy](**SYNC_OPTIONS[policy])


def vllm_v1_step_prompt(cfg: EngineConfig) -> int:
    """The largest prompt vLLM V1 schedules alone in one step: with chunked prefill off a waiting request is
    scheduled only when its whole prompt fits min(token_budget, max_num_batched_tokens) (S:1118, S:1160-1167;
    a request alone never has the long-prefill cap, S:643-649), as the policy's `fits_alone`; with it on, any
    prompt up to max_model_len is chunked. Only the prompt: its replay after a recompute preemption (prompt +
    generated tokens) may still outgrow the budget, which is the recompute wedge."""
    room = cfg.options.max_model_len
    return room if cfg.chunked_prefill else min(room, POLICIES[cfg.policy].step_token_budget(cfg)[0])


# policy -> cfg -> the largest prompt that fits alone beyond the room for prompt + max_new (`--fitting-only`);
# a target class may give its own as `fitting_prompt`. A policy not named here: the room bounds the prompt alone.
FITTING_PROMPT = {"vllm_v1": vllm_v1_step_prompt}


def sglang_prompt_room(cfg: EngineConfig) -> int:
    """The largest prompt worth submitting to SGLang: max_req_len - 5, from where every prompt takes the same path
    (refused at arrival, a 1-token prefill); a quarter of the pool under pressure (`sglang_configs`), since only
    requests admitted in turn with short prompts and long outputs outgrow the pool together and get retracted."""
    room = sglang.max_req_input_len(cfg)
    return max(1, cfg.num_blocks * cfg.block_size // 4) if cfg.options.schedule_conservativeness <= 0.01 else room


# policy -> cfg -> the largest prompt worth submitting, where the target class gives no `prompt_room`
PROMPT_ROOM = {"sglang": sglang_prompt_room}


def machine_for(target_cls, configs=None, step_timeout_s: float = 10.0, max_requests: int = 8,
                fitting_only: bool = False, empty_prompts: bool = True,
                tally=None, refused: bool = False, drain: bool = False) -> type:
    """`fitting_only` submits only requests that fit alone, and `empty_prompts=False` never submits an empty
    prompt: each searches past a known finding for the failures behind it. Fitting alone: prompt + max_new - 1
    within the target's room (`prompt_room`; the cache by default: past transformers' fatal error for a request
    too large for the cache), and the prompt within the policy's `FITTING_PROMPT` (the target's `fitting_prompt`),
    if any: vLLM with chunked prefill off, a prompt that one step's token budget holds, past the known B7
    head-of-line deadlock (docs/findings/README.md, vLLM 1) with the recompute wedge still in reach. The
    empty-prompt rule searches past transformers' crash on a batch of empty prompts.

    `drain=True` steps the engine after the last action until every request is answered (DRAIN_STEPS at most),
    the properties checked after every step: a request left behind when the actions end (a recompute-preempted
    request that can never be scheduled again) shows as a step that changes nothing, where without it the
    example ends with the request legitimately in flight.

    With a `tally` (targets.lockstep.Tally) the machine is a conformance run (targets/lockstep.py): only
    a lockstep divergence from the model fails; a property violation is counted in the tally with what
    each workload covered, and the run goes on.

    `refused=True` is the labelled mode for configurations the engine refuses to start with (only the `vllm`
    target has it: `vllm_v1_refused_configs`, built past vLLM's validation with `refused=True`)."""
    low = 0 if empty_prompts else 1
    # a target names its policy (`policy`, default hf_cb) and so the configurations it is drawn from
    if refused and configs is None:
        if getattr(target_cls, "policy", None) != "vllm_v1":
            raise ValueError(f"the {target_cls.name} target has no mode for configurations its engine refuses")
        configs = vllm_v1_refused_configs()
    configs = configs if configs is not None else CONFIGS[getattr(target_cls, "policy", "hf_cb")]()
    build = {"refused": True} if refused else {}
    prompt_room = getattr(target_cls, "prompt_room", None) or \
        PROMPT_ROOM.get(getattr(target_cls, "policy", None))   # cfg -> largest prompt worth submitting
    fitting_prompt = getattr(target_cls, "fitting_prompt", None) or \
        FITTING_PROMPT.get(getattr(target_cls, "policy", "hf_cb"))   # cfg -> largest prompt that fits alone

    class EngineMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.target = None
            self.failed = False

        @initialize(cfg=configs)
        def start(self, cfg):
            self.cfg = cfg
            if tally is not None:
                tally.start(cfg)
            self.target = target_cls(cfg, step_timeout_s=step_timeout_s, **build)
            if hasattr(self.target, "release_config"):   # the design as the installed engine runs it: reports name it
                cfg = self.cfg = self.target.release_config(cfg)
            if tally is not None:
                tally.release = getattr(self.target, "engine_release", None)
            self.checker = StepChecker(cfg, getattr(self.target, "greedy_output", None))
            self.actions: list[Action] = []
            self.submitted = 0
            self.capacity = prompt_room(cfg) if prompt_room else cfg.num_blocks * cfg.block_size
            self.fitting = min(self.capacity, fitting_prompt(cfg)) if fitting_prompt else self.capacity

        # -- what a user can do at any time ---------------------------------------------
        @precondition(lambda self: self.target is not None and self.submitted < max_requests)
        @rule(data=st.data())
        def submit(self, data):
            if fitting_only:   # prompt + max_new - 1 <= capacity (the hf_cb fits-alone rule), prompt <= fitting
                prompt = data.draw(st.integers(low, self.fitting), label="prompt")
                max_new = data.draw(st.integers(1, min(16, self.capacity - prompt + 1)), label="max_new")
            else:
                room = self.capacity + 4
                prompts = st.integers(low, room)
                if tally is not None:   # a conformance run: half the prompts in the upper half, for pressure
                    prompts = prompts | st.integers(max(low, room // 2), room)
                prompt = data.draw(prompts, label="prompt")
                max_new = data.draw(st.integers(1, 16), label="max_new")
            group = data.draw(st.sampled_from([-1, -1, 0, 1]), label="prefix_group") if prompt else -1
            shared = data.draw(st.integers(1, prompt), label="prefix_len") if group >= 0 else 0
            # a priority only where the engine ranks by it (vLLM's `policy = "priority"`; SGLang's priority
            # scheduling, in steps of 11: every gap is past its default preemption threshold of 10, some are not
            # past 20)
            options = self.cfg.options
            priority = 0
            if getattr(options, "policy", None) == "priority":
                priority = data.draw(st.integers(0, 3), label="priority")
            elif getattr(options, "enable_priority_scheduling", False):
                # a level, or one that rises with the submission (later requests outranking the running ones
                # is what priority preemption needs; a level drawn alone rarely comes late)
                level = data.draw(st.integers(0, 3) | st.just(min(3, self.submitted)), label="priority level")
                priority = 11 * (3 - level if options.schedule_low_priority_values_first else level)
            action = Add(self.submitted, prompt, max_new, group, shared, priority)
            self.submitted += 1
            self.actions.append(action)
            self.checker.submitted(action)
            self.target.add(action)
            if tally is not None:
                tally.submitted(action)

        @precondition(lambda self: self.target is not None and self.submitted > 0)
        @rule(data=st.data())
        def cancel(self, data):
            rid = data.draw(st.integers(0, self.submitted - 1), label="rid")
            self.actions.append(Cancel(rid))
            self.target.cancel(rid)
            if tally is not None:
                tally.cancelled()

        @precondition(lambda self: self.target is not None and self.target.early_stops and self.submitted > 0)
        @rule(data=st.data())
        def stop(self, data):
            rid = data.draw(st.integers(0, self.submitted - 1), label="rid")
            self.actions.append(Stop(rid))
            self.target.stop(rid)
            if tally is not None:
                tally.stopped(rid)

        @precondition(lambda self: self.target is not None)
        @rule()
        def step(self):
            self.actions.append(Step())
            try:
                obs = self.target.step()
            except TargetHung as exc:
                self._fail(Violation("ENGINE-ERROR", len(self.actions), f"hung: {exc}"), "hung")
            violation = self.checker.check(obs)
            if tally is not None:
                tally.observe(obs, violation, getattr(self.target, "model_record", None))
                violation = None
            if violation is None and hasattr(self.target, "conformance_check"):   # a lockstep model, if any
                violation = self.target.conformance_check(obs)
            if violation is not None:
                self._fail(violation, obs.record.error_kind)

        def _fail(self, violation: Violation, kind: Optional[str] = None):
            global LAST_FAILURE
            self.failed = True
            if tally is not None:
                tally.diverged()
            LAST_FAILURE = Failure(self.cfg, list(self.actions), violation)
            raise failure_type(violation, kind)(violation)

        def teardown(self):
            if (tally is not None or drain) and self.target is not None and not self.failed:
                # a conformance run drains the workload, so requests finish, the pool fills and
                # preemptions happen in lockstep too (a divergence here fails and shrinks as in a rule);
                # a search with `drain` alike, every property checked, as in a rule
                for _ in range(DRAIN_STEPS):
                    if not self.target.unanswered():
                        break
                    self.step()
                if tally is not None:
                    if self.target.unanswered():   # not a verdict: said, so that no run counts it as drained
                        tally.undrained()
                    tally.end()
            if self.target is not None:
                self.target.close()

    EngineMachine.__name__ = f"{target_cls.__name__}Machine"
    return EngineMachine
