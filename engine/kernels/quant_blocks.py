"""GGUF blocks for tests and benchmarks: random, valid blocks of every type the quantized kernels
run, and K-quant blocks of given float values (``quantize_k``).

Why: the gguf package quantizes Q4_0, Q4_1 and Q8_0 but not the K-quants, and random bytes are
not valid blocks (their f16 scales can be inf or NaN). A block of any supported type is random
bytes with its f16 scale fields overwritten by finite values; where those fields lie is the one
piece of each layout this module knows (the full layouts are in csrc/cpu/quant_gemv.c and
csrc/cpu/quant_kquants.c).
"""

from __future__ import annotations

import numpy as np

from engine.kernels.quant import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, block_bytes, block_weights

# Byte offsets of each block's f16 fields: (scale, min) or (scale,).
_HALF_FIELDS = {Q4_0: (0,), Q4_1: (0, 2), Q8_0: (0,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}


def random_blocks(
    qtype: int, out_features: int, in_features: int, rng: np.random.Generator, scale: float = 0.01
) -> np.ndarray:
    """``[out, in / block_weights * block_bytes]`` uint8: random quants and sub-block scales,
    f16 scales ``|N(0, scale)|`` (a min field may be any sign, as in real files)."""
    bw, bb = block_weights(qtype), block_bytes(qtype)
    if not bw or in_features % bw:
        raise ValueError(f"in_features {in_features} is not a multiple of type {qtype}'s {bw}-weight block")
    nblocks = out_features * (in_features // bw)
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for i, off in enumerate(_HALF_FIELDS[qtype]):
        vals = rng.standard_normal(nblocks).astype(np.float32) * np.float32(scale)
        raw[:, off : off + 2] = (np.abs(vals) if i == 0 else vals).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(out_features, -1)


# ---------------------------------------------------------------- K-quant blocks from float values


def quantize_k(values: np.ndarray, qtype: int) -> np.ndarray:
    """``values`` (``[rows, in]``, ``in`` a multiple of 256) as Q4_K, Q5_K or Q6_K blocks,
    ``[rows, in / 256 * block_bytes]`` uint8, in ggml's layouts (``quantize_row_q*_K_ref``'s
    packing), for the tests that need a model's own weights in a K-quant file: the gguf package
    quantizes only the 32-weight types. The scales are the plain ones (a sub-block's range over
    its levels), not llama.cpp's searched ones, so the values differ a little from its files'
    but read back through ``gguf.quants.dequantize`` exactly as the kernels read them."""
    rows, cols = values.shape
    if cols % 256:
        raise ValueError(f"K-quants need rows of a multiple of 256 values, got {cols}")
    x = values.astype(np.float32).reshape(-1, 256)
    blocks = {Q4_K: lambda: _q45_k(x, 4), Q5_K: lambda: _q45_k(x, 5), Q6_K: lambda: _q6_k(x)}[qtype]()
    assert blocks.shape[1] == block_bytes(qtype)
    return blocks.reshape(rows, -1)


def _half(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _q45_k(x: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K / Q5_K: 8 sub-blocks of 32, each ``d * sc * q - dmin * m`` with 6-bit sc and m."""
    n, top = x.shape[0], (1 << bits) - 1
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(-1), 0)
    scale, mins = (sub.max(-1) - lo) / top, -lo
    d, dmin = scale.max(-1) / 63, mins.max(-1) / 63
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(np.divide(scale, d16[:, None], out=np.zeros_like(scale), where=d16[:, None] > 0)), 0, 63)
    m = np.clip(np.rint(np.divide(mins, dmin16[:, None], out=np.zeros_like(mins), where=dmin16[:, None] > 0)), 0, 63)
    step, offset = (d16[:, None] * sc)[..., None], (dmin16[:, None] * m)[..., None]
    q = np.clip(np.rint(np.divide(sub + offset, step, out=np.zeros_like(sub), where=step > 0)), 0, top)
    q = q.astype(np.uint8).reshape(n, 4, 2, 32)  # 64-value chunks: low nibbles the first 32, high the next
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    scales = np.zeros((n, 12), np.uint8)
    scales[:, :4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    scales[:, 8:] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    qs = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(n, 128)
    parts = [_half(d16), _half(dmin16), scales]
    if bits == 5:  # the fifth bits: value j + 64c (+ 32) sets bit 2c (2c + 1) of qh[j]
        high = (q >> 4).astype(np.uint8)
        shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)
        parts.append(np.bitwise_or.reduce(high << shifts[None, :, :, None], axis=(1, 2)))
    return np.concatenate(parts + [qs], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K: 16 sub-blocks of 16, each ``d * sc * (q - 32)`` with an int8 sc and 6-bit q."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(np.divide(scale, d[:, None], out=np.zeros_like(scale), where=d[:, None] > 0)), 0, 127)
    step = (d[:, None] * sc)[..., None]
    q = np.clip(np.rint(np.divide(sub, step, out=np.zeros_like(sub), where=step > 0)), -32, 31) + 32
    q = q.astype(np.uint8).reshape(n, 2, 4, 32)  # 128-value halves, each four runs of 32
    ql = np.concatenate(
        [(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4), (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2
    ).reshape(n, 128)
    qh = np.bitwise_or.reduce((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None], axis=2)
    return np.concatenate([ql, qh.reshape(n, 64), sc.astype(np.int8).view(np.uint8), _half(d)], axis=1)
