"""SiLU-and-multiply (the SwiGLU gate): ``silu(x[:, :I]) * x[:, I:]`` in one pass.

Numerics follow transformers' ``act_fn(gate) * up`` on a bf16 model: silu in float32
(``g / (1 + exp(-g))``, torch's formula) rounded to the input dtype, then the product in
float32 rounded again. One program per (row, column tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton import LAUNCH_OPTIONS


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=ok, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[T, 2I]`` (unit-stride rows) to ``[T, I]`` in ``x``'s dtype."""
    rows, width = x.shape[0], x.shape[1] // 2
    if x.stride(1) != 1 or x.shape[1] % 2:
        raise ValueError(f"silu_and_mul: unit-stride rows of even width, got {tuple(x.shape)}")
    out = x.new_empty(rows, width)
    block = min(1024, triton.next_power_of_2(width))
    if rows:
        _silu_and_mul_kernel[(rows, triton.cdiv(width, block))](
            x, out, x.stride(0), out.stride(0), width, BLOCK=block, **LAUNCH_OPTIONS
        )
    return out
