"""Mixtral: Llama's (Mistral's) decoder with sparse MLPs in every layer (engine/models/moe.py).

- Each expert is ``intermediate_size`` wide; the router's top ``num_experts_per_tok`` (2) of
  its softmax are always renormalised (HF's ``MixtralTopKRouter``; a GGUF may say otherwise
  through ``norm_topk_prob``, which engine/gguf_file.py sets from ``expert_weights_norm``).
- A sliding window, where the config has one, applies to every layer (Dims.from_config).
- Checkpoint names: ``block_sparse_moe.gate`` is the router, ``block_sparse_moe.experts.<e>.w1``
  / ``w3`` / ``w2`` each expert's gate, up and down.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models.layers import Dims
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import MoeDims
from engine.models.weights import LAYER_NAMES


class MixtralForCausalLM(LlamaForCausalLM):
    LAYER_NAMES = {**LAYER_NAMES, "block_sparse_moe.gate.weight": "router"}
    EXPERTS = ("block_sparse_moe.experts.", {"w1": "gate", "w3": "up", "w2": "down"})

    @classmethod
    def dims_from_config(cls, cfg: Any) -> Dims:
        moe = MoeDims.from_config(cfg, "intermediate_size", bool(getattr(cfg, "norm_topk_prob", True)))
        return replace(Dims.from_config(cfg), moe=moe)
