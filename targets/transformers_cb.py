"""Hugging Face transformers continuous batching (5.19.0, and the releases of `SUPPORTED`) as a target, stepped
synchronously.

The engine runs for real on the CPU: a tiny randomly initialised Llama (built from a config in code,
no download; fp32, sdpa, greedy, EOS disabled, one torch thread, fixed seed), built once per process,
and one `ContinuousBatchingManager` per target whose batch processor is driven one step at a time:
`prepare_next_batch` -> `_generation_step` -> `update_batch` (continuous_api.py:482-604, no thread;
see ../shared/reference/transformers_cb.md §5 and docs/engine-notes/hf_cb.md). Every step runs in a
worker thread joined with the target's time limit (TargetHung past it).

What the engine exposes is mapped to the vocabulary of the `hf_cb` model (model/policies/hf_cb.py), so
states compare field by field: unless `lockstep=False`, the `hf_cb` policy runs beside the engine on the same
actions and is compared after every step (targets/conformance.py `Lockstep`; a divergence is a
`MODEL-CONFORMANCE` violation, the documented one excused by its predicate):
- phase: not yet drained from the input queue = PENDING; in `waiting_requests` = WAITING, or PREEMPTED once
  soft reset (OM:230-234 re-queues a new PENDING state under the same id); in `active_requests` =
  PREFILLING / DECODING from its status; FINISHED / FAILED from the outputs the engine delivers; CANCELLED
  when `clear_cancelled_requests` removed it (scheduler.py:95-110);
- computed = `position_offset`; generated = every token produced so far, those folded into the prompt by a
  soft reset included (`len(initial_tokens)` less the submitted prompt, plus `generated_tokens`), as the model
  keeps `generated` across a soft reset (not the engine's own `_true_initial_tokens` test, requests.py:288,
  which misses an empty prompt: docs/findings/README.md); a request that is done keeps its last values;
- blocks: the request's block table (`alloc.block_table`). A block referenced by several requests
  (`ledger.shared_ref_counts`, prefix sharing) is counted once: in a `PrefixEntry(group, blocks, refs)` of
  the group of its holders (r.shared_blocks = how many of its table entries are shared), the others in
  r.blocks; cached unreferenced blocks (`ledger.cached_blocks`) are one `PrefixEntry(-1, n, 0)` as in the
  model; free_blocks = free sectors * blocks per sector + free blocks of the allocator;
- record: scheduled = (rid, query_length) in batch order; finished / failed from the output queue;
  preempted = soft resets this step; error / error_kind for an engine exception ("deadlock" for the
  RuntimeError of continuous_api.py:509, the engine's own no-progress detector; "crash" otherwise), after
  which every unanswered request is failed as `_handle_critical_error` does (API:1209-1237) and the
  target is dead, as the model's state is.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any, Optional

from model import releases as model_releases
from model.config import EngineConfig
from model.state import Phase, PrefixEntry, Request, State, StepRecord

from . import releases
from .conformance import Lockstep
from .protocol import Add, Answered, Observation, Target, TargetHung, TargetUnavailable, prompt_tokens
from .timing import TimedSteps

# The transformers releases this target drives: the hf_cb policy mirrors 5.19.0 (model/policies/hf_cb.py), and each
# other release listed was installed with `schedproof env transformers==X`, agreed with the policy in lockstep
# (`python -m targets.lockstep --target transformers --workloads 100 --seed 0`) and reproduced the findings of
# docs/findings/README.md: docs/conformance.md, "transformers releases". A release not listed is refused (exit 4):
# the target steps private engine APIs and the policy cites 5.19.0's scheduler, so a release is listed on evidence.
SUPPORTED = ("5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0", "5.25.0")
PINNED = SUPPORTED[0]   # the release the policy mirrors and the `engines` extra installs
DEADLOCK = "No requests can be scheduled and no requests can be offloaded."   # continuous_api.py:509
VOCAB = 512
ANON = -1

_MODEL: Any = None   # the tiny Llama, built once per process


def release_refusal(version: str) -> Optional[str]:
    """Why the target refuses transformers `version`, in one line; None for a supported release."""
    if version in SUPPORTED:
        return None
    return (f"the transformers target supports transformers {', '.join(SUPPORTED)} (it steps private engine APIs; "
            f"each release checked in lockstep, docs/conformance.md); found {version}. Another release beside this "
            f"one: schedproof env transformers=={SUPPORTED[-1]}")


def _check_engine():
    """Import torch and transformers, refusing any transformers release but the supported ones."""
    try:
        import psutil  # noqa: F401  (without it the engine sees 0 bytes of memory on CPU: cache.py:692-701)
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise TargetUnavailable(f"the transformers target needs torch, psutil and transformers (one of "
                                f"{', '.join(SUPPORTED)}) installed ({exc})") from None
    version = str(getattr(transformers, "__version__", "?"))
    releases.gate("transformers", version, release_refusal(version), model_releases.nearest("hf_cb", version))
    return transformers


def tiny_model():
    """The process-wide tiny random Llama (vocab 512, 2 layers, hidden 64, 4 heads, 2 KV heads)."""
    global _MODEL
    if _MODEL is None:
        _check_engine()
        import logging

        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.set_num_threads(1)
        transformers.logging.set_verbosity_error()
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
        cfg._attn_implementation = "sdpa"
        _MODEL = LlamaForCausalLM(cfg).to(torch.float32).eval()
        # transformers 5.19.0 calls gc.collect() as a manager stops (continuous_api.py, ContinuousBatchingManager.stop)
        # and as its batch processor is deleted (ContinuousBatchProcessor.__del__): once or more per workload, and
        # each walks every object the collector tracks, torch's, transformers' and the model's (about 325,000)
        # included. They live as long as the process, so they are taken out of its sight once loaded: the ci search
        # of tests/test_fuzz_transformers.py took 92 s, and 13 s so (bench/gc_heap.py, docs/benchmarks.md). The freeze
        # is the process's: whatever else lives at that moment is frozen too, and freed only when no longer referenced.
        gc.collect()
        gc.freeze()
    return _MODEL


def greedy_reference(action: Add, max_new: Optional[int] = None) -> tuple[int, ...]:
    """What `model.generate` answers greedily for the request (the oracle for finished outputs)."""
    import torch

    model = tiny_model()
    n = action.max_new if max_new is None else max_new
    prompt = prompt_tokens(action, VOCAB)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return tuple(out[0, len(prompt):].tolist())


@dataclasses.dataclass(frozen=True)
class EngineView:
    """What the engine's scheduler holds beyond the shared vocabulary (State.sched of this target)."""

    active: tuple[int, ...] = ()       # `active_requests`, dict order
    waiting: tuple[int, ...] = ()      # `waiting_requests_order`
    block_new: bool = False            # `block_new_requests`
    cached_blocks: int = 0             # `ledger.cached_blocks`: unreferenced hashed blocks, group ones included


class TransformersTarget(Lockstep, TimedSteps, Target):
    name = "transformers"
    real = True
    greedy_output = staticmethod(greedy_reference)   # the output oracle the checker uses for finished requests
    worker_name = "transformers-engine"

    def __init__(self, cfg: EngineConfig, step_timeout_s: float = 10.0, lockstep: Optional[bool] = None):
        # the hf_cb release the installed transformers is held to (model/releases.py: 5.20.2 -> 5.20)
        self.engine_release = model_releases.nearest("hf_cb", str(_check_engine().__version__))
        if cfg.policy != "hf_cb":
            raise TargetUnavailable(f"the transformers target runs engine configs of policy 'hf_cb' (got {cfg.policy!r})")
        if cfg.host_blocks:
            raise TargetUnavailable("the transformers target has no CPU offload pool (host_blocks must be 0)")
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.cfg = cfg
        self.step_timeout_s = step_timeout_s
        o = cfg.options
        kw = {}
        if o is not None:
            kw = dict(scheduler_type=o.scheduler_type, allow_block_sharing=o.allow_block_sharing)
            if o.safety_margin is not None:
                kw["safety_margin"] = float(o.safety_margin)
        model = tiny_model()
        self.manager = model.init_continuous_batching(
            generation_config=GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=-1, pad_token_id=0),
            continuous_batching_config=ContinuousBatchingConfig(
                num_blocks=cfg.num_blocks, page_size=cfg.block_size, max_batch_tokens=cfg.max_num_tokens,
                max_requests_per_batch=cfg.max_batch_size, cpu_offload_space=0.0, seed=0, **kw))
        self.bp = self.manager.batch_processor = self.manager._create_batch_processor()
        self.alloc = next(iter(self.bp.cache.cache_allocators.values()))
        if self.bp.cache.num_blocks != cfg.num_blocks:
            raise TargetUnavailable(f"the engine rounded the pool to {self.bp.cache.num_blocks} blocks "
                                    f"(asked {cfg.num_blocks}): sector geometry not supported")
        self.adds: list[Add] = []
        self.queued: set[int] = set()        # added, not yet drained into the scheduler
        self.drained: set[int] = set()
        self.reset_rids: set[int] = set()    # soft reset at least once
        self.done: dict[int, Answered] = {}
        self.last: dict[int, Any] = {}       # rid -> latest RequestState seen
        self.step_no = 0
        self.error: Optional[str] = None
        self.unusable: Optional[str] = None
        self._step_events: dict[str, list] = {}
        self._prepared: list[tuple[int, int]] = []   # the step's batch, kept when the forward pass raises
        self._instrument()
        self._start_lockstep(cfg, lockstep)   # the hf_cb policy beside the engine, compared after every step

    # -- instrumentation (instance-level wrappers, nothing patched globally) ---------------------
    def _instrument(self) -> None:
        sched = self.bp.scheduler
        orig_add, orig_cancel = sched.add_waiting_request, sched.clear_cancelled_requests

        def add_waiting_request(state):
            rid = _rid(state.request_id)
            if rid in self.drained:
                self._step_events.setdefault("reset", []).append(rid)   # OM:234 re-queues a soft-reset request
            self.drained.add(rid)
            self.queued.discard(rid)
            return orig_add(state)

        def clear_cancelled_requests():
            states = orig_cancel()
            self._step_events.setdefault("cancelled", []).extend(states)
            return states

        sched.add_waiting_request = add_waiting_request
        sched.clear_cancelled_requests = clear_cancelled_requests

    # -- actions ---------------------------------------------------------------------------------
    def add(self, action: Add) -> None:
        assert action.rid == len(self.adds), "request ids are assigned in submission order"
        self.adds.append(action)
        self._lockstep_add(action)
        if self.error is not None:
            return   # the engine is dead: the request is never submitted (as in the model)
        self.queued.add(action.rid)
        self.manager.add_request(prompt_tokens(action, VOCAB), request_id=f"r{action.rid}",
                                 max_new_tokens=action.max_new)

    def cancel(self, rid: int) -> None:
        self._lockstep_cancel(rid)
        if self.error is None:
            self.manager.cancel_request(f"r{rid}")

    def _engine_step(self) -> Optional[list[tuple[int, int]]]:
        bp = self.bp
        if not bp.prepare_next_batch():
            return None
        batch = [(_rid(fs.state.request_id), fs.query_length) for fs in bp.inputs_and_outputs.requests_in_batch]
        self._prepared = batch   # what was scheduled, also when the forward pass below raises
        for fs in bp.inputs_and_outputs.requests_in_batch:
            self.last[_rid(fs.state.request_id)] = fs.state
        bp._generation_step(self.manager.model)
        bp.update_batch()
        return batch

    def step(self) -> Observation:
        if self.unusable:
            raise TargetHung(self.unusable)
        if self.error is not None:
            obs = Observation(self._state(), StepRecord(step=self.step_no, notes=("engine is dead",)), {})
            self._lockstep(obs)
            return obs
        self._step_events = {}
        self._prepared = []
        try:
            box = self._run_timed(self._engine_step)
        except TimeoutError:
            self.unusable = (f"transformers engine step {self.step_no} did not return within "
                             f"{self.step_timeout_s:g} s")
            raise TargetHung(self.unusable) from None

        error = error_kind = None
        failed: list[int] = []
        finished: list[int] = []
        outputs: dict[int, tuple[int, ...]] = {}
        for st in self._step_events.get("cancelled", []):
            rid = _rid(st.request_id)
            if rid not in self.done:
                self.done[rid] = Answered(Phase.CANCELLED, st.position_offset, self._generated(st))
        exc = box.get("exc")
        if exc is not None:
            error = str(exc)
            error_kind = "deadlock" if error == DEADLOCK else "crash"
            self.error = error
            self._remember_live()
            self.manager._fail_all_remaining_requests(exc, self.bp)   # as _handle_critical_error does
        self._remember_live()
        for out in self._drain_outputs():
            rid = _rid(out.request_id)
            st = self.last.get(rid)
            computed = st.position_offset if st is not None else 0
            # tokens produced (the output may report fewer: an empty prompt soft reset, see _generated)
            produced = self._generated(st) if st is not None else len(out.generated_tokens)
            status = getattr(out.status, "name", str(out.status))
            if status == "FINISHED":
                finished.append(rid)
                outputs[rid] = tuple(out.generated_tokens)
                self.done[rid] = Answered(Phase.FINISHED, computed, produced)
            elif status == "FAILED":
                failed.append(rid)
                self.done[rid] = Answered(Phase.FAILED, computed, produced, out.error or "")
        if error is not None:
            # anything the engine did not answer (it should answer all) is failed too, as the model does
            for a in self.adds:
                if a.rid not in self.done and a.rid in self.drained:
                    st = self.last.get(a.rid)
                    self.done[a.rid] = Answered(Phase.FAILED, st.position_offset if st else 0,
                                             self._generated(st) if st else 0, error)
                    failed.append(a.rid)
        batch = box.get("batch") or self._prepared
        resets = list(dict.fromkeys(self._step_events.get("reset", [])))
        self.reset_rids.update(resets)
        record = StepRecord(step=self.step_no, scheduled=tuple(batch), charged=sum(q for _, q in batch),
                            preempted=tuple(resets), finished=tuple(finished), failed=tuple(failed),
                            error=error, error_kind=error_kind,
                            notes=() if batch or error else ("idle step",))
        self.step_no += 1
        obs = Observation(self._state(), record, outputs)
        self._lockstep(obs)
        return obs

    def close(self) -> None:
        self.stop_worker()
        bp = getattr(self, "bp", None)
        if bp is not None:
            self.bp = None
            self.manager.batch_processor = None
            self.manager = None
            self.alloc = None
            self.last.clear()

    # -- observation -----------------------------------------------------------------------------
    def _drain_outputs(self) -> list:
        q = self.manager.output_router.output_queue
        outs = []
        while not q.empty():
            outs.append(q.get_nowait())
        return outs

    def _remember_live(self) -> None:
        s = self.bp.scheduler
        for d in (s.active_requests, s.waiting_requests):
            for rid_s, st in d.items():
                self.last[_rid(rid_s)] = st

    def _state(self) -> State:
        s = self.bp.scheduler if self.bp is not None else None
        active = s.active_requests if s is not None else {}
        waiting = s.waiting_requests if s is not None else {}
        if s is not None and self.error is None:
            self._remember_live()
        ledger = self.alloc.ledger
        tables = {_rid(k): list(v) for k, v in self.alloc.block_table.items()}
        group_blocks = self._group_blocks(ledger)          # group -> ids of its hashed prefix blocks
        in_group = {b: g for g, bs in group_blocks.items() for b in bs}
        first_holder: dict[int, int] = {}
        for rid in sorted(tables):
            for b in tables[rid]:
                first_holder.setdefault(b, rid)
        users: dict[int, set[int]] = {}
        reqs = []
        for a in self.adds:
            rid = a.rid
            table = tables.get(rid, [])
            n_shared = sum(1 for b in table if in_group.get(b) == a.prefix_group)
            # a block of distinct content held by several requests (identical whole contexts de-duplicated,
            # CA:290-311) is counted once, in its first holder
            n_own = sum(1 for b in table if in_group.get(b) != a.prefix_group and first_holder[b] == rid)
            if n_shared:
                users.setdefault(a.prefix_group, set()).add(rid)
            base = Request(rid=rid, prompt=a.prompt, max_new=a.max_new, arrival=0, prefix_group=a.prefix_group,
                           prefix_len=a.prefix_len)
            rid_s = f"r{rid}"
            if rid in self.done:
                d = self.done[rid]
                r = dataclasses.replace(base, phase=d.phase, computed=d.computed, generated=d.generated,
                                        reason=d.reason)
            elif rid_s in active or rid_s in waiting:
                st = active.get(rid_s) or waiting[rid_s]
                status = st.status.name
                if rid_s in waiting:
                    phase = Phase.PREEMPTED if rid in self.reset_rids else Phase.WAITING
                elif status == "DECODING":
                    phase = Phase.DECODING
                else:
                    phase = Phase.PREFILLING
                r = dataclasses.replace(base, phase=phase, computed=st.position_offset, generated=self._generated(st),
                                        blocks=n_own, shared_blocks=n_shared)
            else:
                r = base   # PENDING: still in the input queue
            reqs.append(r)
        cache = [PrefixEntry(g, len(bs), len(users.get(g, ()))) for g, bs in sorted(group_blocks.items())
                 if bs or users.get(g)]
        anon = sum(1 for b in ledger.cached_blocks if b not in in_group)
        if anon:
            cache.append(PrefixEntry(ANON, anon, 0))
        cache.sort(key=lambda e: e.group)
        view = EngineView(active=tuple(_rid(k) for k in active), waiting=tuple(
            _rid(k) for k in (s.waiting_requests_order if s is not None else ())),
            block_new=bool(s.block_new_requests) if s is not None else False,
            cached_blocks=len(ledger.cached_blocks))
        pool = self.bp.cache.pool
        free = pool.num_free_sectors * self.alloc.blocks_per_sector + pool.count_free_blocks(self.alloc.index)
        return State(step=self.step_no, requests=tuple(reqs), free_blocks=free, free_host_blocks=0,
                     sched=view, prefix_cache=tuple(cache), error=self.error)

    def _group_blocks(self, ledger) -> dict[int, set[int]]:
        """The hashed blocks of each prefix group's shared prefix (referenced or cached), found by the chained
        hash of the group's prefix tokens (CA `compute_block_hash` :25-31), as the model's group entries count them."""
        from transformers.generation.continuous_batching.cache_allocators.cache_allocator import compute_block_hash

        page = self.cfg.block_size
        longest: dict[int, Add] = {}
        for a in self.adds:
            if a.prefix_group >= 0 and min(a.prefix_len, a.prompt) >= page:
                if a.prefix_group not in longest or min(a.prefix_len, a.prompt) > min(
                        longest[a.prefix_group].prefix_len, longest[a.prefix_group].prompt):
                    longest[a.prefix_group] = a
        out: dict[int, set[int]] = {}
        for g, a in longest.items():
            tokens = prompt_tokens(a, VOCAB)
            h, blocks = None, set()
            for i in range(min(a.prefix_len, a.prompt) // page):
                h = compute_block_hash(h, tokens[i * page:(i + 1) * page])
                b = ledger.hash_to_block.get(h)
                if b is not None:
                    blocks.add(b)
            out[g] = blocks
        return out

    def _generated(self, st) -> int:
        """Tokens the request has produced: those a soft reset folded into its prompt (OM:230-234,
        requests.py `create_equivalent_initial_request`) plus those since. Counted from the prompt the target
        submitted, not from the engine's `_true_initial_tokens`, which is 0 both for a request never reset and
        for an empty prompt that was (requests.py:288 and :347 test it for truth): docs/findings/README.md."""
        return len(st.initial_tokens) - self.adds[_rid(st.request_id)].prompt + len(st.generated_tokens)

    def unanswered(self) -> list[int]:
        return [a.rid for a in self.adds if a.rid not in self.done]


def _rid(request_id: str) -> int:
    return int(str(request_id).split("__")[0][1:])



