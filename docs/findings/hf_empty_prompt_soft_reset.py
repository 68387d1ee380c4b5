"""Reproduce on the real engine: transformers 5.19.0 continuous batching returns fewer than max_new tokens for an
empty prompt that was soft reset (docs/findings/README.md, transformers 4).

Run with torch==2.13.0 and transformers==5.19.0 installed (CPU is enough):
    python docs/findings/hf_empty_prompt_soft_reset.py
It drives the engine synchronously (one schedule + forward + update per step, private API of 5.19.0, as in
../shared/reference/transformers_cb.md) with 3 blocks of 4 tokens and a 5-token budget: r0 (8 tokens) takes its
first chunk, then r1 (an empty prompt, max_new 2) joins, gets a token, and is soft reset when the pool is full.
Expected: r1 finishes with 1 token, not 2, because `_true_initial_tokens` is 0 for an empty prompt and
requests.py reads 0 as "never soft reset" (:288 `to_generation_output`, :347 `create_equivalent_initial_request`).
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
    generation_config=GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0),
    continuous_batching_config=ContinuousBatchingConfig(num_blocks=3, page_size=4, max_batch_tokens=5,
                                                        max_requests_per_batch=2, scheduler_type="fifo"))
bp = manager.batch_processor = manager._create_batch_processor()   # no thread: we step it ourselves
manager.add_request(list(range(11, 19)), request_id="r0", max_new_tokens=2)

outputs = {}
for step in range(8):
    if step == 1:
        manager.add_request([], request_id="r1", max_new_tokens=2)
    if bp.prepare_next_batch():
        bp._generation_step(manager.model)
        bp.update_batch()
    q = manager.output_router.output_queue
    while not q.empty():
        out = q.get_nowait()
        outputs[out.request_id] = (out.status.name, list(out.generated_tokens))
    print(f"step {step}: outputs so far {outputs}")
status, tokens = outputs.get("r1", (None, []))
print(f"r1: {status}, {len(tokens)} token(s) for max_new_tokens=2:",
      "TRUNCATED" if status == "FINISHED" and len(tokens) < 2 else "as asked")
