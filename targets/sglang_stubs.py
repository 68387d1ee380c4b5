"""The two import stubs SGLang 0.5.23 needs on a CPU-only Linux machine (see ../shared/reference/sglang.md §3.2).

- Triton: `sglang/srt/utils/common.py:91` imports triton unconditionally, and `sglang/__init__.py` reaches it, so
  the stub must be in place before the first `import sglang`. SGLang ships its own stub for macOS,
  `sglang/_platform_stubs.py` (`install_platform_stubs`), guarded by a darwin/arm64/MPS check. It is loaded here
  from its file (importing it as `sglang._platform_stubs` would run `sglang/__init__.py` first) and run once with
  that check answered yes; its two other effects are kept out: `_patch_non_blocking` (a global patch of
  `torch.Tensor.to` / `copy_`) is replaced by a no-op for the call, and the `torch.mps` attributes it adds are
  removed afterwards. What remains is a meta-path finder that answers every `triton.*` import with a mock.
- torchvision: a hard import on the scheduler's import path (`srt/configs/__init__.py` -> ... ->
  `multimodal/internvl_utils.py:5`); no PyPI build of it works beside torch 2.13.0+cpu. A meta-path finder answers
  `torchvision.*` with the same kind of mock (SGLang's `_MockModule`). transformers must first cache
  `is_torchvision_available() == False` (an lru_cache), or it later finds the stub and uses it.

Nothing here imports sglang itself; `install()` is idempotent and only called by targets/sglang.py when a target
is built.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import platform
import sys

_STATE: dict = {}


class _MockFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import <root>` and `import <root>.x.y` with SGLang's `_MockModule`."""

    def __init__(self, root: str, mock_cls: type):
        self.root = root
        self.mock_cls = mock_cls

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.root or fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return self.mock_cls(spec.name)

    def exec_module(self, module):
        pass


def _load_platform_stubs(sglang_dir: str):
    name = "sglang._platform_stubs"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(sglang_dir, "_platform_stubs.py"))
    if spec is None or spec.loader is None:
        raise ImportError("sglang/_platform_stubs.py not found (the triton stub comes from it)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod     # its dataclasses look their module up in sys.modules
    spec.loader.exec_module(mod)
    return mod


def _install_triton_stub(ps) -> None:
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return      # a real Triton (or an earlier stub) is there: use it
    import torch

    saved = (sys.platform, platform.machine, torch.backends.mps.is_available, ps._patch_non_blocking)
    mps_before = set(vars(torch.mps))
    sys.platform, platform.machine = "darwin", (lambda: "arm64")
    torch.backends.mps.is_available = lambda: True
    ps._patch_non_blocking = lambda: None
    try:
        ps.install_platform_stubs()
    finally:
        sys.platform, platform.machine, torch.backends.mps.is_available, ps._patch_non_blocking = saved
        for k in set(vars(torch.mps)) - mps_before:
            delattr(torch.mps, k)
    if "triton" not in sys.modules:
        raise ImportError("SGLang's platform stub did not install a triton module")


def _install_torchvision_stub(ps) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        return      # a real torchvision is installed: leave it
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()      # caches False before the stub can be found
    sys.meta_path.insert(0, _MockFinder("torchvision", ps._MockModule))


def install() -> None:
    """Install both stubs (once per process). Raises ImportError when sglang is not installed."""
    if _STATE.get("done"):
        return
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise ImportError("No module named 'sglang'")
    ps = _load_platform_stubs(os.path.dirname(spec.origin))
    _install_torchvision_stub(ps)
    _install_triton_stub(ps)
    _STATE["done"] = True
