"""Gemma 2 and Gemma 3 (text): Llama's decoder with what these families change.

- RMSNorm weights are offsets, applied as ``(1 + w)`` in float32: folded into the weight once
  at load (``_put``), so every forward's norm (C kernel, torch) runs them unchanged. A GGUF
  file stores them with the 1 already added (llama.cpp's converter); gguf_weights.py takes it
  off, so both sources arrive here as HF's values.
- Four norms a layer: HF's ``post_attention_layernorm`` is the attention output's norm (Llama's
  name for the pre-MLP norm, which Gemma calls ``pre_feedforward_layernorm``), and
  ``post_feedforward_layernorm`` the MLP output's (``Dims.sandwich_norms``).
- Embeddings times sqrt(hidden), rounded to the model's dtype (``Dims.embed_scale``); a
  gelu-tanh gated MLP; scores scaled by ``query_pre_attn_scalar ** -0.5``, not head_dim's.
- Gemma 2 soft-caps attention scores and the final logits (``cap * tanh(x / cap)``).
- Sliding-window and global layers interleave (the config's ``layer_types``, Dims.from_config).
- Gemma 3 rotates sliding layers with their own rope base (``rope_local_base_freq``, HF's
  ``rope_parameters["sliding_attention"]``) and global ones with theirs (and their scaling),
  and normalises q and k per head (qk_norm.py, weights offset like the others).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import torch

from engine.models.layers import Dims
from engine.models.llama import LlamaForCausalLM
from engine.models.rope import RopeTables
from engine.models.weights import LAYER_NAMES, Weight

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
_NORMS = ("norm", "input_norm", "attn_out_norm", "post_norm", "mlp_out_norm", "q_norm", "k_norm")


def _positive(cfg: Any, field: str, required: bool = False) -> Optional[float]:
    """A scale or soft-cap the config sets: a positive number (None: the field is off)."""
    value = getattr(cfg, field, None)
    if (value is not None or required) and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
    ):
        raise ValueError(f"model config: {field} must be a positive number, got {value!r}")
    return value


class Gemma2ForCausalLM(LlamaForCausalLM):
    LAYER_NAMES = {
        **LAYER_NAMES,
        "post_attention_layernorm.weight": "attn_out_norm",
        "pre_feedforward_layernorm.weight": "post_norm",
        "post_feedforward_layernorm.weight": "mlp_out_norm",
    }

    @classmethod
    def dims_from_config(cls, cfg: Any) -> Dims:
        act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)
        if act not in _ACTIVATIONS:
            raise ValueError(
                f"hidden_activation {act!r} is not supported for {cfg.model_type}; supported: {', '.join(_ACTIVATIONS)}"
            )
        scalar = _positive(cfg, "query_pre_attn_scalar", required=True)
        return replace(
            Dims.from_config(cfg),
            scale=float(scalar) ** -0.5,
            act=_ACTIVATIONS[act],
            sandwich_norms=True,
            embed_scale=cfg.hidden_size**0.5,
            attn_softcap=_positive(cfg, "attn_logit_softcapping"),
            final_softcap=_positive(cfg, "final_logit_softcapping"),
            qk_norm=cls is Gemma3ForCausalLM,
        )

    def _put(self, target: str, layer: Optional[int], value: Weight) -> None:
        if target in _NORMS:
            value = value.float() + 1.0  # HF's (1 + w), in float32 as HF computes it
        super()._put(target, layer, value)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    @classmethod
    def rope_tables(
        cls, cfg: Any, dims: Dims, max_model_len: int, device: torch.device
    ) -> tuple[list[RopeTables], list[int]]:
        """A global table and a local one; each layer takes its type's."""
        kinds = ("full_attention", "sliding_attention")
        tables = [RopeTables(cfg, dims.head_dim, max_model_len, device, layer_type=k) for k in kinds]
        return tables, [int(kind == "sliding_attention") for kind in cfg.layer_types]
