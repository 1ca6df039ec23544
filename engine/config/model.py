"""``ModelConfig``: the model as both processes run it, resolved from the arguments and the model's
own files (engine/config/model_discovery.py) once, in the frontend."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from engine.config.checks import bad_value, positive_int
from engine.config.cpu_probe import int8_kernel_built
from engine.config.device_config import resolve_dtype
from engine.config.model_discovery import DEFAULT_MODEL, architecture, load_hf_config, resolve_model, tokenizer_for
from engine.pooler_config import PoolerConfig, classifier_labels, is_classifier, resolve_runner

if TYPE_CHECKING:
    from engine.config.args import EngineArgs

QUANTIZATIONS = (None, "gguf", "int8")


@dataclass(frozen=True)
class ModelConfig:
    model: str  # what the user asked for (name or path)
    model_path: str  # resolved local HF directory or .gguf file
    tokenizer: str  # local directory (or .gguf file) holding the tokenizer
    load_format: str  # resolved: safetensors | gguf | dummy
    hf_config: Any  # engine.hf_config.HFConfig, or a transformers PretrainedConfig for other models
    architecture: str
    dtype: str  # resolved: float32 | bfloat16 | float16
    max_model_len: int
    vocab_size: int
    seed: Optional[int]
    max_logprobs: int
    max_prompt_logprobs_entries: int
    served_model_name: str
    skip_tokenizer_init: bool
    runner_type: str = "generate"  # resolved: generate | pooling
    convert_type: str = "none"  # resolved: none | embed
    pooler_config: Optional[PoolerConfig] = None  # resolved (pooling_type, normalize) with runner "pooling"
    quantization: Optional[str] = None  # resolved: None | "gguf" (a .gguf model's own blocks) | "int8" (W8A8)
    deterministic: bool = False  # batch-invariant kernels (EngineArgs.deterministic)
    hf_overrides: Optional[dict] = None  # as given; already applied to hf_config

    @property
    def pooling_task(self) -> Optional[str]:
        """What the pooler computes: "classify" for a *ForSequenceClassification model, "embed"
        for a decoder served with runner "pooling", None for a generating model."""
        if self.runner_type != "pooling":
            return None
        return "classify" if is_classifier(self.architecture) else "embed"

    @property
    def classifier_labels(self) -> Optional[list[str]]:
        """A classification model's labels in class order (``id2label``); None for other models."""
        return classifier_labels(self.hf_config) if self.pooling_task == "classify" else None

    @property
    def gguf_file(self) -> Optional[str]:
        return self.model_path if self.load_format == "gguf" else None


def create_model_config(args: EngineArgs, device: str) -> ModelConfig:
    """The model's files found and read, its architecture, runner, dtype, context length and
    quantization resolved for ``device``; ValueError naming the field or file at fault."""
    path, load_format = resolve_model(args)
    hf_config = load_hf_config(path, load_format, args.trust_remote_code, args.hf_overrides)
    arch = architecture(hf_config, path, load_format)
    runner, convert, pooler = resolve_runner(args.runner, args.convert, args.pooler_config, arch)
    if is_classifier(arch):
        classifier_labels(hf_config)  # a bad id2label is refused at start, not at the first request
    if args.deterministic and device != "cpu":
        raise ValueError(f"deterministic: batch-invariant kernels exist for the CPU only, not for device {device!r}")
    max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
    max_model_len = (
        max_pos if args.max_model_len is None else positive_int("max_model_len", args.max_model_len, 1, max_pos)
    )
    return ModelConfig(
        model=args.model or DEFAULT_MODEL,
        model_path=path,
        tokenizer=os.path.expanduser(args.tokenizer) if args.tokenizer else tokenizer_for(path),
        load_format=load_format,
        hf_config=hf_config,
        architecture=arch,
        dtype=resolve_dtype(args.dtype, device, hf_config),
        max_model_len=max_model_len,
        vocab_size=int(hf_config.vocab_size),
        seed=args.seed,
        max_logprobs=args.max_logprobs,
        max_prompt_logprobs_entries=args.max_prompt_logprobs_entries,
        served_model_name=args.served_model_name or args.model or DEFAULT_MODEL,
        skip_tokenizer_init=args.skip_tokenizer_init,
        runner_type=runner,
        convert_type=convert,
        pooler_config=pooler,
        quantization=_resolve_quantization(args, load_format, device),
        deterministic=bool(args.deterministic),
        hf_overrides=args.hf_overrides,
    )


def check_quantization_name(value: Any) -> None:
    """vLLM's ``quantization`` keyword, at the values ringllm runs (checked before any launch)."""
    if value not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={value!r} is not supported; supported: None (weights in the "
            "model's dtype), 'gguf' (a .gguf model's own blocks, its default), 'int8' (dynamic W8A8 "
            "from a float checkpoint)"
        )


def _resolve_quantization(args: EngineArgs, load_format: str, device: str) -> Optional[str]:
    """A .gguf model runs its own blocks ("gguf", vLLM's name, the default there); "int8"
    quantizes a float checkpoint's projections at load (CPU, when the kernel is built)."""
    q = args.quantization
    if load_format == "gguf":
        if q not in (None, "gguf"):
            raise bad_value("quantization", "None or 'gguf' for a .gguf model", q)
        return "gguf"
    if q == "gguf":
        raise ValueError(
            f"quantization='gguf' runs the quantized blocks of a .gguf file, but model "
            f"{args.model!r} is a directory of float weights: pass a .gguf file as model, "
            "or leave quantization unset (or 'int8' to quantize these weights at load)"
        )
    if q == "int8":
        if device != "cpu":
            raise ValueError(
                f"quantization='int8' runs only on the CPU (its W8A8 kernels are C), but "
                f"device is {device!r}: use device='cpu' or leave quantization unset"
            )
        if not int8_kernel_built():
            raise ValueError(
                "quantization='int8' is not supported here: the W8A8 kernels "
                "(engine/kernels/int8_linear.py) are not built (run scripts/setup.sh)"
            )
    return q
