"""Matmuls straight on GGUF block-quantized weights (csrc/cpu/quant_gemv.c, csrc/cpu/quant_kquants.c):
Q4_0, Q4_1, Q8_0 (blocks of 32 weights) and the K-quants Q4_K, Q5_K, Q6_K (super-blocks of 256).

Why: a decode step at a few rows is bound by reading the weights; the default model's Q4_1
GGUF holds 5 bits a weight where bf16 holds 16. ``QuantizedLinear`` keeps a weight as the
file's own blocks (a uint8 tensor, ``[out, in / block_weights * block_bytes]``) and multiplies up to
``MAX_ROWS`` rows of activations against them (x is quantized per call to int8 blocks, as
llama.cpp does), larger batches up to ``GEMV_ROWS`` run it again per ``MAX_ROWS`` rows, and
beyond that dequantize into a per-call float32 buffer and run a GEMM, so nothing dense stays
resident. On AVX-512 VNNI and AVX2, Q4_0/Q4_1/Q8_0 batches from ``GEMM_MIN_ROWS`` rows run a
tiled int8 GEMM instead (csrc/cpu/quant_gemm.c), at every row count (prefill included): it beat both;
so do the K-quants on AVX-512 VNNI (csrc/cpu/quant_kgemm.c).
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.kernels.cpu import ffi, kernel_error, lib

Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 8, 12, 13, 14  # gguf.GGMLQuantizationType numbers
SUPPORTED_TYPES = (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)
TYPE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
BLOCK = 32  # weights per block of Q4_0/Q4_1/Q8_0; see block_weights() for every type
MAX_ROWS = 8 if lib is None else lib.QUANT_GEMV_MAX_M  # the most rows of x a pass over W takes (fewer on AVX-512)
# Up to this many rows run the kernel (ceil(rows / MAX_ROWS) passes over W); more dequantize
# and run a float32 GEMM. At 64 rows on the default model's shapes the passes took less time than
# dequantize + float32 GEMM (benchmarks/RESULTS.md, "Kernel choices"), and need no [out, in]
# float32 buffer (113 MB for the vocabulary projection).
GEMV_ROWS = 64
# The tiled GEMM (AVX-512 VNNI or AVX2, 32-weight blocks) takes any row count: a fraction of the
# time of dequantize + float32 GEMM at 64 and 256 rows (RESULTS.md, "Quantized kernels").
GEMM_MIN_ROWS = 4 if lib is None else lib.QUANT_GEMM_MIN_M
ISA_C, ISA_AVX2, ISA_AVX512_VNNI = 0, 1, 2
_BEST_ISA = ISA_C if lib is None else int(lib.quant_best_isa())


def best_isa() -> int:
    """The best kernel variant this CPU runs (ISA_*); ISA_C where the extension is missing."""
    return _BEST_ISA


def kernel_rows(qtype: int, isa: int) -> Optional[int]:
    """The most rows ``QuantizedLinear.matmul`` runs in the kernel for this type and variant
    (more dequantize and run a float32 GEMM); None: any number (the tiled int8 GEMMs)."""
    tiled = isa >= ISA_AVX2 if block_weights(qtype) == BLOCK else isa >= ISA_AVX512_VNNI
    return None if tiled else GEMV_ROWS


def block_bytes(qtype: int) -> int:
    """Bytes of one block of a GGML type (``block_weights(qtype)`` weights); 0 for a type the
    kernels lack."""
    return 0 if lib is None else int(lib.quant_block_bytes(qtype))


def block_weights(qtype: int) -> int:
    """Weights per block of a GGML type: 32, or 256 for the K-quants; 0 for a type the kernels lack."""
    return 0 if lib is None else int(lib.quant_block_weights(qtype))


class QuantizedLinear:
    """An ``[out, in]`` weight held as GGUF blocks; ``matmul(x)`` is ``x @ W.T`` in float32."""

    __slots__ = ("qtype", "out_features", "in_features", "data", "_wptr", "_rows")

    def __init__(self, data: torch.Tensor, qtype: int, out_features: int, in_features: int) -> None:
        if lib is None:
            raise RuntimeError("the quantized kernels are not built (run scripts/setup.sh)")
        bb, bw = block_bytes(qtype), block_weights(qtype)
        if not bb:
            raise ValueError(
                f"GGML type {qtype} has no quantized kernel "
                f"(supported: {', '.join(TYPE_NAMES[t] for t in SUPPORTED_TYPES)})"
            )
        if in_features % bw or in_features <= 0 or out_features <= 0:
            raise ValueError(
                f"in_features must be a positive multiple of {bw} for {TYPE_NAMES[qtype]}, got {in_features}"
            )
        row_bytes = in_features // bw * bb
        if data.dtype != torch.uint8 or data.numel() != out_features * row_bytes:
            raise ValueError(
                f"expected {out_features} x {row_bytes} uint8 block bytes, got {tuple(data.shape)} {data.dtype}"
            )
        self.qtype, self.out_features, self.in_features = qtype, out_features, in_features
        self.data = data.contiguous().view(out_features, row_bytes)
        self._wptr = ffi.cast("const uint8_t *", self.data.data_ptr())  # cast once, not per call
        self._rows = kernel_rows(qtype, _BEST_ISA)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The dense float32 ``[out, in]`` matrix (the GGUF's own dequantization)."""
        out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        rc = lib.quant_dequantize(
            self.qtype, self._wptr, self.out_features, self.in_features, ffi.cast("float *", out.data_ptr())
        )
        if rc != 0:
            raise RuntimeError("quant_dequantize rejected sizes it was built for")
        return out

    def matmul(
        self, x: torch.Tensor, max_isa: Optional[int] = None, out: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``x @ W.T`` in float32 for ``x`` of shape ``[rows, in]`` (float32 or bf16; rows may be
        a strided view). Up to ``GEMV_ROWS`` rows run the int8 kernel, into ``out`` when given (a
        contiguous float32 ``[rows, out_features]``: saves the allocation, ~2 us of a call);
        max_isa caps its variant (tests force each). On AVX-512 VNNI and AVX2 every row count
        of a 32-weight block type runs the kernel (``kernel_rows``)."""
        x, rows, stride = activations(x, self.in_features)
        isa, most = (_BEST_ISA, self._rows) if max_isa is None else (max_isa, kernel_rows(self.qtype, max_isa))
        if most is not None and rows > most:
            return torch.matmul(x, self.dequantize().t(), out=out)
        y = output(out, rows, self.out_features)
        rc = lib.quant_gemv(
            self.qtype,
            ffi.cast("const float *", x.data_ptr()),
            stride,
            rows,
            self._wptr,
            self.out_features,
            self.in_features,
            isa,
            ffi.cast("float *", y.data_ptr()),
        )
        if rc:
            raise kernel_error(rc, "quant_gemv", f"rows={rows}, out={self.out_features}, in={self.in_features}")
        return y

    def matmul_row_invariant(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` like ``matmul``, each row's result the same whatever other rows share the
        call (``deterministic``): ``matmul`` picks the GEMV or the tiled GEMM by the row count,
        and they sum a row's blocks in different orders; this runs the tiled GEMM at every row
        count where one runs this type here (a 1-row decode included), one GEMV pass per row
        elsewhere (csrc/cpu/quant_gemv.h ``quant_gemv_row_invariant``)."""
        x, rows, stride = activations(x, self.in_features)
        y = output(None, rows, self.out_features)
        rc = lib.quant_gemv_row_invariant(
            self.qtype,
            ffi.cast("const float *", x.data_ptr()),
            stride,
            rows,
            self._wptr,
            self.out_features,
            self.in_features,
            ffi.cast("float *", y.data_ptr()),
        )
        if rc:
            raise kernel_error(
                rc, "quant_gemv_row_invariant", f"rows={rows}, out={self.out_features}, in={self.in_features}"
            )
        return y


def activations(x: torch.Tensor, in_features: int) -> tuple[torch.Tensor, int, int]:
    """x checked as ``[rows >= 1, in_features]`` and made float32 with unit column stride:
    (x, rows, row stride in floats). Shared by the kernels' wrappers; kept to the fewest torch
    calls, since a decode step makes ~200 of these."""
    shape = x.shape
    if len(shape) != 2 or shape[1] != in_features or shape[0] < 1:
        raise ValueError(f"expected [rows, {in_features}] activations, got {tuple(shape)}")
    if x.dtype is not torch.float32:
        x = x.float()
    if x.is_contiguous():
        return x, shape[0], in_features
    if x.stride(1) != 1 or x.stride(0) < in_features:
        return x.contiguous(), shape[0], in_features
    return x, shape[0], x.stride(0)  # a row-strided view (a slice of a wider buffer) runs as it is


def output(out: Optional[torch.Tensor], rows: int, features: int) -> torch.Tensor:
    """``out`` checked as a contiguous float32 ``[rows, features]``, or a new one."""
    if out is None:
        return torch.empty(rows, features, dtype=torch.float32)
    if out.shape != (rows, features) or out.dtype is not torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{rows}, {features}], got {tuple(out.shape)} {out.dtype}")
    return out
