"""RMSNorm (optionally fused with the residual add) and SiLU-and-multiply in one C call each
(csrc/activation.c), for float32 on CPUs.

Why: a decode step at small batch touches a few KiB per op and spends its time in torch's
dispatch; RMSNorm alone is 5-6 ATen ops, called twice per layer. The fused add also saves
the separate residual add and a pass over the hidden state at any batch size.
"""
from __future__ import annotations

from typing import Optional

import torch

from engine.kernels.cpu import available, ffi, lib


def supports(device: torch.device, dtype: torch.dtype, *widths: int) -> bool:
    """Whether the kernels run float32 rows of these widths on this device."""
    return available() and device.type == "cpu" and dtype == torch.float32 and all(w % 8 == 0 for w in widths)


def _ptr(t: torch.Tensor, kind: str = "float *"):
    return ffi.cast(kind, t.data_ptr())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim of a 2-D float32 ``x``.

    With ``residual``, ``residual += x`` happens first, in place, and the sum is normalised
    (a decoder layer's ``h = h + out; x = norm(h)``)."""
    x = x.contiguous()
    if residual is not None and not residual.is_contiguous():
        raise ValueError("rms_norm: the residual must be contiguous (it is updated in place)")
    out = torch.empty_like(x)
    rc = lib.rms_norm_f32(_ptr(x, "const float *"), ffi.NULL if residual is None else _ptr(residual),
                          _ptr(weight, "const float *"), _ptr(out), x.shape[0], x.shape[1], eps)
    if rc != 0:
        raise ValueError(f"rms_norm_f32 rejected a {tuple(x.shape)} input")
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]`` for a 2-D float32 ``x`` of width ``2d``."""
    x = x.contiguous()
    d = x.shape[1] // 2
    out = x.new_empty(x.shape[0], d)
    if lib.silu_and_mul_f32(_ptr(x, "const float *"), _ptr(out), x.shape[0], d) != 0:
        raise ValueError(f"silu_and_mul_f32 rejected a {tuple(x.shape)} input")
    return out
