"""Triton kernels for the CUDA path, and the one place that says whether a device gets them.

The model asks ``available()`` once (when it is built for a CUDA device) and then calls
the ops below; nothing else checks devices. A CPU keeps its C kernels (engine/kernels/*.py)
and torch: there ``available()`` is False without importing triton at all, and the ops,
loaded on first use (PEP 562), are never touched. Tests run them on CPU tensors under
``TRITON_INTERPRET=1``, which must be set before their first use.

Ops: ``paged_attention`` (decodes and prefill chunks over the block table),
``reshape_and_cache`` (a step's K/V into the cache), ``rms_norm`` (optionally fused with the
residual add), ``silu_and_mul`` and ``rotary_embedding`` (in place).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

_OPS = {
    "paged_attention": "attention",
    "reshape_and_cache": "cache",
    "rms_norm": "norm",
    "silu_and_mul": "activation",
    "rotary_embedding": "rotary",
}
__all__ = ["available", *_OPS]
# Passed to every launch. Stated, not left to triton's default: triton 3.9 warns on first
# compile when the default is used, and 3.10 changes it. Fused multiply-adds, as torch's
# own CUDA kernels are built (nvcc --fmad=true).
LAUNCH_OPTIONS = dict(enable_fp_fusion=True)


@functools.cache
def available() -> bool:
    """True when torch sees a CUDA device and triton imports: the model then runs these kernels."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def __getattr__(name: str) -> Any:
    if name not in _OPS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_OPS[name]}"), name)
