"""OLMoE: Llama's decoder with sparse MLPs in every layer and q/k norms over whole projections.

- Each expert is ``intermediate_size`` wide; the router's top ``num_experts_per_tok`` of its
  softmax are renormalised only where ``norm_topk_prob`` says so (False for OLMoE-1B-7B).
- q and k are RMS-normalised over the whole projection (``hidden`` and ``kv heads x head_dim``
  weights), not per head as Qwen3 does (``Dims.qk_norm_whole``, engine/models/qk_norm.py).
- ``clip_qkv`` (clamping q, k and v) is not run: a config that sets it is refused by name.
- Checkpoint names: ``mlp.gate`` is the router, ``mlp.experts.<e>.{gate,up,down}_proj`` the experts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models.layers import Dims
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import MoeDims
from engine.models.qwen3_moe import EXPERT_PARTS
from engine.models.weights import LAYER_NAMES


class OlmoeForCausalLM(LlamaForCausalLM):
    LAYER_NAMES = {**LAYER_NAMES, "mlp.gate.weight": "router"}
    EXPERTS = ("mlp.experts.", EXPERT_PARTS)

    @classmethod
    def dims_from_config(cls, cfg: Any) -> Dims:
        if getattr(cfg, "clip_qkv", None) is not None:
            raise ValueError(f"model config: clip_qkv={cfg.clip_qkv!r} is not supported (only null)")
        moe = MoeDims.from_config(cfg, "intermediate_size", bool(getattr(cfg, "norm_topk_prob", False)))
        return replace(Dims.from_config(cfg), qk_norm=True, qk_norm_whole=True, moe=moe)
