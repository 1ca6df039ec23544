"""Qwen3-MoE: Qwen3's decoder (per-head q/k norms) with sparse MLPs (engine/models/moe.py).

- Each expert is ``moe_intermediate_size`` wide; the router's top ``num_experts_per_tok`` of
  its softmax are renormalised only where ``norm_topk_prob`` says so.
- A layer is sparse unless listed in ``mlp_only_layers`` or off the ``decoder_sparse_step``
  (HF's rule: ``(i + 1) % step == 0``); a dense layer is Llama's MLP, ``intermediate_size`` wide.
- Checkpoint names: ``mlp.gate`` is the router, ``mlp.experts.<e>.{gate,up,down}_proj`` the experts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models.layers import Dims
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import MoeDims
from engine.models.weights import LAYER_NAMES

EXPERT_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    LAYER_NAMES = {**LAYER_NAMES, "mlp.gate.weight": "router"}
    EXPERTS = ("mlp.experts.", EXPERT_PARTS)

    @classmethod
    def dims_from_config(cls, cfg: Any) -> Dims:
        step, dense = getattr(cfg, "decoder_sparse_step", 1), getattr(cfg, "mlp_only_layers", None) or []
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
            raise ValueError(f"model config: decoder_sparse_step must be a positive integer, got {step!r}")
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(cfg.num_hidden_layers))
        moe = MoeDims.from_config(cfg, "moe_intermediate_size", bool(getattr(cfg, "norm_topk_prob", False)), sparse)
        return replace(Dims.from_config(cfg), qk_norm=True, moe=moe)
