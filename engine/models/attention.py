"""Attention over the paged KV cache for one flattened batch of decodes and prefill chunks.

Layout. Each layer's cache is one tensor ``[num_blocks, block_size, 2 * Hkv * d]``:
a slot (block, offset) holds that token's K heads then V heads, exactly the tail
of the fused qkv projection, so writing a step's K/V is a single ``index_copy_``
of ``qkv[:, q_size:]`` into the flat ``[num_slots, 2 * Hkv * d]`` view.

Batch order (built by the runner, see ``AttentionMetadata``): the decode tokens
come first, then each prefill chunk as a contiguous run of rows.

Decodes. On a CPU the C kernel (engine/kernels/paged_attention.py) reads each decode's
blocks where they lie, with no gather, padding or mask; the runner then sets
``decode_seq_lens`` instead of the masks. Elsewhere all decodes attend in one batched
SDPA call. Their blocks are gathered once per layer with one ``index_select`` over whole
blocks (a ``[D, L]`` copy, L = the longest context rounded up to a block), and a
boolean mask hides each row's padding. Grouped-query attention is folded into the query length: the G
query heads sharing a KV head become G "queries" of that head, so K/V are read
once per KV head and never repeated; the masks of those G rows are identical
because they sit at the same position. Everything that does not depend on the
layer (block table, masks) is built once per step and shared by all layers.

The cache may hold a narrower dtype than the activations (bf16 cache, float32
compute on CPUs without native bf16): K/V are converted on write and after the gather.

Prefill chunks run one SDPA call each (a few per step): attending to the chunk
itself when nothing precedes it, else to keys gathered from the cache with an
explicit causal-with-offset mask. A long chunk attending to itself is split into
slices of query rows, each seeing only the keys up to its last row (``_causal_in_slices``).

The Triton forward (engine/models/triton_forward.py) needs none of the above but
``slot_mapping``: one kernel reads every sequence's keys through ``block_tables``, with
``cu_seqlens`` and ``context_lens`` saying where each sequence's queries sit
(``triton_metadata`` builds them).

Soft-capped scores (Gemma 2: ``cap * tanh(s / cap)`` before the mask) are something SDPA does not
compute: with a cap, prefill chunks (and decodes where the C kernel does not run; it caps them
itself) attend in plain torch ops (``_capped_attention``, HF's eager order) over the same keys
and masks.

Each forward names its builder (``TorchAttentionBuilder``, ``TritonAttentionBuilder``): the
model runner asks the model's builder for a step's rows and metadata and never asks which
backend runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from engine.kernels import paged_attention as paged_kernel
from engine.kernels.paged_attention import decode_attention


@dataclass
class PrefillChunk:
    start: int  # first row of the chunk in the flattened batch
    num_tokens: int
    # Slots of positions [0, context_len + num_tokens) when earlier tokens are in the
    # cache (chunked prefill, prefix-cache hit); None: the chunk attends to itself only.
    kv_slots: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None  # [n, keys] bool, True = attend; None = plain causal
    window_mask: Optional[torch.Tensor] = None  # the same for sliding-window layers


@dataclass
class AttentionMetadata:
    """Per-step inputs shared by every layer; built by the model runner."""

    slot_mapping: torch.Tensor  # [T] flat cache slot receiving each token's K/V
    num_decodes: int = 0
    decode_blocks: Optional[torch.Tensor] = None  # [D * nb] block ids, row-major, padded
    decode_len: int = 0  # L = nb * block_size
    decode_mask: Optional[torch.Tensor] = None  # [D, 1, 1, L] bool
    decode_window_mask: Optional[torch.Tensor] = None
    # Set instead of the masks when decodes run in the C kernel (engine/kernels/paged_attention.py):
    decode_seq_lens: Optional[torch.Tensor] = None  # [D] int64
    window: Optional[int] = None  # the model's sliding window, for its sliding layers
    prefills: list[PrefillChunk] = field(default_factory=list)
    # The Triton forward's inputs, one row per sequence in batch order (decodes, then prefill chunks):
    block_tables: Optional[torch.Tensor] = None  # [S, max_blocks] int32, rows zero-padded
    cu_seqlens: Optional[torch.Tensor] = None  # [S + 1] int32, sequence s owns rows [cu[s], cu[s+1])
    context_lens: Optional[torch.Tensor] = None  # [S] int32, tokens cached before this step
    max_query_len: int = 0  # host-side: the longest sequence's query count (picks the kernel's tile)


def triton_metadata(
    md: AttentionMetadata,
    block_ids: list[list[int]],
    query_lens: list[int],
    context_lens: list[int],
    device: torch.device,
) -> None:
    """Fill ``md``'s Triton fields for sequences given in batch order. Built on the host and,
    on a GPU, copied from pinned memory without waiting (the step's first kernel orders it)."""
    width = max(1, max(len(b) for b in block_ids))
    table = [b + [0] * (width - len(b)) for b in block_ids]
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    md.block_tables = to_device(table, torch.int32, device)
    md.cu_seqlens = to_device(cu, torch.int32, device)
    md.context_lens = to_device(context_lens, torch.int32, device)
    md.max_query_len = max(query_lens)


class StepRows:
    """A step's flattened rows: token ids, positions, the first row of each scheduled request
    (in the scheduler's order), and the attention metadata."""

    __slots__ = ("ids", "positions", "first_row", "md")

    def __init__(self, num_requests: int, num_decodes: int) -> None:
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.first_row = [0] * num_requests
        self.md = AttentionMetadata(slot_mapping=None, num_decodes=num_decodes)

    def add(self, i: int, req, start: int, n: int, block_size: int, slots: list[int]) -> None:
        """Request ``i``'s tokens [start, start + n) as the next rows."""
        self.first_row[i] = len(self.ids)
        ids = req.all_token_ids[start : start + n]
        if len(ids) < n:  # a decode with draft tokens after its last known one (spec_decode/)
            ids += req.spec_token_ids[: n - len(ids)]
        self.ids.extend(ids)
        self.positions.extend(range(start, start + n))
        blocks = req.block_ids
        slots.extend(blocks[q // block_size] * block_size + q % block_size for q in range(start, start + n))


class TorchAttentionBuilder:
    """Metadata for ``paged_attention`` above: decodes (the C kernel's lengths, or SDPA's
    gathered blocks and masks), then one ``PrefillChunk`` per prefill."""

    def __init__(
        self,
        device: torch.device,
        act_dtype: torch.dtype,
        cache_dtype: torch.dtype,
        head_dim: int,
        window: Optional[int],
        block_size: int,
        deterministic: bool = False,
    ) -> None:
        self.device, self.window, self.block_size = device, window, block_size
        self.decode_kernel = paged_kernel.supports(device, act_dtype, cache_dtype, head_dim)
        if deterministic and not self.decode_kernel:
            raise ValueError(
                f"deterministic: needs the CPU decode-attention kernel, which does not run "
                f"{act_dtype} activations with a {cache_dtype} cache and head_dim {head_dim} on {device}"
            )
        self.deterministic = deterministic

    def build(self, reqs: list, counts: list[int]) -> StepRows:
        if self.deterministic:
            return self._build_every_row_as_decode(reqs, counts)
        bs = self.block_size
        decodes = [i for i, n in enumerate(counts) if n == 1]
        rows = StepRows(len(reqs), len(decodes))
        md, slots = rows.md, []
        if decodes:
            seq_lens = []
            for i in decodes:
                p = reqs[i].num_computed_tokens
                rows.add(i, reqs[i], p, 1, bs, slots)
                seq_lens.append(p + 1)
            nb = -(-max(seq_lens) // bs)
            table = [reqs[i].block_ids[:nb] + [0] * (nb - len(reqs[i].block_ids[:nb])) for i in decodes]
            md.decode_blocks = torch.tensor(table, dtype=torch.long).view(-1).to(self.device)
            md.decode_len = nb * bs
            if self.decode_kernel:
                md.decode_seq_lens, md.window = torch.tensor(seq_lens, dtype=torch.long), self.window
            else:
                md.decode_mask, md.decode_window_mask = build_decode_masks(
                    torch.tensor(seq_lens, device=self.device), md.decode_len, self.window
                )
        for i, n in enumerate(counts):
            if n == 1:
                continue
            r, p0 = reqs[i], reqs[i].num_computed_tokens
            rows.add(i, r, p0, n, bs, slots)
            chunk = PrefillChunk(rows.first_row[i], n)
            chunk.mask, chunk.window_mask = build_prefill_masks(p0, n, self.window, self.device)
            if p0:
                table = torch.tensor(r.block_ids[: -(-(p0 + n) // bs)], dtype=torch.long)
                kv_pos = torch.arange(p0 + n)
                chunk.kv_slots = (table[kv_pos // bs] * bs + kv_pos % bs).to(self.device)
            md.prefills.append(chunk)
        md.slot_mapping = to_device(slots, torch.long, self.device)
        return rows

    def _build_every_row_as_decode(self, reqs: list, counts: list[int]) -> StepRows:
        """``deterministic``: every row, prompt tokens included, is a query of the C decode
        kernel over the cache (this step's K/V are written before it reads). A prompt's rows
        otherwise go through SDPA, whose tiling follows the chunk's length and whether earlier
        tokens are cached (a prefix-cache hit, a later chunk), so the same token's attention
        differed with them; in the kernel a query at position p reads keys [0, p] in one order
        whatever else is in the step. Costs prefill speed: the kernel is not a tiled GEMM."""
        bs = self.block_size
        rows = StepRows(len(reqs), sum(counts))
        md, slots, seq_lens, owners = rows.md, [], [], []
        for i, n in enumerate(counts):
            p0 = reqs[i].num_computed_tokens
            rows.add(i, reqs[i], p0, n, bs, slots)
            seq_lens.extend(range(p0 + 1, p0 + n + 1))
            owners.extend([i] * n)
        nb = -(-max(seq_lens) // bs)
        tables = [reqs[i].block_ids[:nb] + [0] * (nb - len(reqs[i].block_ids[:nb])) for i in range(len(reqs))]
        md.decode_blocks = torch.tensor(tables, dtype=torch.long)[torch.tensor(owners)].view(-1)
        md.decode_len = nb * bs
        md.decode_seq_lens, md.window = torch.tensor(seq_lens, dtype=torch.long), self.window
        md.slot_mapping = to_device(slots, torch.long, self.device)
        return rows

    def profile(self, chunk_lens: list[int], num_blocks: int) -> AttentionMetadata:
        """A worst-case step of prompts attending to themselves (the CUDA memory profile)."""
        chunks, start = [], 0
        for n in chunk_lens:
            chunks.append(PrefillChunk(start, n))
            start += n
        positions = torch.cat([torch.arange(n) for n in chunk_lens])
        return AttentionMetadata(
            slot_mapping=(positions % (num_blocks * self.block_size)).to(self.device), prefills=chunks
        )


class TritonAttentionBuilder(TorchAttentionBuilder):
    """Metadata for the Triton forward: every sequence in batch order (decodes, then prefill
    chunks) with its block table, query and context lengths, instead of masks and gathered slots."""

    def build(self, reqs: list, counts: list[int]) -> StepRows:
        bs = self.block_size
        order = [i for i, n in enumerate(counts) if n == 1] + [i for i, n in enumerate(counts) if n != 1]
        rows = StepRows(len(reqs), sum(1 for n in counts if n == 1))
        slots, tables, query_lens, contexts = [], [], [], []
        for i in order:
            r, n = reqs[i], counts[i]
            p0 = r.num_computed_tokens
            rows.add(i, r, p0, n, bs, slots)
            tables.append(r.block_ids[: -(-(p0 + n) // bs)])
            query_lens.append(n)
            contexts.append(p0)
        triton_metadata(rows.md, tables, query_lens, contexts, self.device)
        rows.md.slot_mapping = to_device(slots, torch.long, self.device)
        return rows

    def profile(self, chunk_lens: list[int], num_blocks: int) -> AttentionMetadata:
        md = super().profile(chunk_lens, num_blocks)
        triton_metadata(md, [list(range(num_blocks))] * len(chunk_lens), chunk_lens, [0] * len(chunk_lens), self.device)
        return md


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device``: through pinned memory and a non-blocking copy on a GPU."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def build_decode_masks(
    seq_lens: torch.Tensor, length: int, window: Optional[int]
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Masks for decodes whose query sits at position seq_len - 1 and sees keys [0, seq_len)."""
    keys = torch.arange(length, device=seq_lens.device)
    mask = keys[None, :] < seq_lens[:, None]
    win = None
    if window is not None and int(seq_lens.max()) > window:
        win = mask & (keys[None, :] >= (seq_lens[:, None] - window))
    return mask[:, None, None, :], (None if win is None else win[:, None, None, :])


def build_prefill_masks(
    context_len: int, num_tokens: int, window: Optional[int], device: torch.device
) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Causal masks for a chunk at positions [context_len, context_len + n) over keys [0, context_len + n)."""
    total = context_len + num_tokens
    q_pos = torch.arange(context_len, total, device=device)[:, None]
    k_pos = torch.arange(total, device=device)[None, :]
    causal = k_pos <= q_pos
    mask = causal if context_len else None  # plain causal SDPA covers the no-context case
    win = None
    if window is not None and total > window:
        win = causal & (k_pos > q_pos - window)
    return mask, win


def paged_attention(
    qkv: torch.Tensor,
    kv_cache: torch.Tensor,
    md: AttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    sliding: bool,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend; returns ``[T, num_heads * head_dim]``."""
    num_tokens = qkv.shape[0]
    q_size = num_heads * head_dim
    kv_size = num_kv_heads * head_dim
    flat = kv_cache.view(-1, 2 * kv_size)
    flat.index_copy_(0, md.slot_mapping, qkv[:, q_size:].to(flat.dtype))

    num_decodes = md.num_decodes
    if num_decodes == num_tokens and not md.prefills:
        return _decode(qkv, kv_cache, md, num_heads, num_kv_heads, head_dim, scale, sliding, softcap)
    out = qkv.new_empty(num_tokens, q_size)
    if num_decodes:
        out[:num_decodes] = _decode(
            qkv[:num_decodes], kv_cache, md, num_heads, num_kv_heads, head_dim, scale, sliding, softcap
        )
    for chunk in md.prefills:
        rows = qkv[chunk.start : chunk.start + chunk.num_tokens]
        n = chunk.num_tokens
        # [1, heads, tokens, head_dim]: SDPA's fused (flash) kernels take only 4-D inputs; 3-D ones go
        # to the unfused math path, several times slower on CPU (RESULTS.md, "Kernel choices").
        q = rows[:, :q_size].view(n, num_heads, head_dim).transpose(0, 1)[None]
        if chunk.kv_slots is None:
            k = rows[:, q_size : q_size + kv_size].view(n, num_kv_heads, head_dim).transpose(0, 1)[None]
            v = rows[:, q_size + kv_size :].view(n, num_kv_heads, head_dim).transpose(0, 1)[None]
        else:
            kv = flat.index_select(0, chunk.kv_slots).to(qkv.dtype).view(-1, 2, num_kv_heads, head_dim)
            k, v = kv[:, 0].transpose(0, 1)[None], kv[:, 1].transpose(0, 1)[None]
        mask = chunk.window_mask if sliding and chunk.window_mask is not None else chunk.mask
        dst = out[chunk.start : chunk.start + n].view(n, num_heads, head_dim).transpose(0, 1)[None]
        if softcap is not None:
            if mask is None:
                mask = torch.ones(n, n, dtype=torch.bool, device=qkv.device).tril_()
            dst.copy_(_capped_attention(q, k, v, mask, scale, softcap))
        elif mask is None and n > 2 * causal_slice_rows(n):
            _causal_in_slices(q, k, v, scale, dst)
        else:
            dst.copy_(
                F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=num_heads != num_kv_heads
                )
            )
    return out


def causal_slice_rows(n: int) -> int:
    """Query rows per SDPA call when a long chunk attends causally to itself (see below)."""
    return max(128, n // 8)


def _causal_in_slices(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dst: torch.Tensor) -> None:
    """Causal self-attention of one chunk, its queries in slices that each see only the keys up
    to their last row. Why: PyTorch's CPU flash kernel tiles keys in blocks of up to 512 and
    computes a whole block for every query tile that reaches into it, so below 512 tokens a
    causal prompt costs as much as a non-causal one. A slice of rows [s, e) attends keys [0, e)
    under a lower-right causal mask (rows s + i see keys <= s + i), and the slices together
    compute ~half the score matrix (benchmarks/RESULTS.md, "Kernel choices")."""
    n, rows = q.shape[2], causal_slice_rows(q.shape[2])
    gqa = q.shape[1] != k.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril_()
    for s in range(0, n, rows):
        e = min(n, s + rows)
        if s == 0:
            o = F.scaled_dot_product_attention(
                q[:, :, :e], k[:, :, :e], v[:, :, :e], is_causal=True, scale=scale, enable_gqa=gqa
            )
        else:
            o = F.scaled_dot_product_attention(
                q[:, :, s:e], k[:, :, :e], v[:, :, :e], attn_mask=causal[s:e, :e], scale=scale, enable_gqa=gqa
            )
        dst[:, :, s:e] = o


CAPPED_SCORES_MAX = 1 << 22  # score elements one slice of capped attention materialises (16 MiB in float32)


def _capped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """Attention with soft-capped scores, as HF's eager Gemma 2: q ``[B, H, n, d]``, k/v
    ``[B, Hkv, keys, d]`` (H a multiple of Hkv), mask broadcastable to ``[B, H, n, keys]``
    (True = attend); softmax in float32. The scores are materialised, so the query rows go in
    slices of at most ``CAPPED_SCORES_MAX`` scores: a long chunk over a long context would
    otherwise hold a ``[H, n, keys]`` matrix (GBs at a few thousand tokens each)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    n, keys = q.shape[2], k.shape[2]
    rows = max(1, CAPPED_SCORES_MAX // (q.shape[0] * q.shape[1] * keys))
    mask = mask.expand(q.shape[0], q.shape[1], n, keys) if mask.dim() == 4 else mask.expand(n, keys)
    out = []
    for s in range(0, n, rows):
        part = mask[..., s : s + rows, :]
        scores = torch.tanh(torch.matmul(q[:, :, s : s + rows], k.transpose(-1, -2)) * scale / softcap) * softcap
        probs = torch.softmax(scores.masked_fill(~part, float("-inf")).float(), dim=-1).to(q.dtype)
        out.append(torch.matmul(probs, v))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def _decode(
    qkv: torch.Tensor,
    kv_cache: torch.Tensor,
    md: AttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    sliding: bool,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    d = qkv.shape[0]
    if md.decode_seq_lens is not None:
        return decode_attention(
            qkv,
            kv_cache,
            md.decode_blocks.view(d, -1),
            md.decode_seq_lens,
            num_heads,
            num_kv_heads,
            head_dim,
            scale,
            md.window if sliding else None,
            softcap=softcap,
        )
    group = num_heads // num_kv_heads
    kv = kv_cache.index_select(0, md.decode_blocks).to(qkv.dtype).view(d, md.decode_len, 2, num_kv_heads, head_dim)
    q = qkv[:, : num_heads * head_dim].view(d, num_kv_heads, group, head_dim)
    mask = md.decode_window_mask if sliding and md.decode_window_mask is not None else md.decode_mask
    if softcap is not None:
        o = _capped_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), mask, scale, softcap)
        return o.reshape(d, num_heads * head_dim)
    o = F.scaled_dot_product_attention(
        q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), attn_mask=mask, scale=scale
    )
    return o.view(d, num_heads * head_dim)
