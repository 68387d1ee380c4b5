"""SGLang's own scheduler (sglang 0.5.23) as a target: the real `Scheduler` object, its pools and its tree cache,
with no model. See docs/engine-notes/sglang.md and ../shared/reference/sglang.md.

`Scheduler.__init__` needs a model worker, a tokenizer and ZMQ sockets, so the object is made with
`Scheduler.__new__` (`_build`): the values `__init__` reads from the published `ServerArgs` are set from that same
record, the pools are built as `kv_cache_configurator` builds them for a plain model (a `ReqToTokenPool` of
`max_running_requests` rows, a `TokenToKVPoolAllocator` or, for page size > 1, a `PagedTokenToKVPoolAllocator`, and
a `UnifiedRadixCache`, disabled or not), the numbers `TpModelWorker.get_worker_info` reports are computed as it computes
them (tp_worker.py:557-570), and then SGLang's own `init_*` methods build every component the loop touches
(running status, metrics reporter, schedule policy and `NewTokenRatioTracker`, overlap/future map, DP-attention
adapter, pool observers, invariant checker, load publisher/inquirer, output streamer, batch result processor).
The stand-ins are only what has no scheduling logic: the model worker (`_FakeWorker`, the forward pass), the IPC
sockets (`_Sink`), the grammar manager (no grammars are submitted), the weight updater's offload tags, and a
model config namespace.

One `step` is one iteration of SGLang's event loop: `event_loop_normal` (scheduler.py:2026) with
options.disable_overlap_schedule, else `event_loop_overlap` (scheduler.py:2060, SGLang's default). Either way the
requests added and cancelled since the last step go through `handle_generate_request` (validation, the arrival clip
`init_req_max_new_tokens`, `_add_request_to_queue`) and `abort_request` — what `process_input_requests`' dispatcher
calls —, then `get_next_batch_to_run`. The normal loop then runs `run_batch` + `process_batch_result` of that batch
(the fake forward inside the real `run_batch`) or `on_idle`, then `last_batch := batch`. The overlap loop
(`_iteration_overlap`, docs/engine-notes/sglang_overlap.md) launches the batch through run_batch's overlap path
(FutureMap, CPU streams), queues its result, and processes the PREVIOUS step's result after the launch: a step's
answers are those of the batch launched one step earlier.

Knob mapping (the `sglang` policy's, model/policies/sglang.py): block_size = --page-size; num_blocks * block_size =
the token pool (max_total_num_tokens); max_num_tokens = --max-prefill-tokens; max_batch_size =
--max-running-requests (= pp_max_micro_batch_size, = the request rows); chunked_prefill: --chunked-prefill-size =
options.chunked_prefill_size, else -1 (off); options.schedule_conservativeness, options.context_len (None: the
pool's size), options.ignore_eos (every request's sampling_params.ignore_eos), options.disable_radix_cache
(--disable-radix-cache; off, SGLang's default, builds the production `UnifiedRadixCache` with its Rust tree core).
FCFS.

Tokens: prompts are `sglang_prompt_tokens` (ids 1..511, the model's token identity); the fake model samples
`output_token(rid, index)` (ids 1000..1999) and never EOS. `Stop(rid)` makes rid's next sampled token
`STOP_TOKEN` (0), which every request lists in `sampling_params.stop_token_ids`, so SGLang's own
`Req.check_finished` ends it (FINISH_MATCHED_TOKEN, the token kept). A step's stops apply to the batch whose result
that step processes: in the normal loop the batch it runs (the fake forward samples STOP_TOKEN), under overlap the
batch launched the step before (its queued result's row is rewritten just before `process_batch_result`,
`_apply_stops`). With options.ignore_eos SGLang skips every token-based stop (`_check_token_based_finish`,
schedule_batch.py:1857), so a Stop could never end a request: that target has `early_stops = False` and
refuses `stop`.

Observation (model vocabulary): see `_observe` and `SchedView`. An exception from the scheduler is the step's
`record.error` ("crash"); every unanswered request fails and the target is dead.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
import tempfile
import types
import warnings
from array import array
from typing import Any, Optional

from model import releases as model_releases
from model.config import ConfigError, EngineConfig, cdiv
from model.policies.sglang import IGNORE_EOS_RESERVE_TOKENS, arrival_max_new, bits_float, float_bits
from model.state import Phase, PrefixEntry, Request, State, StepRecord

from . import releases, sglang_stubs
from .conformance import Lockstep, compare
from .protocol import Add, Answered, Observation, Target, TargetHung, TargetUnavailable
from .timing import TimedSteps

PINNED = "0.5.23"
VOCAB = 512            # prompt ids are 1..511 (`sglang_prompt_tokens`)
OUT_BASE, OUT_SPAN = 1000, 1000
MODEL_VOCAB = OUT_BASE + OUT_SPAN   # Req._check_vocab_boundary_finish ends a request on an id >= vocab_size
EMPTY_PROMPT = "input_ids cannot be empty."   # io_struct.py:499
STOP_TOKEN = 0         # no prompt or output token uses id 0: only a `Stop` action samples it

_E: dict[str, Any] = {}   # process-wide: the sglang classes, looked up once
_PUBLISHED: list = [None]  # the target whose ServerArgs the runtime context holds now


def output_token(rid: int, index: int) -> int:
    """The fake model's `index`-th sampled token of request `rid` (ids 1000..1999)."""
    return OUT_BASE + (rid * 977 + index * 31 + 11) % OUT_SPAN


def sglang_prompt_tokens(a: Add) -> list[int]:
    """The prompt's token ids, with exactly the identity the policy's radix cache assumes
    (model/policies/sglang_radix.py): the group's shared prefix (ids 1..200, a function of group and position), then
    ids of this request alone (201..511, of rid and position). Two requests' contexts then agree exactly on the
    positions the model says they share and differ at the first one it says they do not: group ids differ
    between groups, own ids between requests, and each range (outputs are 1000..1999, the one-token prompt of an
    input-length abort is [0]) from the others. protocol.prompt_tokens does not guarantee the last."""
    shared = min(a.prefix_len, a.prompt) if a.prefix_group >= 0 else 0
    group = [1 + (a.prefix_group * 37 + p) % 200 for p in range(shared)]
    own = [201 + (a.rid * 131 + p * 17 + 3) % 311 for p in range(shared, a.prompt)]
    return group + own


def engine_rid(rid: int) -> str:
    """SGLang's request id for `rid`. `abort_request` matches by prefix (`req.rid.startswith(recv_req.rid)`,
    scheduler.py:5688), so ids end in a '.' to keep "r1." from matching "r10."."""
    return f"r{rid}."


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.join(base, "schedproof", f"sglang-{PINNED}")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        root = tempfile.mkdtemp(prefix="schedproof-sglang-")
    return root


def _engine() -> dict[str, Any]:
    """Install the stubs, import the scheduler's modules (about 10 s the first time), once per process."""
    if _E:
        return _E
    if importlib.util.find_spec("sglang") is None:
        raise TargetUnavailable(f"the sglang target needs sglang=={PINNED} installed (--no-deps, plus its "
                                f"scheduler's runtime dependencies: docs/engine-notes/sglang.md)")
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    releases.gate("SGLang", version, None if version == PINNED else
                  f"the sglang target supports SGLang {PINNED} (the release the sglang policy mirrors); found "
                  f"{version}. Another release beside this one: schedproof env sglang=={PINNED}",
                  model_releases.nearest("sglang", version))
    # importing sglang points third-party JIT caches at SGLANG_CACHE_DIR (environ.py:2324); keep them out of ~
    os.environ.setdefault("SGLANG_CACHE_DIR", _cache_dir())
    try:
        sglang_stubs.install()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "Triton is not supported", "Only CUDA ... support AWQ", ...
            import torch
            from sglang.srt.disaggregation.utils import DisaggregationMode
            from sglang.srt.environ import envs
            from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
            from sglang.srt.managers.schedule_batch import FINISH_ABORT
            from sglang.srt.managers.scheduler import Scheduler
            from sglang.srt.managers.utils import GenerationBatchResult
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
            from sglang.srt.runtime_context import get_parallel, get_schedule
            from sglang.srt.sampling.sampling_params import SamplingParams
            from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except Exception as exc:   # noqa: BLE001 - a missing module, or an import that fails on this machine
        raise TargetUnavailable(f"the sglang target cannot import SGLang {PINNED}'s scheduler: "
                                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    if "SGLANG_LOGGING_LEVEL" not in os.environ:
        # retraction warnings and the error log of every refused prompt would repeat for every step a search takes
        logging.getLogger("sglang").setLevel(logging.CRITICAL)
    _E.update((k, v) for k, v in locals().items() if k != "version")   # the classes and functions imported above
    _E["release"] = model_releases.nearest("sglang", version)   # the modelled release the engine is held to
    return _E


@dataclasses.dataclass(frozen=True)
class SchedView:
    """What SGLang's scheduler keeps between iterations (State.sched of this target)."""

    ratio_bits: int = 0                 # new_token_ratio_tracker.current, as its IEEE-754 bits (integers only: ITF)
    batch_is_full: bool = False         # running_batch.batch_is_full (the admission latch)
    running: tuple[int, ...] = ()       # running_batch.reqs, in batch order
    waiting: tuple[int, ...] = ()       # waiting_queue, front first
    chunked: Optional[int] = None       # chunked_req (the one in-flight chunked prefill)

    @property
    def new_token_ratio(self) -> float:
        return bits_float(self.ratio_bits)


class _Sink:
    """A ZMQ socket stand-in: keeps what the scheduler sends (the output streamer's batches, abort outputs)."""

    closed = False

    def __init__(self):
        self.sent: list = []

    def send_output(self, *args, **kwargs):
        self.sent.append(args)

    def send_pyobj(self, obj, *args, **kwargs):
        self.sent.append((obj,))


class _FakeWorker:
    """The model worker: `forward_batch_generation` samples one token per request of the batch (run_batch calls it:
    the non-overlap path at scheduler.py:4870, the overlap path at 4700). A request mid-chunk gets a token too (the
    real sampler does; process_batch_result_prefill drops it). The token's output index comes from the KV the
    forward covers, current at forward time in both loops: the batch's allocation has already advanced
    `kv_committed_len` (prefill: to the whole context; decode: +1 for the input token, allocation.py:684-686), so
    the token sampled now is output `kv_committed_len - len(origin_input_ids)`. `len(output_ids)` would lag by one
    under overlap, where the previous batch's token is still in flight. Stops are sampled here only in the normal
    loop; under overlap `SglangTarget._apply_stops` writes them into the queued result."""

    def __init__(self, target: "SglangTarget"):
        self.target = target
        self.model_runner = None   # set by _build

    def forward_batch_generation(self, batch, **kwargs):
        E, t = _E, self.target
        ids = []
        for req in batch.reqs:
            rid = t._rid_of[req.rid]
            mid_chunk = req is t.sched.chunked_req and batch.forward_mode.is_extend()
            if not t.overlap and rid in t.stopping and not mid_chunk:
                t.stopping.discard(rid)
                ids.append(STOP_TOKEN)
            else:
                ids.append(output_token(rid, int(req.kv.kv_committed_len) - len(req.origin_input_ids)))
        return E["GenerationBatchResult"](next_token_ids=E["torch"].tensor(ids, dtype=E["torch"].int64),
                                          can_run_cuda_graph=False)


class _Grammars:
    """No request carries a grammar; the few calls the scheduler makes on its GrammarManager."""

    grammar_queue: tuple = ()

    def has_waiting_grammars(self):
        return False

    def process_req_with_grammar(self, req):
        return False

    def abort_requests(self, recv_req):
        pass


class SglangTarget(Lockstep, TimedSteps, Target):
    name = "sglang"
    real = True
    early_stops = True   # per instance: False with options.ignore_eos (see `stop`)
    policy = "sglang"
    worker_name = "sglang-scheduler"

    @staticmethod
    def stall_cause(cfg: EngineConfig, state: State) -> str:
        """Why nothing can move, for the conformance tally: with nothing running or chunking, the head of the
        queue is refused on the empty engine, either because its page-rounded context plus a page exceeds the pool
        (#39271's mechanism) or, with ignore_eos and the radix cache off (the only case that takes that admission
        path), because the arrival clip left it one token too many for admission's reserve (docs/findings/README.md,
        SGLang 1 and 2)."""
        view = state.sched
        if view.running or view.chunked is not None or not view.waiting:
            return "another cause"
        head, page = state.req(view.waiting[0]), cfg.block_size
        paged = cdiv(head.prompt + head.generated, page) * page + page
        free = state.free_blocks * page
        left = arrival_max_new(cfg, head.prompt, head.max_new) - head.generated
        if paged > free:
            return "the head's page-rounded prompt plus a page exceeds the pool (page rounding, #39271)"
        clip_path = cfg.options.ignore_eos and cfg.options.disable_radix_cache
        if clip_path and free - paged - left <= IGNORE_EOS_RESERVE_TOKENS:
            return "the head's max_new clipped to the memory bound, one token over ignore_eos admission (the clip stall)"
        return "another cause"

    def __init__(self, cfg: EngineConfig, step_timeout_s: float = 10.0, lockstep: Optional[bool] = None):
        self.engine_release = _engine()["release"]
        if cfg.policy != "sglang":
            raise TargetUnavailable(f"the sglang target runs engine configs of policy 'sglang' (got {cfg.policy!r})")
        o = cfg.options
        if o is None:
            raise ConfigError("engine.options", "missing: the sglang policy's Options")
        if cfg.host_blocks:
            raise TargetUnavailable("the sglang target has no hierarchical cache (host_blocks must be 0)")
        if cfg.chunk_unit:
            raise ConfigError("engine.chunk_unit", "SGLang chunks to the remaining chunk budget, page-aligned; "
                                                   "there is no chunk unit")
        self.cfg = cfg
        self.step_timeout_s = step_timeout_s
        self.early_stops = not o.ignore_eos
        self.page = cfg.block_size
        self.capacity = cfg.num_blocks * cfg.block_size
        self.adds: list[Add] = []
        self.arrival: dict[int, int] = {}
        self.new: list[int] = []
        self.cancels: list[int] = []
        self.cancelled: set[int] = set()     # cancels that reached the engine
        self._cancelled_now: list[int] = []  # cancelled while queued: answered by abort_request itself
        self.refused: dict[int, str] = {}    # rid -> SGLang's message for a prompt refused at arrival
        self.stopping: set[int] = set()
        self.reqs: dict[int, Any] = {}       # rid -> SGLang Req, kept after it is answered
        self._rid_of: dict[str, int] = {}
        self.done: dict[int, Answered] = {}
        self.step_no = 0
        self.error: Optional[str] = None
        self.unusable: Optional[str] = None
        self._build(cfg)
        self._start_lockstep(cfg, lockstep)   # the sglang policy beside the engine, compared after every step

    # -- building the scheduler ------------------------------------------------------------
    def _server_args(self, cfg: EngineConfig):
        E, o = _E, cfg.options
        return E["ServerArgs"](
            model_path="dummy", device="cpu", attention_backend="torch_native", random_seed=0,
            page_size=cfg.block_size, max_total_tokens=self.capacity, max_prefill_tokens=cfg.max_num_tokens,
            max_running_requests=cfg.max_batch_size, pp_max_micro_batch_size=cfg.max_batch_size,
            chunked_prefill_size=o.chunked_prefill_size if cfg.chunked_prefill else -1,
            schedule_policy="fcfs", schedule_conservativeness=float(o.schedule_conservativeness),
            enable_priority_scheduling=bool(o.enable_priority_scheduling),
            schedule_low_priority_values_first=bool(o.schedule_low_priority_values_first),
            disable_priority_preemption=bool(o.disable_priority_preemption),
            priority_scheduling_preemption_threshold=int(o.priority_scheduling_preemption_threshold),
            disable_radix_cache=bool(o.disable_radix_cache),
            disable_overlap_schedule=bool(o.disable_overlap_schedule),
            skip_tokenizer_init=True)

    def _publish(self) -> None:
        """Make this target's ServerArgs the process's (the scheduler reads `get_schedule()` / `get_parallel()`
        while it runs, e.g. prefill_max_requests and pp_max_micro_batch_size): once at build, and again before a
        step when another target has published its own since."""
        if _PUBLISHED[0] is self:
            return
        _E["set_global_server_args_for_scheduler"](self.server_args)
        _E["get_parallel"]().override_permanently(tp_rank=0, attn_tp_rank=0, attn_cp_rank=0, attn_dp_rank=0,
                                                  pp_rank=0, dp_rank=0)
        _PUBLISHED[0] = self

    def _build(self, cfg: EngineConfig) -> None:
        E, o = _E, cfg.options
        torch = E["torch"]
        try:
            self.server_args = self._server_args(cfg)
            self._publish()
        except Exception as exc:   # noqa: BLE001 - SGLang's own validation refuses the configuration
            raise ConfigError("engine", f"SGLang refuses the configuration: {_one_line(exc)}") from None
        gs = E["get_schedule"]()
        P, C, N = cfg.block_size, self.capacity, cfg.max_batch_size
        context_len = o.context_len if o.context_len is not None else C
        s = E["Scheduler"].__new__(E["Scheduler"])
        self.sched = s
        # -- what __init__ reads from the published ServerArgs (scheduler.py:465-545)
        s.server_args = self.server_args
        s.is_initializing = False
        s.forward_ct = 0
        s.processed_tokens_counter = 0
        s.cur_batch_for_debug = None
        s.schedule_policy = gs.schedule_policy
        s.enable_priority_scheduling = gs.enable_priority_scheduling
        s.abort_on_priority_when_disabled = gs.abort_on_priority_when_disabled
        s.schedule_low_priority_values_first = gs.schedule_low_priority_values_first
        s.priority_scheduling_preemption_threshold = gs.priority_scheduling_preemption_threshold
        s.enable_lora, s.enable_lora_overlap_loading, s.max_loras_per_batch = False, False, 0
        # enable_overlap = not disable_overlap_schedule and not use_mlx() (scheduler.py:500-502), read back from the
        # validated ServerArgs (no override turns it off for this CPU config); it must be set before init_overlap,
        # init_dp_attn_adapter and init_batch_result_processor, which copy it (scheduler.py:2502, 2667)
        self.overlap = s.enable_overlap = not bool(self.server_args.disable_overlap_schedule)
        s.enable_overlap_mlx = s.enable_pdmux = False
        s.skip_tokenizer_init, s.stream_interval = True, 1
        s.spec_algorithm = E["SpeculativeAlgorithm"].from_string(None)
        s.page_size = P
        for flag in ("enable_hierarchical_cache", "enable_lmcache", "enable_session_radix_cache",
                     "enable_hicache_storage", "enable_unified_cache_external_linker", "enable_decode_hicache",
                     "enable_hisparse", "attn_dp_enabled", "enable_unified_memory", "require_mlp_sync"):
            setattr(s, flag, False)
        s.max_recv_per_poll = E["envs"].SGLANG_SCHEDULER_MAX_RECV_PER_POLL.get()
        s.max_new_tokens_limit = E["envs"].SGLANG_MAX_NEW_TOKENS_LIMIT.get()
        # -- the model: a plain decoder; a namespace for what the scheduler reads of ModelConfig
        s.model_config = types.SimpleNamespace(
            context_len=context_len, is_multimodal=False, is_encoder_decoder=False, vocab_size=MODEL_VOCAB,
            hf_eos_token_id=None, think_end_ids=None, self_opened_think_start_ids=None,
            request_selectable_think_end_id_sequences=None, num_key_value_heads=1, is_generation=True)
        worker = _FakeWorker(self)
        # no n-gram embedding: its manager's one hook (scheduler.py:4018) passes the batch through
        ngram = types.SimpleNamespace(prepare_for_forward=lambda batch, chunked_req=None: batch)
        worker.model_runner = types.SimpleNamespace(attn_backend=None, prefill_aware_swa=False,
                                                    ngram_embedding_manager=ngram, forward_stream=None)
        worker.model_config = types.SimpleNamespace(use_ngram_embedding=False)
        s.tp_worker = s.model_worker = worker
        s.draft_worker = None
        s.tokenizer = None
        s.is_generation = True
        s.disaggregation_mode = E["DisaggregationMode"].NULL
        s.rust_server = None
        s.mm_receiver = None
        s.scripted_scheduler_hook = None
        s.external_corpus_manager = None
        s.ipc_channels = types.SimpleNamespace(send_to_detokenizer=_Sink(), send_to_tokenizer=_Sink(),
                                               send_metrics_from_scheduler=_Sink(), recv_from_rpc=None)
        s.load_snapshot_writer = s.recv_from_tokenizer = s.idle_sleeper = None   # init_ipc_channels, not rank 0
        s.weight_updater = types.SimpleNamespace(offload_tags=set())
        s.grammar_manager = _Grammars()
        # -- the pools and the tree cache, as kv_cache_configurator builds them for a plain model
        s.req_to_token_pool = E["ReqToTokenPool"](size=N, max_context_len=context_len + 4, device="cpu",
                                                  enable_memory_saver=False)
        if P == 1:
            s.token_to_kv_pool_allocator = E["TokenToKVPoolAllocator"](C, torch.int64, "cpu", None, False)
        else:
            s.token_to_kv_pool_allocator = E["PagedTokenToKVPoolAllocator"](C, P, torch.int64, "cpu", None, False)
        s.tree_cache = E["UnifiedRadixCache"](E["CacheInitParams"](
            disable=bool(o.disable_radix_cache), req_to_token_pool=s.req_to_token_pool,
            token_to_kv_pool_allocator=s.token_to_kv_pool_allocator, page_size=P,
            tree_components=(E["ComponentType"].FULL,)))
        s.is_hybrid_swa = s.is_hybrid_ssm = False
        s.sliding_window_size = None
        s.full_tokens_per_layer, s.swa_tokens_per_layer = C, 0
        s.disable_radix_cache = bool(o.disable_radix_cache)
        s.decode_offload_manager = None
        s.hisparse_coordinator = None
        # -- TpModelWorker.get_worker_info (tp_worker.py:557-570)
        s.max_total_num_tokens = C
        s.max_prefill_tokens = gs.max_prefill_tokens
        s.max_running_requests = N
        s.max_queued_requests = gs.max_queued_requests
        s.max_req_len = min(context_len - 1, C - 1)
        s.max_req_input_len = s.max_req_len - 5
        s.random_seed, s.device, s.forward_stream = 0, "cpu", None
        if self.overlap:
            # run_scheduler's streams (scheduler.py:1159, 1993-2004), as torch.cpu streams: init_overlap builds
            # forward_stream_ctx / copy_stream from them, and run_batch's overlap path waits and records on them
            s.forward_stream = worker.model_runner.forward_stream = torch.cpu.Stream()
            s.schedule_stream = torch.cpu.Stream()
        # set by run_event_loop (scheduler.py:2007): False on CPU (SGLANG_ENABLE_WAR_BARRIER defaults off)
        s._war_barrier_enabled = False
        s.min_free_slots_delayer = None
        # -- init_chunked_prefill (scheduler.py:1351) without its multimodal/Transformers-backend branch
        s.chunked_prefill_size = gs.chunked_prefill_size if (gs.chunked_prefill_size or 0) > 0 else None
        s.prefill_decode_interval = gs.prefill_decode_interval or 0
        s._prefill_decode_interval_remaining = 0
        s.prefill_decode_interval_min_bs = gs.prefill_decode_interval_min_bs
        s.chunked_req = None
        s._pending_chunked_abort_req = None
        s.is_mixed_chunk = False
        s.dynamic_chunk_sizer = None
        s.truncation_align_size = None
        # -- SGLang's own component builders
        s.init_metrics_collector()
        s.init_running_status()
        s.init_diffusion_llm()   # dllm_config None, an empty DllmManager
        s.init_metrics_reporter()
        s.scheduler_stage_metrics = s.metrics_reporter.scheduler_stage_metrics
        s.init_kv_events_publisher()
        s.init_schedule_policy()
        s.init_overlap()
        s.maybe_init_ngram_embedding()
        s.init_mamba_truncation_align()
        s.init_dp_attn_adapter()
        s.init_pool_stats_observer()
        s.init_invariant_checker()
        s.init_load_publisher()
        s.init_load_inquirer()
        s.init_output_streamer()
        s.init_batch_result_processor()
        # the torch profiler hook run_batch calls (its manager needs the TP process groups)
        s.profiler_manager = types.SimpleNamespace(_profile_batch_predicate=lambda batch: None)
        self.pool = s.token_to_kv_pool_allocator
        if self.overlap:
            # what event_loop_overlap sets on entry (scheduler.py:2063-2066); init_running_status reset them to
            # False / an empty deque. They persist across steps: the loop is never re-entered (entry would drop
            # the queued result).
            s.enable_skip_finishing_decode = True
            s.result_queue = collections.deque()

    # -- actions ---------------------------------------------------------------------------
    def add(self, action: Add) -> None:
        assert action.rid == len(self.adds), "request ids are assigned in submission order"
        self.adds.append(action)
        self.arrival[action.rid] = self.step_no
        self.new.append(action.rid)
        self._lockstep_add(action)

    def cancel(self, rid: int) -> None:
        self.cancels.append(rid)
        self._lockstep_cancel(rid)

    def stop(self, rid: int) -> None:
        if not self.early_stops:
            raise NotImplementedError("the sglang target cannot stop a request early with options.ignore_eos: "
                                      "SGLang skips every stop token then (schedule_batch.py:1857)")
        self.stopping.add(rid)
        self._lockstep_stop(rid)

    def _submit(self, rid: int) -> None:
        E, a = _E, self.adds[rid]
        if a.prompt == 0:
            # GenerateReqInput refuses it before the scheduler (io_struct.py:490-499); the scheduler itself would
            # fail an assertion releasing its KV (mem_cache/common.py:403)
            self.done[rid] = Answered(Phase.REJECTED, 0, 0, EMPTY_PROMPT)
            self._rejected_now.append(rid)
            return
        sp = E["SamplingParams"](max_new_tokens=a.max_new, ignore_eos=bool(self.cfg.options.ignore_eos),
                                 stop_token_ids=[STOP_TOKEN])
        sp.normalize(None)
        recv = E["TokenizedGenerateReqInput"](
            rid=engine_rid(rid), input_text=None, input_ids=array("q", sglang_prompt_tokens(a)), input_embeds=None,
            mm_inputs=None, token_type_ids=None, sampling_params=sp, return_logprob=False, logprob_start_len=-1,
            top_logprobs_num=0, token_ids_logprob=None, stream=False,
            # the workload's priority only where the engine ranks by it: without priority scheduling SGLang ignores
            # one (abort_on_priority_when_disabled is off by default, scheduler.py:3527-3531)
            priority=a.priority if self.cfg.options.enable_priority_scheduling else None)
        self._rid_of[engine_rid(rid)] = rid
        self.sched.handle_generate_request(recv)
        for req in self.sched.waiting_queue[::-1]:
            if req.rid == engine_rid(rid):
                self.reqs[rid] = req
                if isinstance(req.to_finish, _E["FINISH_ABORT"]):
                    # refused at arrival (validate_input_length, the memory clip): queued with its prompt replaced
                    # by the one token [0], answered by a 1-token prefill when it reaches the front
                    self.refused[rid] = str(req.to_finish.message)
                break

    def _cancel(self, rid: int) -> None:
        """SGLang's abort path (`abort_request`, scheduler.py:5675): a queued request is removed and released at
        once (answered now, no finish reason set); a running one gets `to_finish = FINISH_ABORT`, runs in the next
        batch and is answered by that batch's result processing; the in-flight chunked request is aborted by
        `process_pending_chunked_abort` at the start of the next `get_next_batch_to_run`."""
        req = self.reqs.get(rid)
        if req is None or rid in self.done or req.finished():
            return
        self.cancelled.add(rid)
        self.sched.abort_request(_E["AbortReq"](rid=engine_rid(rid)))
        if not self._in_engine(req):
            self._cancelled_now.append(rid)

    def _in_engine(self, req) -> bool:
        """Where the scheduler keeps a request it has not answered: the chunk slot, the waiting queue, the running
        batch, the last batch (a prefill merged at the next schedule), or, under overlap, the batch whose result
        is queued (a request dropped from running by `_reqs_finishing_inflight`, scheduler.py:4444-4474, waits
        there for its last token)."""
        s = self.sched
        return (req is s.chunked_req or any(r is req for r in s.waiting_queue)
                or any(r is req for r in s.running_batch.reqs)
                or (s.last_batch is not None and any(r is req for r in s.last_batch.reqs))
                or any(r is req for b, _ in s.result_queue for r in b.reqs))

    def _ingest(self) -> None:
        """In place of `ingest_requests` (scheduler.py:2030 / 2078): this step's arrivals, then its cancels."""
        for rid in self.new:
            self._submit(rid)
        self.new = []
        for rid in self.cancels:
            self._cancel(rid)
        self.cancels = []

    def _scheduled(self, batch) -> list[tuple[int, int]]:
        if not batch:
            return []
        if batch.forward_mode.is_extend():
            return [(self._rid_of[r.rid], n) for r, n in zip(batch.reqs, batch.extend_lens)]
        return [(self._rid_of[r.rid], 1) for r in batch.reqs]

    def _iteration(self):
        return self._iteration_overlap() if self.overlap else self._iteration_normal()

    # -- one iteration of event_loop_normal ------------------------------------------------
    def _iteration_normal(self):
        s = self.sched
        self._publish()
        self._ingest()
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        s.cur_batch_for_debug = batch
        scheduled = self._scheduled(batch)
        if batch:
            result = s.run_batch(batch)
            s.process_batch_result(batch, result)
        else:
            s._sched_idled = True
            s.on_idle()
        s.last_batch = batch
        return scheduled

    # -- one iteration of event_loop_overlap ------------------------------------------------
    def _iteration_overlap(self):
        """One pass of event_loop_overlap's body (scheduler.py:2078-2131), with `result_queue` and `last_batch`
        kept on the scheduler between steps."""
        s = self.sched
        self._publish()
        self._ingest()                                                          # SC:2078
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)   # SC:2084-2089
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        s.cur_batch_for_debug = batch
        disable_overlap_for_batch = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)  # SC:2090-2092
        if disable_overlap_for_batch:   # SC:2096-2097 (the unified-memory flush, SC:2101-2105, is off here)
            self._pop_and_process()
        scheduled = self._scheduled(batch)
        if batch:                                                               # SC:2108-2112
            batch_result = s.run_batch(batch)
            s._apply_war_barrier()
            s.result_queue.append((batch.copy(), batch_result))
        else:                                                                   # SC:2113-2115
            batch_result = None
            s._sched_idled = True
        if s.last_batch:                                                        # SC:2118-2120
            if not disable_overlap_for_batch:
                self._pop_and_process()
        elif batch is None:                                                     # SC:2121-2123
            s.on_idle()
        if s.is_generation:                                                     # SC:2127-2128 (no-op: no grammar)
            s.launch_batch_sample_if_needed(batch_result, batch)
        s.last_batch = batch                                                    # SC:2131
        return scheduled

    def _pop_and_process(self) -> None:
        """event_loop_overlap's `pop_and_process` (scheduler.py:2068-2071), with this step's stops applied."""
        s = self.sched
        tmp_batch, tmp_result = s.result_queue.popleft()
        self._apply_stops(tmp_batch, tmp_result)
        s.process_batch_result(tmp_batch, tmp_result)

    def _apply_stops(self, batch, result) -> None:
        """Under overlap, make a stopping request's token in the result about to be processed `STOP_TOKEN`: only a
        row that result processing commits — not a finished or retracted request's (the overshoot row, skipped by
        batch_result_processor.py:1022-1027; prefill 308-312, 343-349), and not a middle chunk's (a prefill row
        commits only when `inflight_middle_chunks <= 0`, batch_result_processor.py:308-312; the batch copy carries
        no chunked_req, schedule_batch.py:3992). A stop for a request without such a row here stays pending."""
        if not self.stopping:
            return
        rows = [i for i, req in enumerate(batch.reqs)
                if self._rid_of[req.rid] in self.stopping and not req.finished() and not req.is_retracted
                and (not batch.forward_mode.is_extend() or req.inflight_middle_chunks <= 0)]
        if not rows:
            return
        if result.copy_done is not None:
            result.copy_done.synchronize()
        ids = result.next_token_ids.clone()   # not in place: the FutureMap may hold the same tensor
        for i in rows:
            ids[i] = STOP_TOKEN
            self.stopping.discard(self._rid_of[batch.reqs[i].rid])
        result.next_token_ids = ids

    def step(self) -> Observation:
        if self.unusable:
            raise TargetHung(self.unusable)
        if self.error is not None:
            obs = Observation(self._state(), StepRecord(step=self.step_no, notes=("engine is dead",)), {})
            self._lockstep(obs)
            return obs
        before = {rid: req.retraction_count for rid, req in self.reqs.items() if rid not in self.done}
        self._cancelled_now = []
        self._rejected_now: list[int] = []
        try:
            box = self._run_timed(self._iteration)
        except TimeoutError:
            self.unusable = f"sglang scheduler step {self.step_no} did not return within {self.step_timeout_s:g} s"
            raise TargetHung(self.unusable) from None
        scheduled = tuple(box.get("batch") or ())
        finished: list[int] = []
        failed: list[int] = []
        rejected: list[int] = list(self._rejected_now)
        outputs: dict[int, tuple[int, ...]] = {}
        error = error_kind = None
        exc = box.get("exc")
        if exc is not None:
            error, error_kind = f"{type(exc).__name__}: {_one_line(exc)}", "crash"
            self.error = error
            for a in self.adds:
                if a.rid not in self.done:
                    req = self.reqs.get(a.rid)
                    self.done[a.rid] = Answered(Phase.FAILED, _computed(req), _generated(req), error)
                    failed.append(a.rid)
            preempted: tuple[int, ...] = ()
        else:
            waiting = self.sched.waiting_queue
            preempted = tuple(self._rid_of[r.rid] for r in waiting
                              if self._rid_of[r.rid] in before and r.retraction_count > before[self._rid_of[r.rid]])
            for rid in self._cancelled_now:
                req = self.reqs[rid]
                self.done[rid] = Answered(Phase.CANCELLED, _computed(req), _generated(req))
            for rid, req in sorted(self.reqs.items()):
                if rid in self.done or not req.finished():
                    continue
                answer = self._answer(rid, req)
                self.done[rid] = answer
                {Phase.FINISHED: finished, Phase.FAILED: failed, Phase.REJECTED: rejected}.get(
                    answer.phase, []).append(rid)
                if answer.phase == Phase.FINISHED:
                    outputs[rid] = tuple(req.output_ids)
        record = StepRecord(step=self.step_no, scheduled=scheduled, charged=sum(n for _, n in scheduled),
                            preempted=preempted, finished=tuple(finished), failed=tuple(failed),
                            rejected=tuple(rejected), error=error, error_kind=error_kind,
                            notes=() if scheduled or error else ("idle step",))
        self.step_no += 1
        obs = Observation(self._state(), record, outputs)
        self._lockstep(obs)
        return obs

    def lockstep_diff(self, m: Observation, e: Observation):
        return lockstep_diff(m, e)

    def lockstep_adopt(self, m: Observation, e: Observation) -> Optional[Observation]:
        return adopt_requeue_order(m, e)

    def unanswered(self) -> list[int]:
        return [a.rid for a in self.adds if a.rid not in self.done]

    def _answer(self, rid: int, req) -> Answered:
        """How SGLang answered a request it reports finished: its finish reason, or the abort it was given."""
        reason = req.finished_reason
        if isinstance(reason, _E["FINISH_ABORT"]):
            msg = str(getattr(reason, "message", "") or "")
            if rid in self.cancelled:
                return Answered(Phase.CANCELLED, _computed(req), _generated(req))
            if rid in self.refused:
                return Answered(Phase.REJECTED, 0, 0, self.refused[rid])
            return Answered(Phase.FAILED, _computed(req), _generated(req), msg)
        return Answered(Phase.FINISHED, _computed(req), _generated(req))

    def close(self) -> None:
        self.stop_worker()

    # -- observation -----------------------------------------------------------------------
    def _state(self) -> State:
        s = self.sched
        rids = self._rid_of
        if self.error is not None:
            return State(step=self.step_no, requests=tuple(self._observe(a.rid) for a in self.adds),
                         free_blocks=self.cfg.num_blocks, free_host_blocks=0, sched=SchedView(), error=self.error)
        view = SchedView(
            ratio_bits=float_bits(float(s.new_token_ratio_tracker.current)),
            batch_is_full=bool(s.running_batch.batch_is_full),
            running=tuple(rids[r.rid] for r in s.running_batch.reqs),
            waiting=tuple(rids[r.rid] for r in s.waiting_queue),
            chunked=rids[s.chunked_req.rid] if s.chunked_req is not None else None)
        cache = ()
        if not self.cfg.options.disable_radix_cache:   # as the policy shows the tree (sglang.with_cache_view)
            tree, rows = s.tree_cache, sum(1 for r in self.reqs.values() if r.kv.holds_kv)
            cache = (PrefixEntry(-1, tree.evictable_size() // self.page, 0),
                     PrefixEntry(-1, tree.protected_size() // self.page, rows))
        return State(step=self.step_no, requests=tuple(self._observe(a.rid) for a in self.adds),
                     free_blocks=self.pool.available_size() // self.page, free_host_blocks=0, sched=view,
                     prefix_cache=cache)

    def _observe(self, rid: int) -> Request:
        a = self.adds[rid]
        base = dict(rid=rid, prompt=a.prompt, max_new=a.max_new, arrival=self.arrival[rid],
                    prefix_group=a.prefix_group, prefix_len=a.prefix_len, priority=a.priority)
        req = self.reqs.get(rid)
        if rid in self.done:
            d = self.done[rid]
            return Request(**base, phase=d.phase, computed=d.computed, generated=d.generated, reason=d.reason,
                           preemptions=req.retraction_count if req is not None else 0)
        if req is None:
            return Request(**base)   # PENDING: not through handle_generate_request yet
        s = self.sched
        if req is s.chunked_req:
            phase = Phase.PREFILLING
        elif any(r is req for r in s.waiting_queue):
            phase = Phase.PREEMPTED if req.retraction_count > 0 else Phase.WAITING
        elif self._in_engine(req):
            phase = Phase.DECODING   # in the running batch, or prefilled in last_batch and merged next iteration
        else:   # not where the scheduler keeps requests, yet not answered: the adapter lost track of it
            raise AssertionError(f"request {rid} is in no queue or batch of the scheduler and was not answered")
        shared = int(req.kv.cache_protected_len) // self.page if req.kv.holds_kv else 0
        return Request(**base, phase=phase, computed=_computed(req), generated=_generated(req),
                       blocks=_pages(req, self.page) - shared, shared_blocks=shared,
                       preemptions=req.retraction_count)


def lockstep_diff(m: Observation, e: Observation):
    """conformance.compare, then what the sglang model keeps beyond it: the record's preemptions, finishes, failures
    and rejections, each request's retraction count, and the scheduler's memory: the queues in order, the chunked
    request, the `batch_is_full` latch and `new_token_ratio` (the engine's float, which the model computes the same
    way, so equal to the last bit)."""
    diff = compare(m, e)
    if diff is not None:
        return diff
    if m.record.preempted != e.record.preempted:   # in re-queue order, both
        return "record.preempted", m.record.preempted, e.record.preempted
    for f in ("finished", "failed", "rejected"):      # a step's answers, as sets (the target reads them by rid)
        if sorted(getattr(m.record, f)) != sorted(getattr(e.record, f)):
            return f"record.{f}", getattr(m.record, f), getattr(e.record, f)
    for rm, re_ in zip(m.state.requests, e.state.requests):
        if rm.preemptions != re_.preemptions:
            return f"r{rm.rid}.preemptions", rm.preemptions, re_.preemptions
        if rm.shared_blocks != re_.shared_blocks:
            return f"r{rm.rid}.shared_blocks", rm.shared_blocks, re_.shared_blocks
    if m.state.prefix_cache != e.state.prefix_cache:   # the radix cache's (evictable, protected) pages
        return "radix cache", m.state.prefix_cache, e.state.prefix_cache
    if m.state.error is not None or e.state.error is not None:
        return None
    ms, es = m.state.sched, e.state.sched
    for name, mv, ev in (("running batch", ms.running, es.running), ("waiting queue", ms.waiting, es.waiting),
                         ("chunked request", ms.chunked if ms.chunked >= 0 else None, es.chunked),
                         ("batch_is_full", ms.batch_is_full, es.batch_is_full),
                         ("new_token_ratio", ms.ratio, es.new_token_ratio)):
        if mv != ev:
            return name, mv, ev
    return None


def adopt_requeue_order(m: Observation, e: Observation) -> Optional[Observation]:
    """SGLang re-queues the requests one pass preempts for priority in the iteration order of a Python set of
    Req objects (schedule_policy.py preempt_to_schedule: `preemptible_reqs = set(...)`, then
    `preempt_list.extend(preemptible_reqs)`; scheduler.py:4320-4322 queues them in that order), an order of
    memory addresses; the policy re-queues them in running-batch order. When the engine's queue is the model's
    with exactly those requests in another order, the model takes the engine's order: in the queue, in the
    queue-entry order priority sorting reads, and in the step's record. Anything else stays for lockstep_diff."""
    block = getattr(m.state.sched, "preempted_for_priority", ())
    if len(block) < 2 or m.state.error is not None or e.state.error is not None:
        return None
    members = set(block)
    order = tuple(x for x in e.state.sched.waiting if x in members)

    def reorder(seq: tuple[int, ...]) -> tuple[int, ...]:
        taken = iter(order)
        return tuple(next(taken) if x in members else x for x in seq)

    s = m.state.sched
    if order == block or sorted(order) != sorted(block) or reorder(s.waiting) != e.state.sched.waiting:
        return None
    sched = dataclasses.replace(s, waiting=reorder(s.waiting), entries=reorder(s.entries),
                                preempted_for_priority=order)
    return Observation(dataclasses.replace(m.state, sched=sched),
                       dataclasses.replace(m.record, preempted=reorder(m.record.preempted)), m.outputs)


def _computed(req) -> int:
    """Tokens of the current context with KV: `kv_committed_len` (reset to 0 by a retraction, kept at a finish)."""
    return int(req.kv.kv_committed_len) if req is not None else 0


def _generated(req) -> int:
    return len(req.output_ids) if req is not None else 0


def _pages(req, page: int) -> int:
    return cdiv(int(req.kv.kv_allocated_len), page) if req.kv.holds_kv else 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]
