"""TensorRT-LLM's overlap executor (`PyExecutor._executor_loop_overlap`, the engine's default loop) over slots:
model/policies/trtllm_overlap.py `overlap_step`, rule by rule, for the symbolic cores of both TensorRT-LLM
policies (cores/trtllm_v2.py, cores/trtllm_v1.py); and the shape it shares with SGLang's default loop (last
paragraph).

One slot field, `in_flight` (Bool): the request is one of batch k-1's sampling requests (`Sched.in_flight` in the
simulator; the core's `abstract_req_extra` reads it from there). A core mixes in `OverlapLoop` and calls
`overlap(k)`; in the other loop (disable_overlap_scheduler) nothing here is called and `in_flight` is neither read
nor written, so that loop's terms are the ones it had before the field existed.

The step is `Core.step` with its `execute` replaced (`OverlapLoop.execute`):
- arrivals, cancellations, the scheduling pass (rules 1-3) and the engine error path (`fail_all`, before the
  launch, `in_flight` left as it was: the engine is dead) are `Core.step`'s; the pass reads GENERATION_TO_COMPLETE
  off `in_flight` (`to_complete`, rule 2) where the policy's pass does;
- `launch` (rule 4, and rule 6's new in-flight batch): every scheduled row's KV written, a context's cursor moved,
  a last chunk turned DECODING, `generated` unchanged; `in_flight` becomes "scheduled and DECODING after launch";
- `land` (rule 5) for the rows in flight when the step began (`queued`, read before the launch): each non-terminal
  row gets its token (generated + 1), then the stop criteria (the stops of `Workload.env_at`, decided on the
  pre-step state as in `Core.step`); a row the pass paused this step is handed to the core's
  `paused_token_landed` (V2: it ends if that token finished it; V1: `pause` anyway); any other finished row is
  released and FINISHED;
- `after_step`.

Where the loop changes what the cores' invariants say: `decode_cursor` (a launched decoder is one token ahead) and
`in_flight_decodes` (rule 6), used by both cores; V1's own `max_generated` and `owes_tokens` (cores/trtllm_v1.py).
No decode run is accelerated in this loop: the cores' `decode_guard` is false in it.

SGLang's `event_loop_overlap` has the same shape (schedule with batch k-1 queued, launch k, land k-1: the fixed
one-batch lag of model/policies/sglang_overlap.py `overlap_step`), so cores/sglang.py mixes in `OverlapLoop` too:
`execute` above, with the loop chosen by the core's own option (`overlaps`: disable_overlap_schedule there), and
`launch` above calling the core's `forward` (SglangCore.forward: the KV committed, DECODING; every row samples, so
`in_flight` is "scheduled"). Its `land` is its own (SglangCore.land): SGLang's result processing skips a row whose
request was retracted since its launch (no `paused_token_landed`: the token is lost) and ends an input-length abort
or an abort received in flight, rules the TensorRT-LLM executor has not; its pass's rules that read the queued batch
(the finishing skip, the prefill-only batch) are in the core, as `to_complete` is in the TensorRT-LLM passes.
"""

from __future__ import annotations

from .core import Plan
from .ops import Guarded
from .slots import DECODING, FINISHED, PREEMPTED, Knobs, Params, SlotState

FIELD = "in_flight"


def overlap(k: Knobs) -> bool:
    """The design runs `_executor_loop_overlap` (disable_overlap_scheduler false: the engine's default); always a
    concrete option."""
    return not k.options.disable_overlap_scheduler


def to_complete(ops, p: Params, x: SlotState, i: int):
    """trtllm_overlap.to_complete (rule 2) on slot i's current values: in batch k-1, DECODING, and its token in
    flight is its last by length (generated + 1 >= max_new)."""
    r = x.req[i]
    return ops.and_(r[FIELD], r["phase"] == DECODING, r["generated"] + 1 >= p.slots[i]["max_new"])


def decode_cursor(ops, p: Params, s: SlotState, i: int):
    """`decode-cursor` in the overlap loop (rule 4): a decoder in flight has its token launched but not landed, so
    its KV holds every token (computed = prompt + generated; generated 0 after a last context chunk); one not in
    flight has landed it, as in the other loop (computed = prompt + generated - 1, generated >= 1)."""
    w, r = p.slots[i], s.req[i]
    return ops.implies(r["phase"] == DECODING, ops.ite(
        r[FIELD], r["computed"] == w["prompt"] + r["generated"],
        ops.and_(r["generated"] >= 1, r["computed"] == w["prompt"] + r["generated"] - 1)))


def in_flight_decodes(ops, s: SlotState, i: int):
    """Rule 6: the batch in flight is the last launch's sampling rows, DECODING after the launch; the landing may
    finish them, and only the next launch (or a dead engine's failing) changes the rest."""
    r = s.req[i]
    return ops.implies(r[FIELD], ops.or_(r["phase"] == DECODING, r["phase"] == FINISHED, s.g["error"]))


class OverlapLoop:
    """Mixed into a Core (before it in the bases) whose `schedule` already reads the queued batch in overlap mode
    (TensorRT-LLM: `to_complete`; SGLang: its finishing skip, cores/sglang.py `leave_finishing`)."""

    def overlaps(self, k: Knobs) -> bool:
        """Whether the design runs the overlap loop: TensorRT-LLM's knob (`overlap`); a core of another engine says
        which of its options chooses the loop (cores/sglang.py: disable_overlap_schedule)."""
        return overlap(k)

    def execute(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, stops: list) -> None:
        if not self.overlaps(k):
            return super().execute(G, k, p, x, plan, stops)
        queued = [x.req[i][FIELD] for i in range(len(x))]   # batch k-1's rows (cancellations left the field)
        self.launch(G, k, p, x, plan)
        self.land(G, k, p, x, plan, queued, stops)
        self.after_step(G, k, p, x, plan)

    def launch(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan) -> None:
        """trtllm_overlap.launch (rules 4, 6)."""
        ops = G.ops
        for i in range(len(x)):
            r = x.req[i]
            scheduled = plan.rec.flags["scheduled"][i]
            with G.when(scheduled):
                self.forward(G, p, x, plan, i, sample=False)     # no token yet: it lands next step (rule 5)
            G.set(r, FIELD, ops.and_(scheduled, r["phase"] == DECODING))

    def land(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, queued: list, stops: list) -> None:
        """trtllm_overlap.land (rule 5) for the rows `queued`."""
        ops = G.ops
        for i in range(len(x)):
            r = x.req[i]
            with G.when(ops.and_(queued[i], r["phase"] < FINISHED)):
                G.set(r, "generated", r["generated"] + 1)
                done = self.finishes(ops, k, p, x, i, stops[i])
                paused = r["phase"] == PREEMPTED
                with G.when(paused):
                    self.paused_token_landed(G, k, p, x, plan, i, done)
                with G.when(ops.and_(ops.not_(paused), done)):
                    self.finish(G, k, p, x, i)
                    plan.flag(G, "finished", i)

    def paused_token_landed(self, G: Guarded, k: Knobs, p: Params, x: SlotState, plan: Plan, i: int, done) -> None:
        """The policy's `paused_token_landed`, for a victim paused (and freed) by this step's pass whose in-flight
        token has just been appended; flags "finished" where it ends."""
        raise NotImplementedError
