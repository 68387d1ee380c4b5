"""What a policy is, and the pieces every policy shares.

A policy is a deterministic scheduler step for one engine version: `schedule` picks the
batch (allocating, preempting and offloading as the engine does) and `execute` applies the
forward pass (tokens computed, tokens sampled, requests finished). The environment's choices
(arrivals, cancellations, early stops) reach the policy only through `Env`, and admission
never sees a request's actual output length (style lesson 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable, Optional

from .config import ConfigError, EngineConfig
from .state import Phase, Request, State, StepRecord

replace = dataclasses.replace


@dataclasses.dataclass(frozen=True)
class Scheduled:
    rid: int
    tokens: int       # tokens of the request's own context or decode this step
    draft: int = 0    # speculative draft tokens run alongside

    @property
    def total(self) -> int:
        return self.tokens + self.draft


@dataclasses.dataclass(frozen=True)
class Env:
    """The environment's choices for one step."""

    arrivals: tuple[int, ...] = ()
    cancels: tuple[int, ...] = ()
    stops: tuple[int, ...] = ()   # requests whose next sampled token ends them (EOS / stop string)


@dataclasses.dataclass
class Plan:
    """The scheduler's decision for one step, filled in while scheduling."""

    scheduled: list[Scheduled] = dataclasses.field(default_factory=list)
    charged: int = 0
    preempted: list[int] = dataclasses.field(default_factory=list)
    offloaded: list[int] = dataclasses.field(default_factory=list)
    rejected: list[int] = dataclasses.field(default_factory=list)
    failed: list[int] = dataclasses.field(default_factory=list)   # failed one by one (not an engine error)
    error: Optional[str] = None
    error_kind: Optional[str] = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def schedule(self, rid: int, tokens: int, draft: int = 0, charge: Optional[int] = None) -> None:
        self.scheduled.append(Scheduled(rid, tokens, draft))
        self.charged += tokens + draft if charge is None else charge


class Policy:
    """Base class: subclasses set the class attributes and implement `schedule`."""

    name: ClassVar[str]
    mirrors: ClassVar[str]                 # engine version / file / function it mirrors
    # the engine loop the policy's step is one iteration of, in the engine's names, and whether it is the engine's
    # default (docs/fidelity.md); a policy with a choice of loop overrides `loop`
    engine_loop: ClassVar[str] = "the engine's loop"
    # the option that chooses between the engine's loops (its dataclass default is the engine's default loop), or
    # None for an engine with one loop: what proofs/modes.py turns to re-decide a claim in the default loop
    loop_knob: ClassVar[Optional[str]] = None
    Options: ClassVar[type]
    pool_option: ClassVar[Optional[str]] = None   # option giving the GPU pool in the engine's own terms
    # options read only to turn `pool_option` into num_blocks (gpu_blocks_from_option): a design is then
    # described by its num_blocks, so a claim's class (proofs/reach.py) does not compare them
    pool_inputs: ClassVar[tuple[str, ...]] = ()
    reserved_blocks: ClassVar[int] = 0            # pool blocks no request can hold (vLLM's null block)
    # whether max_num_tokens is a budget no step may exceed (SAFE-BUDGET), or a target the engine may pass by
    # design (SGLang's max_prefill_tokens: the first request of a pass is admitted whatever its length)
    hard_step_budget: ClassVar[bool] = True

    def loop(self, options: Any) -> str:
        """The engine loop a design with these options steps through, in the engine's names (`run`, `fuzz`, `prove`
        and report folders name it; the one place that says which loop is which)."""
        return self.engine_loop

    # -- configuration -------------------------------------------------------------------
    def gpu_blocks_from_option(self, block_size: int, options: Any, engine: dict) -> int:
        raise NotImplementedError

    def check_config(self, cfg: EngineConfig) -> None:
        """Policy-specific validation; raise ConfigError(field, reason)."""

    def fits_alone(self, cfg: EngineConfig, r: Request) -> bool:
        """Whether the request could complete on an otherwise empty engine: the pool holds its
        largest KV footprint (the last sampled token is never written, hence - 1) and, with
        chunked prefill off, its prompt fits one step. Policies refine this where the engine's
        capacity differs."""
        if cfg.blocks_for(r.prompt + r.max_new - 1) > cfg.num_blocks:
            return False
        return cfg.chunked_prefill or r.prompt <= cfg.max_num_tokens

    def step_token_budget(self, cfg: EngineConfig) -> tuple[int, str]:
        """The most context tokens one request can be given in one step, and the knob that sets it
        (the scenario file's name): what a prompt or a replay must fit with chunked prefill off.
        Used to explain a stall (schedproof/diagnosis.py), never to schedule."""
        return cfg.max_num_tokens, "max_num_tokens"

    def stall_reason(self, cfg: EngineConfig, state: State) -> Optional[str]:
        """Why this policy's own memory between steps (`state.sched`) keeps it from scheduling anything
        in `state`, in the engine's words, or None where it does not (the limits of budget and pool are
        explained by schedproof/diagnosis.py for every policy). Used to explain a stall, never to schedule."""
        return None

    def stall_changes(self, cfg: EngineConfig, state: State) -> list[tuple[dict, str]]:
        """Design changes ({scenario field: value}, why) that may remove the stall `stall_reason` explains in
        `state`, for schedproof/diagnosis.py to re-check by re-running the search; never used to schedule."""
        return []

    def initial_sched(self, cfg: EngineConfig) -> Any:
        return None

    def default_chunk_unit(self, cfg: EngineConfig) -> int:
        return cfg.chunk_unit or cfg.block_size

    # -- the step ------------------------------------------------------------------------
    def step(self, cfg: EngineConfig, state: State, env: Env) -> tuple[State, StepRecord]:
        if state.error is not None:
            return state, StepRecord(step=state.step, notes=("engine is dead",))
        plan = Plan()
        state = self.admit_env(cfg, state, env, plan)
        state = self.schedule(cfg, state, plan)
        if plan.error is not None:
            return self.fail_all(cfg, state, plan)
        return self.execute(cfg, state, plan, frozenset(env.stops))

    def admit_env(self, cfg: EngineConfig, state: State, env: Env, plan: Plan) -> State:
        """What the environment did since the last step, before the scheduler runs: arrivals, then cancellations."""
        state = self.arrive(cfg, state, env.arrivals, plan)
        for rid in env.cancels:
            if state.req(rid).phase.unfinished:
                state = self.cancel(cfg, state, rid)
                plan.notes.append(f"r{rid} cancelled")
        return state

    def arrive(self, cfg: EngineConfig, state: State, rids: Iterable[int], plan: Plan) -> State:
        for rid in rids:
            reason = self.refuse(cfg, state.req(rid))
            if reason:
                state = state.with_request(replace(state.req(rid), phase=Phase.REJECTED, reason=reason))
                plan.rejected.append(rid)
            else:
                state = state.with_request(replace(state.req(rid), phase=Phase.WAITING))
        return state

    def refuse(self, cfg: EngineConfig, r: Request) -> str:
        """The engine's admission-time validation: a non-empty reason rejects the request with
        that error before any work (vLLM's input processor, for one). Default: accept all."""
        return ""

    def cancel(self, cfg: EngineConfig, state: State, rid: int) -> State:
        state = self.release(cfg, state, rid)
        return state.with_request(replace(state.req(rid), phase=Phase.CANCELLED))

    def schedule(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        raise NotImplementedError

    # -- the forward pass and its bookkeeping --------------------------------------------
    def execute(self, cfg: EngineConfig, state: State, plan: Plan,
                stops: frozenset[int]) -> tuple[State, StepRecord]:
        finished = []
        for s in plan.scheduled:
            r = state.req(s.rid)
            sampled = False
            if r.phase == Phase.DECODING:
                # One token per step: drafts are modelled as all rejected (the worst case for
                # progress; divergence from any engine that accepts drafts).
                r = replace(r, computed=r.computed + 1, generated=r.generated + 1)
                sampled = True
            else:
                computed = r.computed + s.tokens
                if computed >= r.context_len:
                    r = replace(r, computed=r.context_len, generated=r.generated + 1, phase=Phase.DECODING)
                    sampled = True
                else:
                    r = replace(r, computed=computed, phase=Phase.PREFILLING)
            state = state.with_request(r)
            if sampled and self.finishes(cfg, r, s.rid in stops):
                state = self.finish(cfg, state, s.rid)
                finished.append(s.rid)
        state = self.after_step(cfg, state, plan)
        return state, self.record(state, plan, finished=finished)

    def finishes(self, cfg: EngineConfig, r: Request, stop: bool) -> bool:
        return stop or r.generated >= r.max_new

    def finish(self, cfg: EngineConfig, state: State, rid: int) -> State:
        state = self.release(cfg, state, rid)
        return state.with_request(replace(state.req(rid), phase=Phase.FINISHED))

    def after_step(self, cfg: EngineConfig, state: State, plan: Plan) -> State:
        return replace(state, step=state.step + 1)

    def release(self, cfg: EngineConfig, state: State, rid: int) -> State:
        """Return every block the request holds to its pool (shared prefix blocks lose a ref)."""
        r = state.req(rid)
        state = replace(state, free_blocks=state.free_blocks + r.blocks,
                        free_host_blocks=state.free_host_blocks + r.host_blocks)
        if r.shared_blocks:
            state = unref_prefix(state, r.prefix_group)
        return state.with_request(replace(r, blocks=0, shared_blocks=0, host_blocks=0, suspended=False))

    def fail_all(self, cfg: EngineConfig, state: State, plan: Plan) -> tuple[State, StepRecord]:
        """An engine error kills the engine: every request it still owes an answer fails."""
        failed = []
        for r in state.requests:
            if not r.phase.terminal:
                state = self.release(cfg, state, r.rid)
                state = state.with_request(replace(state.req(r.rid), phase=Phase.FAILED, reason=plan.error))
                failed.append(r.rid)
        state = replace(state, error=plan.error, step=state.step + 1)
        return state, self.record(state, plan, failed=failed)

    @staticmethod
    def record(state: State, plan: Plan, finished=(), failed=()) -> StepRecord:
        return StepRecord(
            step=state.step - 1,
            scheduled=tuple((s.rid, s.total) for s in plan.scheduled),
            charged=plan.charged,
            preempted=tuple(plan.preempted),
            offloaded=tuple(plan.offloaded),
            finished=tuple(finished),
            failed=tuple(failed),
            rejected=tuple(plan.rejected),
            error=plan.error,
            error_kind=plan.error_kind,
            notes=tuple(plan.notes),
        )


# -- block helpers shared by the policies ---------------------------------------------------

def unref_prefix(state: State, group: int) -> State:
    entries = tuple(replace(e, refs=e.refs - 1) if e.group == group else e for e in state.prefix_cache)
    return replace(state, prefix_cache=entries)


POLICIES: dict[str, Policy] = {}


def register(policy_cls: type) -> type:
    POLICIES[policy_cls.name] = policy_cls()
    return policy_cls


def refusal(cfg: EngineConfig) -> Optional[str]:
    """What the engine refuses `cfg` for ("field: reason", from its policy's check_config, the mirror of the
    engine's own checks), or None when it accepts it."""
    try:
        POLICIES[cfg.policy].check_config(cfg)
    except ConfigError as exc:
        return f"{exc.field}: {exc.reason}"
    return None
