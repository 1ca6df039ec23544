"""Paged attention for a flattened batch of decodes and prefill chunks, in one Triton kernel.

Every query token attends to keys read from ringllm's paged cache (one layer:
``[num_blocks, block_size, 2 * Hkv * d]``, a slot holding that token's K heads then V
heads), so the step's own K/V must already be written (``reshape_and_cache``). A decode
is a sequence with one query token, a prefill chunk one with n; both sit at positions
``[context_len, context_len + n)`` and see keys ``[0, position]`` (causal with the
context as offset), within ``window`` keys when the layer slides. Blocks cached by an
earlier step or request (chunked prefill, prefix caching) are read like any other.

Why one kernel (vLLM's unified attention): a mixed step needs no split into decode and
prefill launches, no gather of the context into a dense copy, no mask tensor, and the
launch grid depends only on the token and sequence counts, never on their values, so a
decode step can be captured in a CUDA graph. Each program takes ``BLOCK_Q`` query tokens
of one sequence times the ``G`` query heads sharing one KV head (``BLOCK_M`` rows), so
each K/V tile is loaded once for all of them, and walks the keys in tiles of ``TILE_N``
with an online softmax in float32. A program finds its sequence by a binary search over
``cu_seqlens``: sequence s owns programs from ``cu_seqlens[s] // BLOCK_Q + s`` on, an
upper bound that needs no per-sequence count from the host.

On CPU tensors (only under ``TRITON_INTERPRET=1``, the tests) the dots take float32
operands: the interpreter computes on bf16 values as raw bits. The probabilities are
still rounded to the cache's dtype first, so both paths round alike.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from engine.kernels.triton import LAUNCH_OPTIONS

_TILE_N = 32  # keys per inner-loop step (a tl.dot needs at least 16)


@triton.jit
def _unified_attention_kernel(
    out_ptr,
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    cu_seqlens_ptr,
    context_lens_ptr,
    scale,
    num_seqs,
    window,
    stride_ot,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    SLIDING: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # The sequence this program serves: the last s whose first program is <= pid.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    first = (pid - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first query token of this program, in the sequence
    if first >= q_len:
        return
    context = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    tok = first + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows // GROUP < BLOCK_Q) & (tok < q_len)
    pos = context + tok  # each row's absolute position
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < HEAD_DIM
    q = tl.load(
        q_ptr + (q_start + tok)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + dim[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    kv_end = tl.minimum(context + q_len, context + first + BLOCK_Q)  # past this program's last position
    kv_start = 0
    if SLIDING:
        kv_start = tl.maximum(context + first - window + 1, 0) // TILE_N * TILE_N
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_col = kv_head * HEAD_DIM + dim
    v_col = (NUM_KV_HEADS + kv_head) * HEAD_DIM + dim
    for start in range(kv_start, kv_end, TILE_N):
        kpos = start + tl.arange(0, TILE_N)
        k_ok = kpos < kv_end
        block = tl.load(table + kpos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = cache_ptr + block * stride_cb + (kpos % BLOCK_SIZE) * stride_cs
        k = tl.load(slot[None, :] + k_col[:, None], mask=dim_ok[:, None] & k_ok[None, :], other=0.0)
        v = tl.load(slot[:, None] + v_col[None, :], mask=k_ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            s = tl.dot(q, k.to(tl.float32), input_precision=PRECISION)
        else:
            s = tl.dot(q, k.to(q.dtype), input_precision=PRECISION)
        s = s * scale
        visible = (kpos[None, :] <= pos[:, None]) & k_ok[None, :]
        if SLIDING:
            visible = visible & (kpos[None, :] > pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(v.dtype)  # rounded as the tensor-core path rounds it, whichever path runs
        if UPCAST:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision=PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + (q_start + tok)[:, None].to(tl.int64) * stride_ot + head[:, None] * HEAD_DIM + dim[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    max_query_len: Optional[int] = None,
) -> torch.Tensor:
    """Attention of every query row over its sequence's cached keys; returns ``[T, H * d]``.

    q: ``[T, H, d]``, rows of the same sequence contiguous and in order (a strided view of
    the fused qkv is fine: only ``d`` must be unit-stride). kv_cache: one layer,
    ``[num_blocks, block_size, 2 * Hkv * d]``, holding every key up to each sequence's last
    query (write the step's K/V first). block_tables: ``[S, max_blocks]`` int32.
    cu_seqlens: ``[S + 1]`` int32, sequence s owns rows ``[cu_seqlens[s], cu_seqlens[s+1])``.
    context_lens: ``[S]`` int32, tokens cached before this step (the first query's position).
    window: keys per query on a sliding-window layer (the query's own included), else None.
    out: where to write (``[T, H * d]``, unit-stride rows), else a new tensor of q's dtype.
    max_query_len: the longest sequence's query count when the caller knows it; it only
    picks the tile height (decode-only steps use 16 rows instead of 64).
    Nothing here reads a tensor's values on the host, so the call can be graph-captured.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = block_tables.shape[0]
    num_kv_heads = kv_cache.shape[2] // (2 * head_dim)
    if q.stride(2) != 1 or not kv_cache.is_contiguous() or num_heads % num_kv_heads:
        raise ValueError(
            f"paged_attention: q {tuple(q.shape)} (unit-stride d) and a contiguous cache "
            f"{tuple(kv_cache.shape)} with a whole number of query heads per KV head"
        )
    group = num_heads // num_kv_heads
    if out is None:
        out = q.new_empty(num_tokens, num_heads * head_dim)
    elif out.shape != (num_tokens, num_heads * head_dim) or out.stride(1) != 1:
        raise ValueError(f"paged_attention: out must be [{num_tokens}, {num_heads * head_dim}] with unit-stride rows")
    if max_query_len is None:
        max_query_len = 1 if num_tokens == num_seqs else num_tokens
    rows = 16 if max_query_len * group <= 16 else 64
    block_m = max(rows, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _unified_attention_kernel[grid](
        out,
        q,
        kv_cache,
        block_tables,
        cu_seqlens,
        context_lens,
        scale,
        num_seqs,
        window or 0,
        out.stride(0),
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        D_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=kv_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=_TILE_N,
        SLIDING=window is not None,
        UPCAST=q.device.type == "cpu",
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **LAUNCH_OPTIONS,
    )
    return out
