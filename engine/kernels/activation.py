"""RMSNorm (optionally fused with the residual add), SiLU-and-multiply and RoPE in one C call
each (csrc/cpu/activation.c), for float32 and bf16 on CPUs.

Why: a decode step at small batch touches a few KiB per op and spends its time in torch's
dispatch; RMSNorm alone is 5-6 ATen ops, called twice per layer. At prefill sizes in bf16
each of those ATen ops is a pass over memory that widens to float32 and rounds back: the
three ops took ~30% of a 2048-token bf16 step. The fused add also saves the separate
residual add and a pass over the hidden state at any batch size. The bf16 kernels round
where transformers' bf16 modules do, so outputs stay transformers' own.

Each C call runs on one thread. With more torch threads (``num_threads`` > 1) a large call is
split by rows over a small thread pool (cffi releases the GIL during the call), so the
kernels never become the serial part of a step that torch's GEMMs run in parallel.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

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


# Below this many elements one thread finishes before a hand-off to the pool would (~20-50 us).
PARALLEL_MIN_ELEMENTS = 1 << 17
_pool: Optional[ThreadPoolExecutor] = None
_pool_threads = 0
_pool_lock = threading.Lock()


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_threads
    with _pool_lock:
        if _pool_threads != threads:  # first use, or torch's thread count changed
            old, _pool, _pool_threads = _pool, ThreadPoolExecutor(threads, thread_name_prefix="ringllm-act"), threads
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _split_threads(rows: int, row_elements: int) -> int:
    """How many threads a call over these rows is split across (1: not split)."""
    threads = min(torch.get_num_threads(), rows)
    return 1 if rows * row_elements < PARALLEL_MIN_ELEMENTS else max(1, threads)


def _over_rows(rows: int, row_elements: int, run: Callable[[int, int], int]) -> int:
    """``run(first_row, count)`` over all rows: in one call, or split over torch's thread count
    when the call is large. Returns 0, or the first non-zero return code."""
    threads = _split_threads(rows, row_elements)
    if threads == 1:
        return run(0, rows)
    per = -(-rows // threads)
    futures = [_thread_pool(threads).submit(run, first, min(per, rows - first)) for first in range(0, rows, per)]
    codes = [f.result() for f in futures]
    return next((c for c in codes if c != 0), 0)


def _ptr(t: Optional[torch.Tensor], kind: str):
    return ffi.NULL if t is None else ffi.cast(kind, t.data_ptr())


def _elem(t: torch.Tensor) -> str:
    if t.dtype not in _DTYPES:
        raise ValueError(f"the activation kernels take float32 or bfloat16, got {t.dtype}")
    return "float *" if t.dtype == torch.float32 else "uint16_t *"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: Optional[torch.Tensor] = None) -> torch.Tensor:
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
    rc = _over_rows(rows, cols, lambda first, n: fn(xp + first * cols, hp if residual is None else hp + first * cols,
                                                     wp, op + first * cols, n, cols, eps))
    if rc != 0:
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
    if _over_rows(x.shape[0], 3 * d, lambda first, n: fn(xp + first * 2 * d, op + first * d, n, d)) != 0:
        raise ValueError(f"silu_and_mul rejected a {tuple(x.shape)} input")
    return out


def rotary_(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int,
            head_dim: int) -> torch.Tensor:
    """RoPE in place on the first ``heads`` heads of each row of ``qkv`` ``[tokens, width]``,
    whose rotary pairs are adjacent; ``cos_sin`` is float32 ``[max_positions, head_dim / 2, 2]``
    and ``positions`` int64 ``[tokens]``. Returns ``qkv``."""
    _elem(qkv)
    if qkv.dim() != 2 or qkv.stride(1) != 1 or positions.shape != (qkv.shape[0],):
        raise ValueError(f"rotary_: expected [tokens, width] rows and one position each, got "
                         f"{tuple(qkv.shape)} and {tuple(positions.shape)}")
    if cos_sin.dtype != torch.float32 or not cos_sin.is_contiguous() or cos_sin.shape[1:] != (head_dim // 2, 2):
        raise ValueError(f"rotary_: cos_sin must be contiguous float32 [positions, {head_dim // 2}, 2]")
    positions = positions.to(torch.int64).contiguous()
    if _split_threads(qkv.shape[0], heads * head_dim) > 1 and len(positions) and not (
            int(positions.min()) >= 0 and int(positions.max()) < cos_sin.shape[0]):
        raise ValueError(f"rotary_: a position outside [0, {cos_sin.shape[0]})")  # before any slice writes
    bf16, stride = int(qkv.dtype == torch.bfloat16), qkv.stride(0)
    base, pos, table = ffi.cast("char *", qkv.data_ptr()), _ptr(positions, "int64_t *"), _ptr(cos_sin, "float *")
    rc = _over_rows(qkv.shape[0], heads * head_dim, lambda first, n: lib.rotary_in_place(
        base + first * stride * qkv.element_size(), bf16, stride, n, pos + first, table, cos_sin.shape[0], heads,
        head_dim))
    if rc != 0:
        raise ValueError(f"rotary_ rejected {tuple(qkv.shape)} rows of {heads} x {head_dim} "
                         f"(or a position outside [0, {cos_sin.shape[0]}))")
    return qkv
