"""Reproduce on the real engine: transformers 5.19.0 continuous batching stalls forever when the last
active request is cancelled right after a soft reset (scenario hf-cb-cancel-after-soft-reset).

Run with torch==2.13.0 and transformers==5.19.0 installed (CPU is enough):
    python docs/findings/hf_cancel_after_soft_reset.py
It drives the engine synchronously (one schedule + forward + update per step, private API of 5.19.0, as in
../shared/reference/transformers_cb.md) and prints one line per step. Expected: r0 is soft reset at step 4,
r1 is cancelled before step 5, and from then on no batch is formed while r0 is still pending.
"""

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

torch.manual_seed(0)
torch.set_num_threads(1)
cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
cfg._attn_implementation = "sdpa"
model = LlamaForCausalLM(cfg).eval()
manager = model.init_continuous_batching(
    generation_config=GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0),
    continuous_batching_config=ContinuousBatchingConfig(num_blocks=4, page_size=4, max_batch_tokens=8,
                                                        scheduler_type="fifo"))
bp = manager.batch_processor = manager._create_batch_processor()   # no thread: we step it ourselves
manager.add_request([11, 12, 13, 14, 15], request_id="r0", max_new_tokens=8)
manager.add_request([21, 22, 23, 24, 25], request_id="r1", max_new_tokens=8)

idle = 0
for step in range(30):
    if step == 5:
        manager.cancel_request("r1")
    formed = bp.prepare_next_batch()
    if formed:
        bp._generation_step(manager.model)
        bp.update_batch()
    sched = bp.scheduler
    print(f"step {step:2d}: batch formed={formed} block_new_requests={sched.block_new_requests} "
          f"active={sorted(sched.active_requests)} waiting={sorted(sched.waiting_requests)} "
          f"pending={sched.has_pending_requests()}")
    idle = 0 if formed else idle + 1
    if idle >= 10:
        break
outputs = {}
q = manager.output_router.output_queue
while not q.empty():
    out = q.get_nowait()
    outputs[out.request_id] = out.status.name
print("final outputs:", outputs)
print("STALLED: r0 pending with no batch for 10 steps" if idle >= 10 and sched.has_pending_requests() else "no stall")
