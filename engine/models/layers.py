"""The decoder's parts: its dimensions, one layer's weights, the embedding.

A layer is a bundle of norm weights and ``Linear`` projections (engine/models/linear.py),
each holding the one method chosen for it at load; the forwards (cpu_forward.py,
triton_forward.py) read these bundles and nothing else of the model. q/k/v and gate/up are
fused into one projection each.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from engine.models.linear import Linear, LinearMethod
from engine.pooler_config import classifier_labels, is_classifier


def _num_labels(cfg: Any) -> int:
    """The classification head's rows for a *ForSequenceClassification config, else 0."""
    if not any(is_classifier(a) for a in getattr(cfg, "architectures", None) or []):
        return 0
    return len(classifier_labels(cfg))


@dataclass(frozen=True)
class Dims:
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab_size: int
    num_layers: int
    eps: float
    sliding_window: Optional[int]
    sliding_layers: tuple[bool, ...]
    qkv_bias: bool  # Qwen2 (or attention_bias)
    qk_norm: bool  # Qwen3's per-head q/k RMSNorm
    tied: bool
    num_labels: int = 0  # a *ForSequenceClassification model's ``score`` head (rows); 0: an LM head

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    @classmethod
    def from_config(cls, cfg: Any) -> "Dims":
        heads = cfg.num_attention_heads
        window = _sliding_window(cfg)
        layer_types = getattr(cfg, "layer_types", None) or []
        num_layers = cfg.num_hidden_layers
        return cls(hidden=cfg.hidden_size, num_heads=heads,
                   num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                   intermediate=cfg.intermediate_size, vocab_size=cfg.vocab_size, num_layers=num_layers,
                   eps=float(cfg.rms_norm_eps), sliding_window=window,
                   sliding_layers=tuple(window is not None and (not layer_types or layer_types[i] == "sliding_attention")
                                        for i in range(num_layers)),
                   qkv_bias=bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2",
                   qk_norm=cfg.model_type == "qwen3", tied=bool(getattr(cfg, "tie_word_embeddings", False)),
                   num_labels=_num_labels(cfg))


def _sliding_window(cfg: Any) -> Optional[int]:
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    if cfg.model_type in ("qwen2", "qwen3") and not getattr(cfg, "use_sliding_window", False):
        return None
    return int(window)


class DecoderLayer:
    """One layer's weights; the projections are set by the loader (None until then)."""

    __slots__ = ("input_norm", "qkv", "q_norm", "k_norm", "o_proj", "post_norm", "gate_up", "down", "sliding")

    def __init__(self, sliding: bool) -> None:
        self.input_norm: Optional[torch.Tensor] = None
        self.q_norm: Optional[torch.Tensor] = None
        self.k_norm: Optional[torch.Tensor] = None
        self.post_norm: Optional[torch.Tensor] = None
        self.qkv: Optional[Linear] = None
        self.o_proj: Optional[Linear] = None
        self.gate_up: Optional[Linear] = None
        self.down: Optional[Linear] = None
        self.sliding = sliding

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o_proj, self.gate_up, self.down]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.input_norm, self.q_norm, self.k_norm, self.post_norm) if t is not None]


class Embedding:
    """Token rows, read from a ``LinearMethod`` (the LM head's own when the two are tied)."""

    __slots__ = ("method", "dtype")

    def __init__(self, method: LinearMethod, dtype: torch.dtype) -> None:
        self.method, self.dtype = method, dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.method.rows(ids).to(self.dtype)
