"""Reproduce on the real scheduler: SGLang 0.5.23 with the radix cache disabled never admits an ignore_eos request
whose max_new_tokens the arrival clip cut to exactly the memory bound, and the FCFS queue behind it starves
(scenario sglang-ignore-eos-clip-stall; docs/findings/README.md, SGLang 1).

Run from the repository root with the test install (sglang==0.5.23 --no-deps and the `sglang-deps` extra):
    .venv/bin/python docs/findings/sglang_ignore_eos_clip_stall.py
`Scheduler.__init__` needs a model worker, a tokenizer and ZMQ sockets, so the scheduler object is built as
targets/sglang.py builds it (the real pools, the disabled radix cache, SGLang's own init_* methods; only the forward
pass is faked; docs/engine-notes/sglang.md). Each step is one iteration of `event_loop_normal`. Expected: r0's
max_new is 32 after arrival (64 - 30 - 1 - 1), no batch is ever formed, and r1, r2 wait behind it; with
max_new 31 (the last line) all three finish.
"""

from model.config import EngineConfig
from model.policies.sglang import Options
from targets.protocol import Add
from targets.sglang import SglangTarget


def run(max_new: int, steps: int) -> None:
    cfg = EngineConfig("sglang", block_size=1, num_blocks=64, max_num_tokens=64, max_batch_size=4,
                       options=Options(ignore_eos=True))          # --page-size 1, 64 KV tokens, --disable-radix-cache
    t = SglangTarget(cfg, lockstep=False)                          # the engine alone
    for rid, (prompt, new) in enumerate([(30, max_new), (4, 4), (4, 4)]):
        t.add(Add(rid, prompt, new))
    for step in range(steps):
        o = t.step()
        s = t.sched
        clipped = [r.sampling_params.max_new_tokens for r in s.waiting_queue]
        print(f"max_new={max_new} step {step:2d}: scheduled={o.record.scheduled} finished={o.record.finished} "
              f"waiting={o.state.sched.waiting} max_new_tokens(waiting)={clipped} "
              f"free={s.token_to_kv_pool_allocator.available_size()} batch_is_full={s.running_batch.batch_is_full}")
    t.close()


run(100, 12)   # the stall
run(31, 40)    # one token below the clip: everything completes
