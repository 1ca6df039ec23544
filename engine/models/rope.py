"""Rotary embeddings: the scaling types, the angle tables, and the q/k row order they assume.

At load the rows of each q and k head are permuted so that HF's rotate-half pairs
(i, i + r/2) of its ``r`` rotary dims become adjacent (2i, 2i+1); q.k is unchanged by a
permutation applied to both, and V is untouched, so the output is HF's while the rotation is
one op (a C kernel on CPU, a Triton kernel on CUDA, a complex multiply otherwise). A head
that rotates only its first ``r`` dims (Phi-4-mini's partial rotary factor) gets angle 0 for
the rest, so every kernel still rotates whole heads and the tail passes through unchanged.

Scaling types: ``default``, ``linear``, ``llama3``, ``yarn`` (its attention factor scales
cos and sin, as HF does) and ``longrope`` (Phi-3's ``su``): short factors for positions below
``original_max_position_embeddings``, long factors from there on, both with the attention
factor. HF switches a whole sequence to the long factors once it is longer than that; with a
paged cache, keys already cached keep their rotation, so the choice here is per position, as
HF's own token-by-token decode makes it (vLLM switches a whole batch). ``dynamic`` (NTK) changes
every cached key's rotation as a sequence grows, which a paged cache cannot follow: refused.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_parameters(cfg: Any, layer_type: Optional[str] = None) -> dict:
    """Merge transformers 5's ``rope_parameters`` with the older ``rope_theta``/``rope_scaling``;
    ``layer_type``: Gemma 3's per-layer-type parameters (``rope_parameters[layer_type]``)."""
    params = dict(getattr(cfg, "rope_scaling", None) or {})
    params.update(getattr(cfg, "rope_parameters", None) or {})
    if layer_type is not None:
        params = dict(params.get(layer_type) or {})
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] == "su":  # Phi-3's first name for longrope
        params["rope_type"] = "longrope"
    if params["rope_type"] not in _ROPE_TYPES:
        raise ValueError(f"rope type {params['rope_type']!r} is not supported; supported: {', '.join(_ROPE_TYPES)}")
    for key in ("original_max_position_embeddings", "partial_rotary_factor"):
        if params.get(key) is None and getattr(cfg, key, None) is not None:
            params[key] = getattr(cfg, key)
    return params


def rotary_dim(head_dim: int, params: dict) -> int:
    return int(head_dim * (params.get("partial_rotary_factor") or 1.0))


def rope_inv_freq(dim: int, params: dict, factors: Optional[list] = None) -> torch.Tensor:
    """Inverse frequencies of ``dim`` rotary dims; ``factors``: longrope's per-frequency divisors."""
    powers = params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    kind = params["rope_type"]
    if kind == "longrope":  # HF's order of operations, so the angles are its own to the bit
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * powers)
    inv_freq = 1.0 / powers
    if kind == "linear":
        return inv_freq / params["factor"]
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, dim, params)
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def _yarn_inv_freq(inv_freq: torch.Tensor, dim: int, params: dict) -> torch.Tensor:
    """YaRN: interpolated (divided by ``factor``) at low frequencies, kept at high ones, a linear
    ramp between the correction dims of ``beta_fast``/``beta_slow`` rotations (HF's formula)."""
    base, factor, old_len = params["rope_theta"], params["factor"], params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def attention_factor(params: dict, max_position_embeddings: int) -> float:
    """What yarn and longrope multiply cos and sin by (1 for the other types)."""
    if params["rope_type"] not in ("yarn", "longrope"):
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    old_len = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / old_len
    if factor <= 1:
        return 1.0
    if params["rope_type"] == "longrope":
        return math.sqrt(1 + math.log(factor) / math.log(old_len))
    mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all:
        return (0.1 * mscale * math.log(factor) + 1) / (0.1 * mscale_all * math.log(factor) + 1)
    return 0.1 * math.log(factor) + 1


def pair_rotary_rows(w: torch.Tensor, num_heads: int, head_dim: int, rotary: int = 0) -> torch.Tensor:
    """Reorder each head's rows from rotate-half order (over its first ``rotary`` rows, all by
    default) to adjacent (re, im) pairs; the rows past ``rotary`` keep their order."""
    half = (rotary or head_dim) // 2
    perm = torch.cat(
        [
            torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten(),
            torch.arange(2 * half, head_dim),
        ]
    )
    return w.reshape(num_heads, head_dim, *w.shape[1:])[:, perm].reshape(w.shape)


class RopeTables:
    """Angles per position: ``cis`` complex ``[max_len, d/2]`` (torch forward), ``cos_sin`` its
    float32 ``[max_len, d/2, 2]`` view (the C and Triton kernels). ``layer_type``: see
    ``rope_parameters``."""

    def __init__(
        self, cfg: Any, head_dim: int, max_model_len: int, device: torch.device, layer_type: Optional[str] = None
    ) -> None:
        params = rope_parameters(cfg, layer_type)
        dim = rotary_dim(head_dim, params)
        positions = torch.arange(max_model_len, dtype=torch.float32)[:, None]
        if params["rope_type"] == "longrope":
            old_len = params["original_max_position_embeddings"]
            short = rope_inv_freq(dim, params, params["short_factor"])
            long = rope_inv_freq(dim, params, params["long_factor"])
            angles = positions * torch.where(positions < old_len, short[None, :], long[None, :])
        else:
            angles = positions * rope_inv_freq(dim, params)[None, :]
        magnitude = attention_factor(params, getattr(cfg, "max_position_embeddings", max_model_len))
        cis = torch.complex(angles.cos() * magnitude, angles.sin() * magnitude)
        tail = torch.ones(max_model_len, (head_dim - dim) // 2, dtype=cis.dtype)  # the dims that do not rotate
        self.cis = torch.cat([cis, tail], dim=1).to(device)
        self.cos_sin = torch.view_as_real(self.cis)
