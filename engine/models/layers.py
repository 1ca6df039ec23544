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
from engine.models.moe import MoeDims, SparseMoE
from engine.models.rope import rope_parameters, rotary_dim
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
    qk_norm: bool  # Qwen3's (and Gemma 3's) per-head q/k RMSNorm
    tied: bool
    num_labels: int = 0  # a *ForSequenceClassification model's ``score`` head (rows); 0: an LM head
    # What other families change (engine/models/gemma.py, phi3.py); Llama's values by default:
    scale: float = 0.0  # attention's score scale; 0: head_dim ** -0.5
    rotary_dim: int = 0  # leading dims of each head that rotate (Phi-4-mini: 3/4); 0: all
    act: str = "silu"  # the MLP's gate activation: "silu" or "gelu_tanh"
    sandwich_norms: bool = False  # Gemma: RMSNorms on the attention and MLP outputs too
    attn_softcap: Optional[float] = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_softcap: Optional[float] = None  # Gemma 2: the same on the logits
    embed_scale: Optional[float] = None  # Gemma: embeddings times sqrt(hidden)
    qk_norm_whole: bool = False  # OLMoE: q and k normalised over the whole projection, not per head
    moe: Optional[MoeDims] = None  # Qwen3-MoE, Mixtral, OLMoE: sparse MLPs (engine/models/moe.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", self.scale or self.head_dim**-0.5)
        object.__setattr__(self, "rotary_dim", self.rotary_dim or self.head_dim)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def llama_only(self) -> bool:
        """Whether the model needs nothing beyond Llama's layer (the Triton and compiled forwards
        implement only that; the torch and C-kernel forwards implement every field above)."""
        return (
            self.act == "silu"
            and not self.sandwich_norms
            and self.attn_softcap is None
            and self.embed_scale is None
            and not self.qk_norm_whole
            and self.moe is None
        )

    @classmethod
    def from_config(cls, cfg: Any) -> "Dims":
        heads = cfg.num_attention_heads
        window = _sliding_window(cfg)
        layer_types = getattr(cfg, "layer_types", None) or []
        num_layers = cfg.num_hidden_layers
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(
            hidden=cfg.hidden_size,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate=cfg.intermediate_size,
            vocab_size=cfg.vocab_size,
            num_layers=num_layers,
            eps=float(cfg.rms_norm_eps),
            sliding_window=window,
            sliding_layers=tuple(
                window is not None and (not layer_types or layer_types[i] == "sliding_attention")
                for i in range(num_layers)
            ),
            qkv_bias=bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2",
            qk_norm=cfg.model_type == "qwen3",
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
            rotary_dim=rotary_dim(head_dim, rope_parameters(cfg)),  # Gemma 3's per-type dicts: whole heads
            num_labels=_num_labels(cfg),
        )


def _sliding_window(cfg: Any) -> Optional[int]:
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    if cfg.model_type in ("qwen2", "qwen3") and not getattr(cfg, "use_sliding_window", False):
        return None
    return int(window)


class DecoderLayer:
    """One layer's weights; the projections are set by the loader (None until then)."""

    __slots__ = (
        "input_norm",
        "qkv",
        "q_norm",
        "k_norm",
        "o_proj",
        "attn_out_norm",
        "post_norm",
        "gate_up",
        "down",
        "mlp_out_norm",
        "sliding",
        "rope",
        "moe",
    )

    def __init__(self, sliding: bool, rope: int = 0, moe: Optional[MoeDims] = None) -> None:
        self.input_norm: Optional[torch.Tensor] = None
        self.q_norm: Optional[torch.Tensor] = None
        self.k_norm: Optional[torch.Tensor] = None
        self.post_norm: Optional[torch.Tensor] = None  # before the MLP
        self.attn_out_norm: Optional[torch.Tensor] = None  # Gemma's norms of the attention and MLP outputs
        self.mlp_out_norm: Optional[torch.Tensor] = None
        self.qkv: Optional[Linear] = None
        self.o_proj: Optional[Linear] = None
        self.gate_up: Optional[Linear] = None
        self.down: Optional[Linear] = None
        self.sliding = sliding
        self.rope = rope  # which of the model's rope tables (Gemma 3: local for sliding layers)
        self.moe = SparseMoE(moe) if moe is not None else None  # a sparse layer's router and experts, no gate_up/down

    def linears(self) -> list[Linear]:
        mlp = self.moe.linears() if self.moe is not None else [self.gate_up, self.down]
        return [self.qkv, self.o_proj, *mlp]

    def tensors(self) -> list[torch.Tensor]:
        return [
            t
            for t in (self.input_norm, self.q_norm, self.k_norm, self.attn_out_norm, self.post_norm, self.mlp_out_norm)
            if t is not None
        ]


class Embedding:
    """Token rows, read from a ``LinearMethod`` (the LM head's own when the two are tied), times
    ``scale`` where the family scales them (Gemma: sqrt(hidden), rounded to the model dtype as HF does)."""

    __slots__ = ("method", "dtype", "scale")

    def __init__(self, method: LinearMethod, dtype: torch.dtype, scale: Optional[torch.Tensor] = None) -> None:
        self.method, self.dtype, self.scale = method, dtype, scale

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.method.rows(ids).to(self.dtype)
        return rows if self.scale is None else rows * self.scale
