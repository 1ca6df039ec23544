"""Build the model for an EngineConfig and fill its weights.

Three sources, chosen by ``model_config.load_format``:
- ``safetensors``: the ``*.safetensors`` files of an HF directory, streamed
  tensor by tensor (no full state dict in memory next to the model);
- ``gguf``: a ``.gguf`` file, dequantized by transformers (needs ``gguf`` and
  ``accelerate``; ~15 s for the default model, which is why default_model.py
  converts it once instead);
- ``dummy``: random weights from the config alone, for tests and overhead benchmarks.
"""
from __future__ import annotations

import glob
import logging
import os
import time
from typing import Iterator

import torch

from engine.config import EngineConfig
from engine.models import get_model_class
from engine.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)


def load_model(config: EngineConfig, kernels: str = "auto") -> LlamaForCausalLM:
    """``kernels``: see ``LlamaForCausalLM`` ("triton" lets a test run the CUDA forward on CPU)."""
    mc = config.model_config
    start = time.perf_counter()
    cls = get_model_class(mc.architecture)
    model = cls(mc.hf_config, getattr(torch, mc.dtype), torch.device(config.device), mc.max_model_len,
                kernels=kernels)
    if mc.load_format == "dummy":
        model.init_dummy(mc.seed or 0)
    elif mc.load_format == "gguf":
        model.load_weights(_gguf_weights(mc.model_path))
    elif mc.load_format == "safetensors":
        model.load_weights(_safetensors_weights(mc.model_path))
    else:
        raise ValueError(f"load_format {mc.load_format!r} is not supported by the loader")
    model.eval()
    logger.info("loaded %s (%s, %s) in %.1f s", mc.model, mc.load_format, mc.dtype, time.perf_counter() - start)
    return model


def _safetensors_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"model: no *.safetensors weights in {path!r} "
                         "(use load_format='dummy' for random weights)")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _gguf_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    if not os.path.isfile(path):
        raise ValueError(f"model: GGUF file {path!r} does not exist")
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path),
                                              dtype=torch.float32)
    yield from hf.state_dict().items()
