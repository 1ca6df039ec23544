"""bf16 linear layers on weights packed once for oneDNN, on CPUs with native bf16 GEMMs.

Why: ``F.linear`` on a plain bf16 weight makes oneDNN reorder the whole weight into its
blocked (AMX / AVX-512 BF16) layout on every call, one more pass over the weight's bytes per
GEMM, and a decode step is mostly reading weights. Packing at load, as inductor's freezing
pass and oneDNN-based engines do, removes that pass: the projections of a step take less time
at every row count, with bit-identical results (benchmarks/RESULTS.md, "Kernel choices"). The
packed copy is laid out for ``PACK_ROWS`` rows but serves every row count.
"""

from __future__ import annotations

from typing import Optional

import torch

PACK_ROWS = 64  # the row count oneDNN tunes the layout for (any count runs on it)

_reorder = torch.ops.mkldnn._reorder_linear_weight
_linear = torch.ops.mkldnn._linear_pointwise


def supports(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights of this dtype on this device are packed (else plain ``F.linear``)."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


class PackedLinear:
    """A ``[out, in]`` bf16 weight in oneDNN's layout; ``matmul(x, b)`` is ``F.linear(x, W, b)``."""

    __slots__ = ("out_features", "in_features", "data")

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or weight.dtype != torch.bfloat16:
            raise ValueError(f"expected a 2-D bf16 weight, got {tuple(weight.shape)} {weight.dtype}")
        self.out_features, self.in_features = weight.shape
        self.data = _reorder(weight.detach().contiguous(), PACK_ROWS)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``F.linear(x, W, bias)`` in bf16 for ``x`` of shape ``[rows, in]`` (the bias is added
        before the one rounding to bf16, as F.linear does)."""
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"expected [rows, {self.in_features}] activations, got {tuple(x.shape)}")
        return _linear(x.contiguous(), self.data, bias, "none", [], "")
