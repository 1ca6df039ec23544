"""The model registry: an HF ``architectures`` name -> the module and class that run it.

A family is one module here that says only what differs from Llama's decoder (llama.py):
Qwen2, Qwen3 and Mistral differ in config alone and run ``LlamaForCausalLM`` itself; Gemma 2/3
(gemma.py), Phi-3 / Phi-4-mini (phi3.py) and the sparse families Qwen3-MoE (qwen3_moe.py),
Mixtral (mixtral.py) and OLMoE (olmoe.py), whose experts run in moe.py, subclass it. Adding a
family is a recipe in docs/ARCHITECTURE.md. The *ForSequenceClassification names run their
family's class with a ``score`` head in place of the LM head (``Dims.num_labels``), served by the
pooling runner. This module imports nothing (config.py checks a model's architecture against it
in the frontend, which must not pay for torch): the family's module is imported only when its
class is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Type

if TYPE_CHECKING:
    from engine.models.llama import LlamaForCausalLM

_REGISTRY = {  # architecture -> (module under engine/models/, class)
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Gemma2ForCausalLM": ("gemma", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "OlmoeForCausalLM": ("olmoe", "OlmoeForCausalLM"),
    # Classification models (pooler_config.is_classifier): the same decoder with a ``score`` head
    # in place of the LM head (Dims.num_labels); they serve runner "pooling", task "classify".
    "LlamaForSequenceClassification": ("llama", "LlamaForCausalLM"),
    "Qwen2ForSequenceClassification": ("llama", "LlamaForCausalLM"),
    "Qwen3ForSequenceClassification": ("llama", "LlamaForCausalLM"),
}
SUPPORTED_ARCHITECTURES = tuple(_REGISTRY)


def get_model_class(architecture: str) -> Type["LlamaForCausalLM"]:
    if architecture not in _REGISTRY:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    module, name = _REGISTRY[architecture]
    return getattr(importlib.import_module(f"engine.models.{module}"), name)
