"""Small-batch matmuls on bf16 weights for CPUs without native bf16 GEMMs (csrc/cpu/gemv_bf16.c).

Why: at batch 1-4 a decode step is bound by reading the weights. On an AVX2-only CPU torch
multiplies bf16 weights through a slow path, so the model keeps float32 copies for MKL, which
doubles the bytes every token reads. ``PackedBF16`` holds the bf16 weights in the kernel's
blocked layout and multiplies up to ``MAX_ROWS`` rows of activations against them at
about the machine's read bandwidth, faster than MKL on the float32 copy (benchmarks/RESULTS.md,
"Kernel choices"). The result is float32 math on the bf16 values, the same numbers the
float32 copy gives up to summation order. ``dense_matmul`` runs the same kernel on an unpacked
row-major bf16 weight, for a matrix whose rows are read as rows too (a tied LM head).
"""

from __future__ import annotations

import torch

from engine.kernels.cpu import available, ffi, lib

MAX_ROWS = 4 if lib is None else lib.GEMV_BF16_MAX_M
_ROW_BLOCK = 4 if lib is None else lib.GEMV_BF16_ROWS
_COL_BLOCK = 8 if lib is None else lib.GEMV_BF16_COLS


def fits(out_features: int, in_features: int) -> bool:
    """Whether a weight of this shape can be packed (the blocked layout has no ragged edge)."""
    return out_features % _ROW_BLOCK == 0 and in_features % _COL_BLOCK == 0


class PackedBF16:
    """A ``[out, in]`` weight rounded to bf16 and laid out for the kernel."""

    __slots__ = ("out_features", "in_features", "data", "_ptr")

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or not fits(*weight.shape):
            raise ValueError(
                f"cannot pack a weight of shape {tuple(weight.shape)} "
                f"(needs [out, in] with out % {_ROW_BLOCK} == 0 and in % {_COL_BLOCK} == 0)"
            )
        if not available():
            raise RuntimeError("the bf16 GEMV kernel needs an x86-64 CPU with AVX2 and FMA")
        self.out_features, self.in_features = weight.shape
        src = weight.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()
        self.data = torch.empty_like(src)
        lib.gemv_bf16_pack(
            ffi.cast("uint16_t *", src.data_ptr()),
            ffi.cast("uint16_t *", self.data.data_ptr()),
            self.out_features,
            self.in_features,
        )
        self._ptr = ffi.cast("uint16_t *", self.data.data_ptr())

    @classmethod
    def from_packed(cls, data: torch.Tensor) -> "PackedBF16":
        """The ``PackedBF16`` whose ``data`` is ``data``, already in the kernel's layout (the
        bf16 GEMV op is handed the packed tensor alone)."""
        if data.dim() != 2 or data.dtype != torch.bfloat16 or not data.is_contiguous() or not fits(*data.shape):
            raise ValueError(f"expected a packed contiguous bf16 weight, got {data.dtype} {tuple(data.shape)}")
        packed = cls.__new__(cls)
        packed.out_features, packed.in_features = data.shape
        packed.data, packed._ptr = data, ffi.cast("uint16_t *", data.data_ptr())
        return packed

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` in float32 for ``x`` of shape ``[rows <= MAX_ROWS, in]``."""
        rows = x.shape[0]
        if x.dim() != 2 or x.shape[1] != self.in_features or not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"expected [1..{MAX_ROWS}, {self.in_features}] activations, got {tuple(x.shape)}")
        x = x.to(torch.float32).contiguous()
        y = torch.empty(rows, self.out_features, dtype=torch.float32)
        rc = lib.gemv_bf16(
            ffi.cast("const float *", x.data_ptr()),
            self._ptr,
            ffi.cast("float *", y.data_ptr()),
            rows,
            self.out_features,
            self.in_features,
        )
        if rc != 0:  # sizes were checked above; a failure here is a bug, not bad input
            raise RuntimeError(f"gemv_bf16 rejected rows={rows}, out={self.out_features}, in={self.in_features}")
        return y


def dense_matmul(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` in float32 for a contiguous CPU bf16 ``weight`` of a shape that ``fits``
    and ``x`` of shape ``[1..MAX_ROWS, in]``."""
    rows, (out_features, in_features) = x.shape[0], weight.shape
    if weight.dtype != torch.bfloat16 or not weight.is_contiguous() or not fits(out_features, in_features):
        raise ValueError(f"expected a contiguous bf16 weight that fits, got {weight.dtype} {tuple(weight.shape)}")
    if x.dim() != 2 or x.shape[1] != in_features or not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"expected [1..{MAX_ROWS}, {in_features}] activations, got {tuple(x.shape)}")
    x = x.to(torch.float32).contiguous()
    y = torch.empty(rows, out_features, dtype=torch.float32)
    rc = lib.gemv_bf16_dense(
        ffi.cast("const float *", x.data_ptr()),
        ffi.cast("uint16_t *", weight.data_ptr()),
        ffi.cast("float *", y.data_ptr()),
        rows,
        out_features,
        in_features,
    )
    if rc != 0:
        raise RuntimeError(f"gemv_bf16_dense rejected rows={rows}, out={out_features}, in={in_features}")
    return y
