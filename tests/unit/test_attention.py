"""Prefill attention (engine/models/attention.py) against float64 causal attention, at prompt
lengths below and above the point where a chunk attends in causal slices."""

from __future__ import annotations

import pytest
import torch

from engine.models.attention import AttentionMetadata, PrefillChunk, causal_slice_rows, paged_attention


def _reference(qkv: torch.Tensor, heads: int, kv_heads: int, d: int, scale: float) -> torch.Tensor:
    n = qkv.shape[0]
    x = qkv.double()
    q = x[:, : heads * d].view(n, heads, d).transpose(0, 1)
    k = x[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d).transpose(0, 1)
    v = x[:, (heads + kv_heads) * d :].view(n, kv_heads, d).transpose(0, 1)
    k, v = (t.repeat_interleave(heads // kv_heads, 0) for t in (k, v))
    scores = (q @ k.transpose(1, 2)) * scale
    scores.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * d)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("n", [200, 257, 600, 1100])
def test_prefill_matches_causal_attention_whole_or_in_slices(n, dtype, tol):
    heads, kv_heads, d, block = 6, 2, 32, 16
    gen = torch.Generator().manual_seed(n)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    cache = torch.zeros(-(-n // block) + 1, block, 2 * kv_heads * d, dtype=dtype)
    md = AttentionMetadata(slot_mapping=torch.arange(n) + block, prefills=[PrefillChunk(0, n)])  # block 0 unused
    got = paged_attention(qkv, cache, md, heads, kv_heads, d, d**-0.5, sliding=False)
    assert (n > 2 * causal_slice_rows(n)) == (n >= 257)  # both paths are covered
    torch.testing.assert_close(got.double(), _reference(qkv, heads, kv_heads, d, d**-0.5), rtol=tol, atol=tol)
    assert torch.equal(cache.view(-1, 2 * kv_heads * d)[block : block + n], qkv[:, heads * d :])
