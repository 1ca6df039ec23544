"""Writing a step's keys and values into the paged cache (vLLM's reshape-and-cache).

In ringllm's layout a cache slot holds a token's K heads then V heads, exactly the tail
of the fused qkv projection, so each token's ``qkv[t, q_size:]`` row is copied whole into
its slot, converted to the cache's dtype on the way. One program per token; a negative
slot (a padded token of a captured CUDA graph) writes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton import LAUNCH_OPTIONS


@triton.jit
def _reshape_and_cache_kernel(kv_ptr, cache_ptr, slot_ptr, stride_kv, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    src = kv_ptr + token.to(tl.int64) * stride_kv
    dst = cache_ptr + slot * WIDTH
    for start in range(0, WIDTH, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < WIDTH
        tl.store(dst + cols, tl.load(src + cols, mask=ok).to(cache_ptr.dtype.element_ty), mask=ok)


def reshape_and_cache(kv: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Copy row t of ``kv`` (``[T, 2 * Hkv * d]``: ``qkv[:, q_size:]``, a strided view is fine)
    into flat slot ``slot_mapping[t]`` (block * block_size + offset) of one layer's
    contiguous cache ``[num_blocks, block_size, 2 * Hkv * d]``."""
    width = kv_cache.shape[-1]
    if kv.shape[1] != width or kv.stride(1) != 1 or not kv_cache.is_contiguous():
        raise ValueError(
            f"reshape_and_cache: rows {tuple(kv.shape)} (unit-stride) into a contiguous cache "
            f"{tuple(kv_cache.shape)} of the same width"
        )
    if kv.shape[0]:
        _reshape_and_cache_kernel[(kv.shape[0],)](
            kv,
            kv_cache,
            slot_mapping,
            kv.stride(0),
            WIDTH=width,
            BLOCK=min(1024, triton.next_power_of_2(width)),
            **LAUNCH_OPTIONS,
        )
