"""RMSNorm, optionally fused with the residual add before it, one program per row.

Numerics follow transformers' LlamaRMSNorm so a bf16 model rounds where it does: the sum
``residual + x`` is rounded to the residual's dtype (and stored back), normalised in
float32 (mean of squares, rsqrt), rounded to the input dtype, then multiplied by the
weight and rounded again. Fusing saves a pass over the hidden state and a launch per norm.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from engine.kernels.triton import LAUNCH_OPTIONS


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x,
    stride_r,
    stride_o,
    width,
    eps,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        total = x + tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        total = total.to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * stride_r + cols, total, mask=ok)
        x = total.to(tl.float32)
    variance = tl.sum(x * x, 0) / width
    normed = (x * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``rmsnorm(x) * weight`` over the last dim of a 2-D ``x``, in ``x``'s dtype.

    With ``residual`` (same shape, updated in place): ``residual += x`` first and the sum is
    normalised, a decoder layer's ``h = h + out; x = norm(h)`` in one pass."""
    rows, width = x.shape
    if x.stride(1) != 1 or (residual is not None and (residual.shape != x.shape or residual.stride(1) != 1)):
        raise ValueError("rms_norm: unit-stride rows, and a residual of the same shape")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res = x if residual is None else residual
    block = triton.next_power_of_2(width)  # a wide row is spread over more warps
    if rows:
        _rms_norm_kernel[(rows,)](
            x,
            res,
            weight,
            out,
            x.stride(0),
            res.stride(0),
            out.stride(0),
            width,
            eps,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(max(block // 256, 1), 8),
            **LAUNCH_OPTIONS,
        )
    return out
