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


def kernel_error(rc: int, kernel: str, rejected: str, error: type[Exception] = RuntimeError) -> Exception:
    """The exception for a kernel's non-zero return code: -2 is no memory for its scratch, any
    other code an argument the kernel ``rejected`` (callers build that text only on failure)."""
    if rc == -2:
        return MemoryError(f"{kernel}: no memory for its scratch")
    return error(f"{kernel} rejected {rejected}")
