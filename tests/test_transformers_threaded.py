"""End-to-end runs of the real transformers engine through its public, threaded API
(`generate_batch`, `add_request` / `get_result`), each under a hard wall-clock limit and stopped with a
hard stop, so a stalled engine is a failed test, never a hung run."""

import threading

import pytest

from targets.protocol import Add, prompt_tokens
from targets.transformers_cb import DEADLOCK, VOCAB, greedy_reference, tiny_model

LIMIT_S = 60


def within_limit(fn, seconds=LIMIT_S):
    """Run fn in a daemon thread; fail (not hang) if it does not return in time."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:   # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the engine did not answer within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def cb_configs(num_blocks, page_size=4, max_batch_tokens=16):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=num_blocks, page_size=page_size, max_batch_tokens=max_batch_tokens)
    return gen, cb


def test_generate_batch_answers_every_request_with_greedy_tokens():
    model = tiny_model()
    adds = [Add(k, 3 + 2 * k, 6) for k in range(3)]
    gen, cb = cb_configs(num_blocks=4)   # 16 tokens of cache for 3 requests: soft resets happen
    outputs = within_limit(lambda: model.generate_batch(
        inputs=[prompt_tokens(a, VOCAB) for a in adds], generation_config=gen, continuous_batching_config=cb))
    assert len(outputs) == 3
    got = sorted(tuple(o.generated_tokens) for o in outputs.values())
    assert got == sorted(greedy_reference(a) for a in adds)


def test_manager_add_request_get_result_and_hard_stop():
    model = tiny_model()
    gen, cb = cb_configs(num_blocks=8)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    try:
        add = Add(0, 5, 6)
        manager.add_request(prompt_tokens(add, VOCAB), request_id="r0", max_new_tokens=6)
        result = within_limit(lambda: manager.get_result(request_id="r0", timeout=LIMIT_S - 5))
        assert result is not None and tuple(result.generated_tokens) == greedy_reference(add)
    finally:
        within_limit(lambda: manager.stop(block=True, timeout=5, hard_stop=True), seconds=15)


def test_a_request_too_large_fails_through_the_public_api_with_the_engine_error():
    model = tiny_model()
    gen, cb = cb_configs(num_blocks=2)          # 8 tokens: a 9-token prompt cannot fit alone
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    try:
        manager.add_request(prompt_tokens(Add(0, 9, 2), VOCAB), request_id="big", max_new_tokens=2)
        result = within_limit(lambda: manager.get_result(request_id="big", timeout=LIMIT_S - 5))
        assert result is not None and result.status.name == "FAILED"
        assert DEADLOCK in str(result.error)
    finally:
        within_limit(lambda: manager.stop(block=True, timeout=5, hard_stop=True), seconds=15)
