"""Dynamic W8A8 linear layers (``quantization="int8"``): csrc/cpu/int8_gemv.c for decode, torch's
int8 GEMM for larger batches.

Why: int8 weights are half of bf16's bytes and a quarter of float32's, and int8 dot products
(AVX-512 VNNI, AVX2) do 4x the multiply-adds of float32 per instruction. ``Int8Linear`` holds a
float matrix quantized once per output channel (``scale[j] = max|W[j]| / 127``); each call
quantizes x per row (per token), multiplies in int8 and scales the int32 sums back to float32.
Up to ``MAX_ROWS`` rows run the C kernel; larger batches run ``torch._int_mm`` (oneDNN's int8
GEMM) on the same int8 weights, so nothing dense is ever made.
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.kernels.cpu import ffi, kernel_error, lib
from engine.kernels.quant import activations, best_isa, output

MAX_ROWS = 8 if lib is None else lib.INT8_GEMV_MAX_M


def quantize_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row, as the kernels do: s = max|row| / 127, q = rint(row / s) (0 for a
    zero row). Returns (q int8, s float32 [rows])."""
    x = x.float()
    s = x.abs().amax(dim=1) / 127.0
    inv = torch.where(s > 0, 1.0 / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))
    return torch.round(x * inv[:, None]).to(torch.int8), s


class Int8Linear:
    """An ``[out, in]`` weight as int8 with one float32 scale per output channel; ``matmul(x)``
    is ``x @ W.T`` in float32 with x quantized per row."""

    __slots__ = ("out_features", "in_features", "qweight", "scale", "wsum", "_ptrs")

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, wsum: Optional[torch.Tensor] = None) -> None:
        """``wsum``: the per-channel sums of ``qweight`` when already known (the int8 op is handed
        them with the weight), else summed here."""
        if lib is None:
            raise RuntimeError("the int8 kernels are not built (run scripts/setup.sh)")
        if qweight.dim() != 2 or qweight.dtype != torch.int8 or qweight.numel() == 0:
            raise ValueError(f"expected a non-empty [out, in] int8 weight, got {tuple(qweight.shape)} {qweight.dtype}")
        if scale.shape != (qweight.shape[0],):
            raise ValueError(f"expected {qweight.shape[0]} per-channel scales, got shape {tuple(scale.shape)}")
        self.out_features, self.in_features = qweight.shape
        self.qweight = qweight.contiguous()
        self.scale = scale.to(torch.float32).contiguous()
        # sum of each channel's int8 values: the VNNI kernel's correction for its unsigned x
        self.wsum = self.qweight.sum(dim=1, dtype=torch.int32) if wsum is None else wsum.contiguous()
        self._ptrs = (
            ffi.cast("const int8_t *", self.qweight.data_ptr()),
            ffi.cast("const float *", self.scale.data_ptr()),
            ffi.cast("const int32_t *", self.wsum.data_ptr()),
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "Int8Linear":
        """Quantize a float32/bf16/fp16 ``[out, in]`` matrix once, per output channel."""
        if weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(f"expected a float [out, in] weight, got {tuple(weight.shape)} {weight.dtype}")
        q, s = quantize_per_row(weight.detach().to("cpu"))
        return cls(q, s)

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + 4 * self.scale.numel() + 4 * self.wsum.numel()

    def dequantize(self) -> torch.Tensor:
        """The dense float32 ``[out, in]`` matrix the int8 values stand for."""
        return self.qweight.float() * self.scale[:, None]

    def matmul(
        self, x: torch.Tensor, max_isa: Optional[int] = None, out: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``x @ W.T`` in float32 for ``x`` of shape ``[rows, in]`` (float32 or bf16; rows may be
        a strided view), into ``out`` when given (as QuantizedLinear.matmul); max_isa caps the
        C kernel's variant (tests force each)."""
        x, rows, stride = activations(x, self.in_features)
        if rows > MAX_ROWS:
            qx, sx = quantize_per_row(x)
            y = torch._int_mm(qx, self.qweight.t()).float().mul_(sx[:, None]).mul_(self.scale[None, :])
            return y if out is None else output(out, rows, self.out_features).copy_(y)
        y = output(out, rows, self.out_features)
        q, s, ws = self._ptrs
        rc = lib.int8_gemv(
            ffi.cast("const float *", x.data_ptr()),
            stride,
            rows,
            q,
            s,
            ws,
            self.out_features,
            self.in_features,
            best_isa() if max_isa is None else max_isa,
            ffi.cast("float *", y.data_ptr()),
        )
        if rc:
            raise kernel_error(rc, "int8_gemv", f"rows={rows}, out={self.out_features}, in={self.in_features}")
        return y
