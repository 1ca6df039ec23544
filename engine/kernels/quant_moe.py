"""One projection of a mixture-of-experts layer on its experts' GGUF blocks, for all of a step's
(row, expert) pairs in one call (csrc/cpu/quant_moe.c).

Why: per expert, ``QuantizedLinear.matmul`` is a kernel call from Python with its own checks,
activation quantization and wake-up of the thread pool; a Qwen3-MoE decode (top-8, 24 layers)
made ~400 of them a token. ``QuantizedExperts`` holds a projection's experts as one stacked
tensor, as a GGUF file's ``ffn_*_exps`` does, and multiplies every pair's row by its expert's
weight in one call, each active expert's weights read once; every output equals what
``QuantizedLinear.matmul`` gives for that expert's rows alone (the same kernels, chosen by the
same row counts).
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.kernels import quant
from engine.kernels.cpu import ffi, kernel_error, lib


class QuantizedExperts:
    """``num_experts`` ``[out, in]`` weights of one GGUF type as one ``[num_experts, out,
    row_bytes]`` uint8 tensor; ``matmul(x, rows, experts)`` is ``x[rows[p]] @ W[experts[p]].T``
    for every pair p, in float32."""

    __slots__ = ("qtype", "num_experts", "out_features", "in_features", "data", "_wptr")

    def __init__(self, data: torch.Tensor, qtype: int, out_features: int, in_features: int) -> None:
        if lib is None:
            raise RuntimeError("the quantized kernels are not built (run scripts/setup.sh)")
        bb, bw = quant.block_bytes(qtype), quant.block_weights(qtype)
        if not bb or in_features <= 0 or in_features % bw or out_features <= 0:
            raise ValueError(f"no quantized kernel for GGML type {qtype} at in_features={in_features}")
        row_bytes = in_features // bw * bb
        if data.dtype != torch.uint8 or data.dim() != 3 or tuple(data.shape[1:]) != (out_features, row_bytes):
            raise ValueError(
                f"expected [experts, {out_features}, {row_bytes}] uint8 block bytes, "
                f"got {tuple(data.shape)} {data.dtype}"
            )
        self.qtype, self.out_features, self.in_features = qtype, out_features, in_features
        self.num_experts = data.shape[0]
        self.data = data.contiguous()
        self._wptr = ffi.cast("const uint8_t *", self.data.data_ptr())

    def matmul(
        self, x: torch.Tensor, rows: torch.Tensor, experts: torch.Tensor, max_isa: Optional[int] = None
    ) -> torch.Tensor:
        """``[pairs, out]`` float32: row p is ``x[rows[p]] @ W[experts[p]].T``. ``x`` is ``[tokens,
        in]`` (float32 or bf16, rows may be strided); ``rows`` and ``experts`` are 1-D int64 of one
        length. max_isa caps the kernels' variant (tests force each)."""
        x, tokens, stride = quant.activations(x, self.in_features)
        pairs = rows.shape[0] if rows.dim() == 1 else -1
        for name, t in (("rows", rows), ("experts", experts)):
            if t.dtype != torch.int64 or t.shape != (pairs,) or pairs < 1:
                raise ValueError(
                    f"{name} must be a non-empty 1-D int64 tensor like rows, got {tuple(t.shape)} {t.dtype}"
                )
        rows, experts = rows.contiguous(), experts.contiguous()
        y = torch.empty(pairs, self.out_features, dtype=torch.float32)
        rc = lib.quant_moe(
            self.qtype,
            ffi.cast("const float *", x.data_ptr()),
            stride,
            tokens,
            ffi.cast("const int64_t *", rows.data_ptr()),
            ffi.cast("const int64_t *", experts.data_ptr()),
            pairs,
            self._wptr,
            self.num_experts,
            self.out_features,
            self.in_features,
            quant.best_isa() if max_isa is None else max_isa,
            ffi.cast("float *", y.data_ptr()),
        )
        if rc:
            raise kernel_error(
                rc, "quant_moe", f"a row past {tokens} tokens or an expert past {self.num_experts} experts", ValueError
            )
        return y
