"""Make PyPI's CUDA build of torchvision importable beside CPU-only torch.

torchvision registers fake (meta) kernels for its C++ ops at import time. With CPU torch its
`_C.so` cannot load (it needs libtorch_cuda.so), the ops do not exist, and registration raises
`RuntimeError: operator torchvision::nms does not exist`. Transformers' Qwen-VL processors and
qwen-vl-utils import torchvision, so the whole image path would fail.

This module waits (lazily, without importing torch) until `torchvision` is first imported, then
wraps `torch.library.register_fake` so that a failed registration of a `torchvision::` op is
ignored. Where torchvision works (GPU machines) registration succeeds and nothing changes. The C++
ops themselves (nms, roi_align) still raise if called; nothing in VAGEN calls them.
"""

from __future__ import annotations

import importlib.abc
import sys


def _tolerate_missing_torchvision_ops() -> None:
    import torch.library

    original = torch.library.register_fake
    if getattr(original, "_vagen_shim", False):
        return

    def register_fake(op, func=None, /, *args, **kwargs):
        if not (isinstance(op, str) and op.startswith("torchvision::")):
            if func is None:
                return original(op, *args, **kwargs)
            return original(op, func, *args, **kwargs)

        def decorate(fn):
            try:
                return original(op, fn, *args, **kwargs)
            except RuntimeError:  # the op was never defined: torchvision's _C.so did not load
                return fn

        return decorate if func is None else decorate(func)

    register_fake._vagen_shim = True
    torch.library.register_fake = register_fake


class _TorchvisionImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            _tolerate_missing_torchvision_ops()
        return None  # let the normal finders import it


def install() -> None:
    """Arm the hook once per interpreter (idempotent; a no-op if torchvision is already imported)."""
    if "torchvision" in sys.modules or any(isinstance(f, _TorchvisionImportHook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchvisionImportHook())


install()
