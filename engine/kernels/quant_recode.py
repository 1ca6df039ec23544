"""GGUF types with no kernel of their own, re-encoded losslessly into one that has one.

Why: llama.cpp writes Q5_0 wherever a K-quant does not fit a tensor (a row not a multiple of 256
weights), so a small model's Q4_K_M file is mostly Q5_0. Dequantized at load those tensors ran
at bf16 speed and bytes (64 a block). A Q5_0 weight is d * (q - 16) with q in 0..31 and one f16 d
per 32 weights; Q8_0 is d * q with q an int8 and the same f16 d, so every Q5_0 block is exactly one
Q8_0 block (34 bytes for 22) and runs on the Q8_0 kernels.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.kernels.quant import Q8_0

Q5_0 = 6  # gguf.GGMLQuantizationType.Q5_0
Q5_0_BYTES, Q8_0_BYTES = 22, 34  # a block: f16 d, then Q5_0's 4 high-bit bytes and 16 nibble bytes


def q5_0_as_q8_0(data: torch.Tensor) -> torch.Tensor:
    """``[rows, n * 22]`` uint8 Q5_0 blocks as ``[rows, n * 34]`` Q8_0 blocks of the same values.
    Weight j < 16 of a block is its j-th byte's low nibble with bit j of qh as bit 4, weight
    16 + j the high nibble with bit 16 + j (ggml's dequantize_row_q5_0)."""
    rows = data.shape[0]
    blocks = data.contiguous().numpy().reshape(-1, Q5_0_BYTES)
    qh = np.ascontiguousarray(blocks[:, 2:6]).view("<u4")[:, 0]
    high = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16) << 4
    qs = blocks[:, 6:].astype(np.int16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | high
    out = np.empty((blocks.shape[0], Q8_0_BYTES), dtype=np.uint8)
    out[:, :2] = blocks[:, :2]
    out[:, 2:] = (q - 16).astype(np.int8).view(np.uint8)
    return torch.from_numpy(out.reshape(rows, -1))


# a type -> (the kernel type it becomes, value for value; the re-encoding)
RECODED = {Q5_0: (Q8_0, q5_0_as_q8_0)}
