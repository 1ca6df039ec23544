"""Per-head RMSNorm of the query and key columns of a fused qkv row (Qwen3's q_norm/k_norm).

Qwen3 normalises each head's q and k over ``head_dim`` after the projection and before RoPE.
It is its own function because the forwards (cpu_forward.py and triton_forward.py)
run it on the same fused layout: q heads, then k heads, then v, one row per token. The
norm weights arrive permuted like the q/k rows (adjacent rotary pairs, see rope.py), and
RMSNorm's statistic does not depend on the order of a head's elements, so the result is
HF's, permuted. OLMoE normalises the whole q and the whole k projection instead (``whole``),
its weights permuted like the rows they scale: the same holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def qk_rms_norm_(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    whole: bool = False,
) -> torch.Tensor:
    """Normalise ``qkv``'s q and k heads (``whole``: all of q, all of k) in place (in float32,
    rounded once, as HF does)."""
    n, q_size = qkv.shape[0], num_heads * head_dim
    for start, heads, weight in ((0, num_heads, q_norm), (q_size, num_kv_heads, k_norm)):
        width = heads * head_dim if whole else head_dim
        part = qkv[:, start : start + heads * head_dim].view(n, -1, width)
        part.copy_(F.rms_norm(part.float(), (width,), weight.float(), eps))
    return qkv
