"""Architecture registry: the HF ``architectures`` name -> the ringllm model class.

One decoder (``llama.LlamaForCausalLM``) covers the whole family; the three
names differ only in config (Qwen2's qkv bias, Mistral's sliding window).
The model module (and torch) is imported only when a class is asked for: the frontend
imports ``engine.models.default_model`` to find the default model and must not pay for torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Type

from engine.config import SUPPORTED_ARCHITECTURES  # checked there without importing torch

if TYPE_CHECKING:
    from engine.models.llama import LlamaForCausalLM


def get_model_class(architecture: str) -> Type["LlamaForCausalLM"]:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"model architecture {architecture!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    from engine.models.llama import LlamaForCausalLM

    return LlamaForCausalLM
