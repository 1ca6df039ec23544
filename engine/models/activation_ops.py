"""RMSNorm (optionally after a residual add), SiLU-and-mul and RoPE as ``CustomOp``s: the C
kernels of engine/kernels/activation.py where they run these rows (``kernel``), torch ops
elsewhere, chosen once per instance (engine/models/custom_op.py).

Inside a compiled graph they stay the C kernels, as their torch ops (``OP_IN_GRAPH``): a
compiled step then computes what an eager step computes, bit for bit. That matters for
quantized weights, whose kernels round each activation row to int8 per block: an ulp of
difference in a norm's output can move a rounding and flip a near-tied greedy token.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from engine.kernels import activation, ops
from engine.models.custom_op import CustomOp


class _ActivationOp(CustomOp):
    OP_IN_GRAPH = True

    def __init__(self, device: torch.device, kernel: bool, in_graph: bool = False) -> None:
        """``kernel``: the C kernels run this model's rows (``activation.supports``)."""
        self.kernel = kernel
        super().__init__(device, in_graph)

    def dispatch_forward(self, device: torch.device, in_graph: bool) -> Callable[..., Any]:
        return super().dispatch_forward(device, in_graph) if self.kernel else self.forward_native


class RMSNorm(_ActivationOp):
    """``norm(x)``, or with ``residual``: ``residual += x`` in place, then ``norm(residual)``."""

    def forward_native(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        if residual is not None:
            x = residual.add_(x)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def forward_cpu(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return activation.rms_norm(x, weight, eps, residual)

    def forward_op(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return ops.rms_norm(x, weight, eps) if residual is None else ops.fused_add_rms_norm(x, residual, weight, eps)


class SiluAndMul(_ActivationOp):
    """``silu(x[:, :d]) * x[:, d:]`` for rows of width ``2d``."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[1] // 2
        return F.silu(x[:, :d]) * x[:, d:]

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        return activation.silu_and_mul(x)

    def forward_op(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)


class Rotary(_ActivationOp):
    """RoPE in place on the first ``heads`` heads of ``qkv`` rows (adjacent rotary pairs), from
    the float32 ``cos_sin`` table ``[positions, head_dim / 2, 2]``; returns ``qkv``."""

    def forward_native(
        self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int
    ) -> torch.Tensor:
        n, cols = qkv.shape[0], heads * head_dim
        cs = cos_sin.index_select(0, positions).unsqueeze(1)  # [n, 1, head_dim / 2, 2]
        c, s = cs[..., 0], cs[..., 1]
        pairs = qkv[:, :cols].float().view(n, heads, head_dim // 2, 2)
        re, im = pairs[..., 0], pairs[..., 1]
        qkv[:, :cols] = torch.stack([re * c - im * s, im * c + re * s], -1).view(n, cols).to(qkv.dtype)
        return qkv

    def forward_cpu(
        self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int
    ) -> torch.Tensor:
        return activation.rotary_(qkv, positions, cos_sin, heads, head_dim)

    def forward_op(
        self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int
    ) -> torch.Tensor:
        ops.rotary_(qkv, positions, cos_sin, heads, head_dim)
        return qkv
