"""Rotary embedding applied in place to the q and k heads of the fused qkv rows.

ringllm permutes each q/k head's rows at load (engine/models/rope.py) so that the pairs
transformers rotates together, (i, i + d/2), sit side by side at (2i, 2i + 1); RoPE is
then a complex multiply of each adjacent pair by ``cos + i sin`` of its position. The
kernel does that in float32 and rounds once to the activations' dtype. ``cos_sin`` is the
model's ``rope_cis`` buffer seen as real numbers (``torch.view_as_real``: ``[max_len, d/2, 2]``),
so no second table is built. One program per token covers all its q and k heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton import LAUNCH_OPTIONS


@triton.jit
def _rotary_kernel(
    x_ptr,
    positions_ptr,
    cos_sin_ptr,
    stride_x,
    stride_p,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    head = tl.arange(0, HEADS_PAD)[:, None]
    pair = tl.arange(0, HALF_PAD)[None, :]
    pair_ok = pair < HALF
    ok = (head < NUM_HEADS) & pair_ok
    angle = cos_sin_ptr + pos * stride_p + 2 * pair
    cos = tl.load(angle, mask=pair_ok, other=0.0)
    sin = tl.load(angle + 1, mask=pair_ok, other=0.0)
    re_ptr = x_ptr + token * stride_x + head * (2 * HALF) + 2 * pair
    re = tl.load(re_ptr, mask=ok, other=0.0).to(tl.float32)
    im = tl.load(re_ptr + 1, mask=ok, other=0.0).to(tl.float32)
    tl.store(re_ptr, (re * cos - im * sin).to(x_ptr.dtype.element_ty), mask=ok)
    tl.store(re_ptr + 1, (im * cos + re * sin).to(x_ptr.dtype.element_ty), mask=ok)


def rotary_embedding(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, head_dim: int) -> None:
    """Rotate, in place, every head of ``x`` (``[T, n * head_dim]``, e.g. ``qkv[:, :q_size + kv_size]``;
    unit-stride rows) by the angles of its token's position (``positions``: ``[T]``)."""
    if (
        x.stride(1) != 1
        or x.shape[1] % head_dim
        or head_dim % 2
        or cos_sin.shape[1:] != (head_dim // 2, 2)
        or cos_sin.stride()[1:] != (2, 1)
    ):
        raise ValueError(
            f"rotary_embedding: rows {tuple(x.shape)} of whole heads of even size {head_dim}, "
            f"angles {tuple(cos_sin.shape)} as [max_len, head_dim / 2, 2]"
        )
    num_heads, half = x.shape[1] // head_dim, head_dim // 2
    if x.shape[0]:
        _rotary_kernel[(x.shape[0],)](
            x,
            positions,
            cos_sin,
            x.stride(0),
            cos_sin.stride(0),
            NUM_HEADS=num_heads,
            HALF=half,
            HEADS_PAD=triton.next_power_of_2(num_heads),
            HALF_PAD=triton.next_power_of_2(half),
            **LAUNCH_OPTIONS,
        )
