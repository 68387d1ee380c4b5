"""One policy per engine version; importing this package registers them all."""

from . import hf_cb, sglang, trtllm_v1, trtllm_v2, vllm_v1  # noqa: F401
