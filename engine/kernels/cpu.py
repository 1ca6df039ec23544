"""The compiled CPU kernels (``engine.kernels._cpu``, built from csrc/ by setup.py) and
whether this CPU can run them; callers fall back to torch where it cannot."""

from __future__ import annotations

import torch  # noqa: F401  (first: its libgomp is the OpenMP runtime the kernels then share)

try:
    from engine.kernels._cpu import ffi, lib
except ImportError:  # pragma: no cover - the extension is built by setup.py
    ffi = lib = None

_SUPPORTED = lib is not None and bool(lib.cpu_kernels_supported())


def available() -> bool:
    """True when the extension is built and this CPU runs it (x86-64 with AVX2 and FMA)."""
    return _SUPPORTED
