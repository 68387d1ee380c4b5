"""Reproduce on the real scheduler: with pages of 8 tokens, SGLang 0.5.23 accepts a 57-token prompt on a 64-token pool
(max_req_input_len = 63 - 5 = 58) and then never admits it: admission charges its page-rounded size plus a page,
64 + 8 = 72 tokens. The request behind it starves (scenario sglang-page-rounding-stall; docs/findings/README.md,
SGLang 2; the mechanism of sgl-project/sglang #39271).

Run from the repository root with the test install (sglang==0.5.23 --no-deps and the `sglang-deps` extra):
    .venv/bin/python docs/findings/sglang_page_rounding_stall.py
The scheduler object is built as targets/sglang.py builds it (docs/engine-notes/sglang.md). Expected, with and
without ignore_eos: r0's max_new clipped to 0 at arrival, no batch ever formed, r1 waiting behind it; with a pool of
9 pages (the last line) both finish.
"""

from model.config import EngineConfig
from model.policies.sglang import Options
from targets.protocol import Add
from targets.sglang import SglangTarget


def run(pages: int, ignore_eos: bool, steps: int) -> None:
    cfg = EngineConfig("sglang", block_size=8, num_blocks=pages, max_num_tokens=64, max_batch_size=4,
                       options=Options(ignore_eos=ignore_eos))     # --page-size 8, --disable-radix-cache
    t = SglangTarget(cfg, lockstep=False)
    t.add(Add(0, 57, 16))
    t.add(Add(1, 4, 4))
    for step in range(steps):
        o = t.step()
        s = t.sched
        print(f"pages={pages} ignore_eos={ignore_eos} step {step:2d}: scheduled={o.record.scheduled} "
              f"finished={o.record.finished} waiting={o.state.sched.waiting} "
              f"max_new_tokens(waiting)={[r.sampling_params.max_new_tokens for r in s.waiting_queue]} "
              f"free={s.token_to_kv_pool_allocator.available_size()}")
    t.close()


run(8, True, 6)
run(8, False, 6)
run(9, False, 10)   # a page more: both finish
