"""Phi-3 and Phi-4-mini: Llama's decoder with what this family changes.

- The checkpoint ships q/k/v and gate/up already fused (``qkv_proj``, ``gate_up_proj``, gate
  first): taken as they are, their q and k rows reordered for rotary pairs (weights.py).
- ``longrope`` scaling (the config's ``su``; short and long factors, an attention factor) and
  Phi-4-mini's ``partial_rotary_factor`` are rope.py's; a sliding window, where the config has
  one, applies to every layer (Dims.from_config).
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM
from engine.models.weights import LAYER_NAMES


class Phi3ForCausalLM(LlamaForCausalLM):
    LAYER_NAMES = {**LAYER_NAMES, "self_attn.qkv_proj.weight": "qkv", "mlp.gate_up_proj.weight": "gate_up"}
