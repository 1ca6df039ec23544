"""Random, valid GGUF blocks of every type the quantized kernels run, for tests and benchmarks.

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


def random_blocks(qtype: int, out_features: int, in_features: int, rng: np.random.Generator,
                  scale: float = 0.01) -> np.ndarray:
    """``[out, in / block_weights * block_bytes]`` uint8: random quants and sub-block scales,
    f16 scales ``|N(0, scale)|`` (a min field may be any sign, as in real files)."""
    bw, bb = block_weights(qtype), block_bytes(qtype)
    if not bw or in_features % bw:
        raise ValueError(f"in_features {in_features} is not a multiple of type {qtype}'s {bw}-weight block")
    nblocks = out_features * (in_features // bw)
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for i, off in enumerate(_HALF_FIELDS[qtype]):
        vals = rng.standard_normal(nblocks).astype(np.float32) * np.float32(scale)
        raw[:, off:off + 2] = (np.abs(vals) if i == 0 else vals).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(out_features, -1)
