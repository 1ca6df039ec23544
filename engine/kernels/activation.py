"""RMSNorm (optionally fused with the residual add), SiLU-and-multiply and RoPE in one C call
each (csrc/cpu/activation.c), for float32 and bf16 on CPUs.

Why: a decode step at small batch touches a few KiB per op and spends its time in torch's
dispatch; RMSNorm alone is 5-6 ATen ops, called twice per layer. At prefill sizes in bf16
each of those ATen ops is a pass over memory that widens to float32 and rounds back, a large
share of a long bf16 prefill step (benchmarks/RESULTS.md, "Kernel choices"). The fused add
also saves the separate residual add and a pass over the hidden state at any batch size. The
bf16 kernels round where transformers' bf16 modules do, so outputs stay transformers' own.

A large call splits its rows over torch's own OpenMP pool inside C (csrc/cpu/parallel.h: one
runtime, sized by ``num_threads``), so the kernels never become the serial part of a step that
torch's GEMMs run in parallel, and no second pool competes with torch's for the cores.
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.kernels.cpu import available, ffi, lib

_DTYPES = (torch.float32, torch.bfloat16)
_BF16 = available() and bool(lib.cpu_avx512_bf16_supported())


def supports(device: torch.device, dtype: torch.dtype, *widths: int) -> bool:
    """Whether the kernels run rows of this dtype and these widths on this device: float32
    on AVX2 (widths % 8), bf16 on AVX-512 BF16 (widths % 16), the CPUs where a bf16 model
    keeps its activations in bf16 (elsewhere they are float32, engine/models/llama.py)."""
    if not available() or device.type != "cpu":
        return False
    if dtype == torch.float32:
        return all(w % 8 == 0 for w in widths)
    return dtype == torch.bfloat16 and _BF16 and all(w % 16 == 0 for w in widths)


def _ptr(t: Optional[torch.Tensor], kind: str):
    return ffi.NULL if t is None else ffi.cast(kind, t.data_ptr())


def _elem(t: torch.Tensor) -> str:
    if t.dtype not in _DTYPES:
        raise ValueError(f"the activation kernels take float32 or bfloat16, got {t.dtype}")
    return "float *" if t.dtype == torch.float32 else "uint16_t *"


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim of a 2-D ``x``.

    With ``residual``, ``residual += x`` happens first, in place, and the sum is normalised
    (a decoder layer's ``h = h + out; x = norm(h)``). ``x``, ``weight`` and ``residual``
    share one dtype."""
    x = x.contiguous()
    kind = _elem(x)
    if weight.dtype != x.dtype or (residual is not None and residual.dtype != x.dtype):
        raise ValueError("rms_norm: x, weight and residual must share one dtype")
    if residual is not None and not residual.is_contiguous():
        raise ValueError("rms_norm: the residual must be contiguous (it is updated in place)")
    out = torch.empty_like(x)
    fn = lib.rms_norm_f32 if x.dtype == torch.float32 else lib.rms_norm_bf16
    rows, cols = x.shape
    xp, hp, wp, op = _ptr(x, kind), _ptr(residual, kind), _ptr(weight.contiguous(), kind), _ptr(out, kind)
    if fn(xp, hp, wp, op, rows, cols, eps) != 0:
        raise ValueError(f"rms_norm rejected a {tuple(x.shape)} input")
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]`` for a 2-D ``x`` of width ``2d``."""
    x = x.contiguous()
    kind = _elem(x)
    d = x.shape[1] // 2
    out = x.new_empty(x.shape[0], d)
    fn = lib.silu_and_mul_f32 if x.dtype == torch.float32 else lib.silu_and_mul_bf16
    xp, op = _ptr(x, kind), _ptr(out, kind)
    if fn(xp, op, x.shape[0], d) != 0:
        raise ValueError(f"silu_and_mul rejected a {tuple(x.shape)} input")
    return out


def rotary_(
    qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int
) -> torch.Tensor:
    """RoPE in place on the first ``heads`` heads of each row of ``qkv`` ``[tokens, width]``,
    whose rotary pairs are adjacent; ``cos_sin`` is float32 ``[max_positions, head_dim / 2, 2]``
    and ``positions`` int64 ``[tokens]``. Returns ``qkv``."""
    _elem(qkv)
    if qkv.dim() != 2 or qkv.stride(1) != 1 or positions.shape != (qkv.shape[0],):
        raise ValueError(
            f"rotary_: expected [tokens, width] rows and one position each, got "
            f"{tuple(qkv.shape)} and {tuple(positions.shape)}"
        )
    if cos_sin.dtype != torch.float32 or not cos_sin.is_contiguous() or cos_sin.shape[1:] != (head_dim // 2, 2):
        raise ValueError(f"rotary_: cos_sin must be contiguous float32 [positions, {head_dim // 2}, 2]")
    positions = positions.to(torch.int64).contiguous()
    bf16, stride = int(qkv.dtype == torch.bfloat16), qkv.stride(0)
    base, pos, table = ffi.cast("char *", qkv.data_ptr()), _ptr(positions, "int64_t *"), _ptr(cos_sin, "float *")
    if lib.rotary_in_place(base, bf16, stride, qkv.shape[0], pos, table, cos_sin.shape[0], heads, head_dim) != 0:
        raise ValueError(
            f"rotary_ rejected {tuple(qkv.shape)} rows of {heads} x {head_dim} "
            f"(or a position outside [0, {cos_sin.shape[0]}))"
        )
    return qkv
