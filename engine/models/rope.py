"""Rotary embeddings: the scaling types, the angle tables, and the q/k row order they assume.

At load the rows of each q and k head are permuted so that HF's rotate-half pairs
(i, i + d/2) become adjacent (2i, 2i+1); q.k is unchanged by a permutation applied to both,
and V is untouched, so the output is HF's while the rotation is one op (a C kernel on CPU,
a Triton kernel on CUDA, a complex multiply otherwise).
"""
from __future__ import annotations

import math
from typing import Any

import torch

_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(cfg: Any) -> dict:
    """Merge transformers 5's ``rope_parameters`` with the older ``rope_theta``/``rope_scaling``."""
    params = dict(getattr(cfg, "rope_scaling", None) or {})
    params.update(getattr(cfg, "rope_parameters", None) or {})
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] not in _ROPE_TYPES:
        raise ValueError(f"rope type {params['rope_type']!r} is not supported; supported: {', '.join(_ROPE_TYPES)}")
    return params


def rope_inv_freq(head_dim: int, params: dict) -> torch.Tensor:
    inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if params["rope_type"] == "linear":
        return inv_freq / params["factor"]
    if params["rope_type"] == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def pair_rotary_rows(w: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows from rotate-half order to adjacent (re, im) pairs."""
    half = head_dim // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return w.reshape(num_heads, head_dim, *w.shape[1:])[:, perm].reshape(w.shape)


class RopeTables:
    """Angles per position: ``cis`` complex ``[max_len, d/2]`` (torch forward), ``cos_sin`` its
    float32 ``[max_len, d/2, 2]`` view (the C and Triton kernels)."""

    def __init__(self, cfg: Any, head_dim: int, max_model_len: int, device: torch.device) -> None:
        inv_freq = rope_inv_freq(head_dim, rope_parameters(cfg))
        angles = torch.arange(max_model_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cis = torch.complex(angles.cos(), angles.sin()).to(device)
        self.cos_sin = torch.view_as_real(self.cis)
