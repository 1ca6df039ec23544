"""Decode attention read straight from the paged KV cache (csrc/cpu/paged_attention.c).

Why: torch's route gathers every decode's blocks into a padded dense copy per layer (and
converts a bf16 cache to float32 on the way), then runs masked SDPA over the padding: a
sizeable share of a batch-64 decode step (benchmarks/RESULTS.md, "Kernel choices"). The kernel
walks each sequence's own blocks once, in float32, handles a sliding window by where it starts,
and Gemma 2's score soft-cap as a vectorised tanh over each head's scores before the softmax
(the torch fallback gathers the blocks and materialises the scores: a decode step several times
as long, RESULTS.md, "Soft-capped decode attention").

It then became the bottleneck of large decode steps (issue 14), so it reads each K and V row
once for all the query heads that share it, sums scores several keys at a time, and
prefetches the scattered rows; an AVX-512 variant runs where CPUID reports it (AVX2 + FMA
stays the baseline). It now reads the cache at about the rate one core streams memory
(benchmarks/RESULTS.md, "Kernel choices"), so more speed would come from more cores, not fewer
instructions.
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.kernels.cpu import available, ffi, kernel_error, lib

_CACHE_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
MAX_HEAD_DIM = 256 if lib is None else lib.PAGED_ATTN_MAX_HEAD_DIM


def supports(device: torch.device, compute_dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int) -> bool:
    """Whether ``decode_attention`` runs a model with these properties (else torch's path)."""
    return (
        available()
        and device.type == "cpu"
        and compute_dtype in _CACHE_DTYPES
        and cache_dtype in _CACHE_DTYPES
        and head_dim % 8 == 0
        and head_dim <= MAX_HEAD_DIM
    )


def decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    window: Optional[int],
    allow_avx512: bool = True,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """``[D, num_heads * head_dim]`` attention of D decode queries, in q's dtype (the kernel
    computes in float32: bf16 queries are widened first, the output rounded back).

    q: ``[D, >= num_heads * head_dim]`` float32 or bf16 rows (a slice of the fused qkv is fine);
    kv_cache: one layer, ``[num_blocks, block_size, 2 * num_kv_heads * head_dim]``;
    block_table: ``[D, max_blocks]`` int64; seq_lens: ``[D]`` int64, each query attending to
    keys ``[max(0, len - window), len)``; softcap: scores capped as ``softcap * tanh(s / softcap)``
    before the softmax (Gemma 2). allow_avx512=False keeps the AVX2 variant on a CPU with
    AVX-512, so tests check both.
    """
    num_seqs = q.shape[0]
    out_dtype = q.dtype
    if out_dtype != torch.float32:
        q = q[:, : num_heads * head_dim].float()
    if q.stride(-1) != 1 or not kv_cache.is_contiguous():
        raise ValueError("decode_attention needs unit-stride query rows and a contiguous cache")
    out = torch.empty(num_seqs, num_heads * head_dim, dtype=torch.float32)
    block_table = block_table.contiguous()
    seq_lens = seq_lens.contiguous()
    rc = lib.paged_decode_attention(
        ffi.cast("const float *", q.data_ptr()),
        q.stride(0),
        ffi.cast("const void *", kv_cache.data_ptr()),
        _CACHE_DTYPES[kv_cache.dtype],
        kv_cache.shape[0],
        kv_cache.shape[1],
        ffi.cast("const int64_t *", block_table.data_ptr()),
        block_table.shape[1],
        ffi.cast("const int64_t *", seq_lens.data_ptr()),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        window or 0,
        scale,
        softcap or 0.0,
        int(allow_avx512),
        ffi.cast("float *", out.data_ptr()),
    )
    if rc:
        raise kernel_error(
            rc,
            "paged_decode_attention",
            f"its arguments: q {tuple(q.shape)}, cache {tuple(kv_cache.shape)}, table {tuple(block_table.shape)}, "
            f"heads {num_heads}/{num_kv_heads}x{head_dim} (a block id out of range or a length over the table?)",
            ValueError,
        )
    return out if out_dtype == torch.float32 else out.to(out_dtype)
