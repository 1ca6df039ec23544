"""Architecture registry: the HF ``architectures`` name -> the ringllm model class.

One decoder (``llama.LlamaForCausalLM``) covers the whole family; the three
names differ only in config (Qwen2's qkv bias, Mistral's sliding window).
"""
from __future__ import annotations

from typing import Type

from engine.config import SUPPORTED_ARCHITECTURES
from engine.models.llama import LlamaForCausalLM

# The names live in config.py, which checks them without importing torch.
_REGISTRY: dict[str, Type[LlamaForCausalLM]] = {name: LlamaForCausalLM for name in SUPPORTED_ARCHITECTURES}


def get_model_class(architecture: str) -> Type[LlamaForCausalLM]:
    try:
        return _REGISTRY[architecture]
    except KeyError:
        raise ValueError(f"model architecture {architecture!r} is not supported; "
                         f"supported: {', '.join(_REGISTRY)}") from None
