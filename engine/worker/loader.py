"""Build the model for an EngineConfig and fill its weights.

Three sources, chosen by ``model_config.load_format``:
- ``safetensors``: the ``*.safetensors`` files of an HF directory, streamed
  tensor by tensor (no full state dict in memory next to the model);
- ``gguf``: a ``.gguf`` file read with the ``gguf`` package (engine/worker/gguf_weights.py):
  quantized tensors stay the file's own blocks and run on them (``quantization="gguf"``);
- ``dummy``: random weights from the config alone, for tests and overhead benchmarks.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from typing import TYPE_CHECKING, Iterator

import torch

from engine.hf_config import ModelConfigError
from engine.models import get_model_class
from engine.models.llama import LlamaForCausalLM
from engine.worker.gguf_weights import gguf_weights

if TYPE_CHECKING:
    from engine.config import EngineConfig  # annotations only: the config does not import the worker back

logger = logging.getLogger(__name__)


def load_model(config: EngineConfig, backend: str = "auto") -> LlamaForCausalLM:
    """``backend``: see ``LlamaForCausalLM`` ("triton" lets a test run the CUDA forward on CPU)."""
    mc = config.model_config
    start = time.perf_counter()
    cls = get_model_class(mc.architecture)
    model = cls(
        mc.hf_config,
        getattr(torch, mc.dtype),
        torch.device(config.device),
        mc.max_model_len,
        backend=backend,
        quantization=mc.quantization,
        compiled=config.compilation_config.mode >= 1,
        deterministic=mc.deterministic,
    )
    if mc.load_format == "dummy":
        model.init_dummy(mc.seed or 0)
    elif mc.load_format == "gguf":
        model.load_weights(gguf_weights(mc.model_path, model.dims.num_heads, model.dims.num_kv_heads))
    elif mc.load_format == "safetensors":
        _load_safetensors(model, mc.model_path)
    else:
        raise ValueError(f"load_format {mc.load_format!r} is not supported by the loader")
    logger.info(
        "loaded %s (%s, %s) in %.1f s; %s",
        mc.model,
        mc.load_format,
        mc.dtype,
        time.perf_counter() - start,
        model.weights_report(),
    )
    return model


class _Reading:
    """Which file and tensor the loader is at, so a fault is reported with them."""

    file = name = shape = None


def _load_safetensors(model: LlamaForCausalLM, path: str) -> None:
    """``path``'s weights into ``model``; a file that is not safetensors, a tensor whose shape
    does not fit the config, or a tensor the config needs and no file has is a ModelConfigError
    naming the file and the problem in one line."""
    at = _Reading()
    try:
        model.load_weights(_safetensors_weights(path, at))
    except ModelConfigError:
        raise
    except RuntimeError as e:  # a copy into a parameter of another shape
        raise ModelConfigError(
            f"model: {at.file}: tensor {at.name!r} has shape {list(at.shape)}, which does not "
            f"fit the model config.json describes ({str(e).splitlines()[0]})"
        ) from None
    except ValueError as e:  # the model's own check: tensors missing or left over
        files = ", ".join(os.path.basename(f) for f in _weight_files(path))
        raise ModelConfigError(
            f"model: the weights in {os.path.join(path, files)} do not match config.json: {e}"
        ) from None


def _weight_files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def _safetensors_weights(path: str, at: _Reading) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    files = _weight_files(path)
    if not files:
        raise ModelConfigError(
            f"model: no *.safetensors weights in {path!r} (use load_format='dummy' for random weights)"
        )
    for file in files:
        at.file, at.name, at.shape = file, None, None
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    at.name, at.shape = name, f.get_slice(name).get_shape()
                    tensor = f.get_tensor(name)
                    yield name, tensor
        except SafetensorError as e:
            raise ModelConfigError(f"model: {file} is not a valid safetensors file ({e})") from None
