"""Conformance in lockstep: a real engine and its policy's model over Hypothesis's random workloads.

    python -m targets.lockstep --target vllm --workloads 1000 --seed 0 [--steps 30] [--refused | --sync]

The stateful machine of targets/stateful.py, with the engine target running its policy beside the engine and
comparing after every step (`conformance_check`, targets/vllm_v1.py): a divergence fails, shrinks like any other
finding and is printed with its action list. A property violation, which the model and the engine then show
alike, is counted and the run goes on. Each workload is one Hypothesis example: a configuration drawn from what
the engine accepts, in the engine's default mode (vLLM: async scheduling; SGLang: the overlap loop) or with
`--sync` its synchronous loop, then up to `--steps` actions (submit, cancel, step). The summary gives the workloads
run, how many agreed, and what they covered (each knob's values, preemptions, prefix-cache hits, cancellations,
distinct priorities, properties violated with no divergence), so an agreement rate can be read against what was
exercised.

`--refused` is the labelled mode for configurations the engine refuses to start with (vLLM only:
`stateful.vllm_v1_refused_configs`, one of vLLM's checks broken per configuration, built past its validation): the
same lockstep, every line of the summary saying so, and what each broken check let through tabulated by check.
Nothing it finds concerns a configuration a user can run; it shows what each of vLLM's checks protects against.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time
from typing import Callable, Optional

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from model.config import EngineConfig
from model.policy import refusal
from model.state import Phase as RequestPhase

from . import get_target, releases, stateful
from .checking import action_code
from .conformance import CONFORMANCE
from .protocol import Add, Observation, TargetUnavailable, exit_status

# What a configuration is, per policy, in the words of the engine's own knobs (one label per workload each).
KNOBS: dict[str, list[tuple[str, Callable[[EngineConfig], object]]]] = {
    "vllm_v1": [
        ("async_scheduling", lambda c: c.options.async_scheduling),
        ("chunked_prefill", lambda c: c.chunked_prefill),
        ("enable_prefix_caching", lambda c: c.options.enable_prefix_caching),
        ("policy", lambda c: c.options.policy),
        ("block_size", lambda c: c.block_size),
        ("max_num_scheduled_tokens set", lambda c: c.options.max_num_scheduled_tokens is not None),
        ("max_num_active_seqs set", lambda c: c.options.max_num_active_seqs is not None),
        ("long_prefill_token_threshold > 0", lambda c: c.options.long_prefill_token_threshold > 0),
        # the cap 0.34 no longer applies (model/releases.py `long_prefill_cap_needs_chunking`)
        ("long_prefill_token_threshold > 0, chunked prefill off",
         lambda c: c.options.long_prefill_token_threshold > 0 and not c.chunked_prefill),
        ("watermark > 0", lambda c: c.options.watermark > 0),
        ("scheduler_reserve_full_isl", lambda c: c.options.scheduler_reserve_full_isl),
    ],
    "sglang": [
        ("disable_overlap_schedule", lambda c: c.options.disable_overlap_schedule),
        ("page_size", lambda c: c.block_size),
        ("chunked_prefill", lambda c: c.chunked_prefill),
        ("ignore_eos", lambda c: c.options.ignore_eos),
        ("schedule_conservativeness", lambda c: c.options.schedule_conservativeness),
        ("context_len set", lambda c: c.options.context_len is not None),
        ("disable_radix_cache", lambda c: c.options.disable_radix_cache),
        ("priority scheduling", lambda c: sglang_priority(c.options)),
    ],
    "hf_cb": [
        ("scheduler_type", lambda c: c.options.scheduler_type),
        ("allow_block_sharing", lambda c: c.options.allow_block_sharing),
        ("safety_margin", lambda c: c.options.safety_margin),
        ("block_size", lambda c: c.block_size),
    ],
}


def sglang_priority(o) -> str:
    """SGLang's priority scheduling knobs in one label: off, or the direction and the preemption threshold."""
    if not o.enable_priority_scheduling:
        return "off"
    order = "low values first" if o.schedule_low_priority_values_first else "high values first"
    if o.disable_priority_preemption:
        return f"{order}, no preemption"
    return f"{order}, preemption past {o.priority_scheduling_preemption_threshold}"


# the vllm_v1 model's note when its 0.33 rule applies (model/policies/vllm_v1.py `running_loop`)
GOES_ON = "preempted itself; the running loop goes on"


@dataclasses.dataclass
class Tally:
    """What the workloads of a run covered; the state machine calls it (stateful.machine_for `tally`)."""
    workloads: int = 0
    knobs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    covered: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    _seen: set = dataclasses.field(default_factory=set)
    _priorities: set = dataclasses.field(default_factory=set)
    _stopped: set = dataclasses.field(default_factory=set)
    _refusal: Optional[str] = None
    _cfg: Optional[EngineConfig] = None
    # in the refused mode: (the check the configuration breaks, an event) -> workloads
    by_refusal: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    release: Optional[str] = None   # the modelled release the engine is held to (model/releases.py), if it says
    frozen: bool = False   # set at the first divergence: the shrinker's re-runs are not more workloads
    # the target's account of a LIVE-NO-PROGRESS state (cfg, state -> a short cause), if it has one
    stall_cause: Optional[Callable[[EngineConfig, object], str]] = None

    def start(self, cfg: EngineConfig) -> None:
        if self.frozen:
            return
        self.workloads += 1
        self._cfg = cfg
        self._seen, self._priorities, self._stopped = set(), set(), set()
        self._previous = None
        self._previous_record = None
        reason = refusal(cfg)
        self._refusal = reason.split(":")[0] if reason else None
        if self._refusal:
            self.knobs[f"refused by the engine for {self._refusal}"] += 1
        for name, value in KNOBS.get(cfg.policy, []):
            self.knobs[f"{name} = {value(cfg)}"] += 1

    def submitted(self, action: Add) -> None:
        if action.prefix_group >= 0:
            self._seen.add("shared-prefix request")
        self._priorities.add(action.priority)
        if len(self._priorities) > 1:
            self._seen.add("requests of different priorities")

    def cancelled(self) -> None:
        self._seen.add("cancellation")

    def stopped(self, rid: int) -> None:
        self._stopped.add(rid)

    def observe(self, obs: Observation, violation, model_record=None) -> None:
        if obs.record.preempted:
            self._seen.add("preemption")
        if model_record is not None and any(GOES_ON in note for note in model_record.notes):
            self._seen.add("a request preempted itself and the running loop went on (priority, vLLM 0.33+)")
        self._pipeline_events(self._previous_record, obs)
        self._previous_record = obs.record
        if any(r.shared_blocks for r in obs.state.requests):
            self._seen.add("prefix-cache hit")
        self._step_events(self._previous, obs.state, obs.record)
        self._previous = obs.state
        if obs.record.finished:
            self._seen.add("request finished")
        if obs.record.rejected:
            self._seen.add("request rejected")
        if obs.record.failed and obs.record.error is None:
            self._seen.add("request failed alone (the engine lives on)")
        if getattr(obs.state.sched, "batch_is_full", False):
            self._seen.add("admission latched (batch_is_full)")
        if getattr(obs.state.sched, "chunked", None) not in (None, -1):
            self._seen.add("chunked prefill in flight")
        if any(rid in self._stopped and obs.state.req(rid).generated < obs.state.req(rid).max_new
               for rid in obs.record.finished):
            self._seen.add("early stop")
        if violation is not None:
            cause = ""
            if violation.property == "LIVE-NO-PROGRESS" and self.stall_cause is not None:
                cause = f": {self.stall_cause(self._cfg, obs.state)}"
            self._seen.add(f"{violation.property} violated (no divergence){cause}")

    def _pipeline_events(self, previous, obs: Observation) -> None:
        """A context computed over more than one step (a prefill chunk); and, where the engine schedules the next
        batch before the previous one's output is processed (vLLM's async scheduling, SGLang's overlap loop), a
        request preempted (retracted) while its output was in flight (that output lands stale, or is dropped) and
        one finished by a token that landed after it was scheduled again (the late stop's wasted slot)."""
        state, record = obs.state, obs.record
        if any(state.req(rid).phase == RequestPhase.PREFILLING for rid, _ in record.scheduled):
            self._seen.add("prefill chunk (a context over more than one step)")
        if not stateful.pipelined(self._cfg) or previous is None:
            return
        in_flight = {rid for rid, _ in previous.scheduled}
        if in_flight.intersection(record.preempted):
            self._seen.add("preempted with its output in flight (stale output)")
        if {rid for rid, _ in record.scheduled}.intersection(record.finished):
            self._seen.add("finished with its next batch already scheduled (late stop)")

    def _step_events(self, before, after, record) -> None:
        """A queued request whose prefill starts past tokens it did not compute this step (a cache hit that
        saved work); and, for SGLang, the radix tree shrinking, which only its eviction does, a retraction with
        the cache on, and a preemption in a prefill step (only priority preemption preempts there)."""
        if before is None:
            return
        prefill = False
        for rid, tokens in record.scheduled:
            queued = rid >= len(before.requests) or before.req(rid).phase in (
                RequestPhase.PENDING, RequestPhase.WAITING, RequestPhase.PREEMPTED)
            prefill = prefill or queued
            if rid < len(before.requests) and before.req(rid).computed == 0 and after.req(rid).computed > tokens:
                self._seen.add("prefill started past cached tokens")
        if self._cfg.policy != "sglang":
            return
        o = self._cfg.options
        preempting = o.enable_priority_scheduling and not o.disable_priority_preemption
        if not o.disable_radix_cache:
            if after.error is None and after.cached_blocks < before.cached_blocks:
                self._seen.add("radix cache eviction")
            if record.preempted and not preempting:
                self._seen.add("decode retraction with the radix cache on")
        if preempting and prefill:
            # a prefill pass that preempts: only priority preemption does (retraction is decode's)
            if record.preempted:
                self._seen.add("priority preemption")
            if len(record.preempted) >= 2:
                self._seen.add("priority preemption of two or more requests in one pass")

    def undrained(self) -> None:
        """Requests were still unanswered when the drain's step bound (stateful.DRAIN_STEPS) ran out,
        with no property violated on the way: the workload ended without showing how they end."""
        self._seen.add("requests still in flight at the drain bound")

    def end(self) -> None:
        if not self.frozen:
            self.covered.update(self._seen)
            if self._refusal:
                self.by_refusal.update((self._refusal, event) for event in self._seen)

    def diverged(self) -> None:
        self.end()
        self.frozen = True


@dataclasses.dataclass
class ConformanceResult:
    target: str
    seed: int
    steps: int
    seconds: float
    tally: Tally
    # what ended the run, shrunk: a lockstep divergence, or the engine hanging past its step limit (a finding
    # too, reported as ENGINE-ERROR); None when every workload ran to the end in agreement
    divergence: Optional[stateful.Failure]
    refused: bool = False             # the labelled mode: configurations the engine refuses to start with

    @property
    def agreed(self) -> int:
        return self.tally.workloads - (1 if self.divergence else 0)

    def lines(self) -> list[str]:
        t = self.tally
        mode = "configurations the engine REFUSES (labelled mode), " if self.refused else ""
        out = [f"{self.target}: {t.workloads} workloads ({mode}seed {self.seed}, at most {self.steps} actions each, "
               f"{self.seconds:.0f} s): {self.agreed}/{t.workloads} agree with the model"
               + (f" of release {t.release}" if t.release else "")
               + ("" if self.divergence is None else
                  ", then the run stopped at the first divergence (shrunk):"
                  if self.divergence.violation.property == CONFORMANCE else
                  f", then the run stopped: {self.divergence.violation.property} (shrunk):")]
        if self.divergence:
            d = self.divergence
            out += [f"  {d.violation.message}", f"  config: {d.cfg}",
                    "  actions: " + ", ".join(action_code(a) for a in d.actions)]
        out.append("knobs (workloads):")
        out += [f"  {k}: {n}" for k, n in sorted(t.knobs.items())]
        out.append("covered (workloads):")
        out += [f"  {k}: {n}" for k, n in sorted(t.covered.items())]
        if t.by_refusal:
            out.append("by the check the configuration breaks (workloads):")
            out += [f"  {check}: {event}: {n}" for (check, event), n in sorted(t.by_refusal.items())]
        return out


def conformance(target_name: str, workloads: int, seed: int, steps: int = 30,
                step_timeout_s: float = 10.0, refused: bool = False, sync: bool = False) -> ConformanceResult:
    """Run `workloads` examples of the lockstep machine; the first divergence ends the run (shrunk). The
    engine runs its default mode (vLLM: async scheduling), or with `sync` its synchronous loop."""
    target_cls = get_target(target_name)
    if not hasattr(target_cls, "conformance_check"):
        raise ValueError(f"target {target_name!r} runs no model in lockstep")
    configs = stateful.sync_configs(target_cls) if sync else None
    if sync and refused:
        raise ValueError("--sync and --refused: choose one (the refused configurations are drawn in the default mode)")
    tally = Tally(stall_cause=getattr(target_cls, "stall_cause", None))
    machine = stateful.machine_for(target_cls, configs=configs, step_timeout_s=step_timeout_s, tally=tally,
                                   refused=refused)
    hypothesis.seed(seed)(machine)
    run = settings(max_examples=workloads, stateful_step_count=steps, deadline=None, database=None,
                   derandomize=False, print_blob=False, report_multiple_bugs=False,
                   suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    stateful.LAST_FAILURE = None
    start = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=run)
    except stateful.PropertyFailure:
        pass
    return ConformanceResult(target_name, seed, steps, time.perf_counter() - start, tally, stateful.LAST_FAILURE,
                             refused)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m targets.lockstep", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="vllm")
    ap.add_argument("--workloads", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--refused", action="store_true",
                    help="the labelled mode: only configurations the engine refuses to start with (vllm)")
    ap.add_argument("--sync", action="store_true",
                    help="the engine's synchronous loop (vllm: async_scheduling off; sglang: disable_overlap_schedule) "
                         "instead of its default")
    ap.add_argument("--allow-unsupported-release", action="store_true",
                    help="drive an engine release the target does not support, against the model of the nearest "
                         "modelled release at or below it (targets/releases.py)")
    args = ap.parse_args(argv)
    releases.allow_unsupported(args.allow_unsupported_release)
    try:
        result = conformance(args.target, args.workloads, args.seed, args.steps, refused=args.refused, sync=args.sync)
    except TargetUnavailable as exc:   # an unknown name (2), an install or platform problem (4), an adapter (5)
        print(f"targets.lockstep: {exc}", file=sys.stderr)
        return exit_status(exc)
    except ValueError as exc:
        print(f"targets.lockstep: {exc}", file=sys.stderr)
        return 2
    print("\n".join(result.lines()))
    return 1 if result.divergence else 0


if __name__ == "__main__":
    sys.exit(main())
