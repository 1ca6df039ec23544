"""Where a model's files are and what they hold, found without the network and without torch:
the local path and load format (``resolve_model``), its HF config (``load_hf_config``), the
architecture ringllm runs it as (``architecture``) and where its tokenizer is (``tokenizer_for``).

The embedded default model runs from its own Q4_1 GGUF or from a converted float directory,
chosen by the host's CPU (``default_runs_its_gguf``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

import engine.config.cpu_probe as cpu_probe
import engine.config.device_config as device_config
from engine.config.checks import bad_value
from engine.config.compilation import resolve_compilation_config
from engine.gguf_file import config_dict
from engine.hf_config import check_config_values, config_from_dict, read_hf_config
from engine.models import SUPPORTED_ARCHITECTURES  # the registry's names (it imports nothing)
from engine.models.default_model import GGUF_NAME, default_gguf_path, default_model_path, default_tokenizer_path

if TYPE_CHECKING:
    from engine.config.args import EngineArgs

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def resolve_model(args: EngineArgs) -> tuple[str, str]:
    """Return (local path, load format); never touches the network."""
    model = args.model
    if model in (None, "", DEFAULT_MODEL):
        if not default_runs_its_gguf(args):
            return default_model_path(), ("dummy" if args.load_format == "dummy" else "safetensors")
        model = default_gguf_path()  # checked below as any .gguf model
    path = os.path.expanduser(model)
    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise ValueError(f"model: GGUF file {path!r} does not exist")
        if args.load_format not in ("auto", "gguf"):
            raise bad_value("load_format", "'auto' or 'gguf' for a .gguf model", args.load_format)
        return path, "gguf"
    if not os.path.isdir(path):
        raise ValueError(
            f"model: {model!r} is not a local directory or .gguf file (ringllm never downloads from a model hub)"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model: directory {path!r} has no config.json")
    fmt = "safetensors" if args.load_format == "auto" else args.load_format
    if fmt == "gguf":
        raise bad_value("load_format", "'auto', 'safetensors' or 'dummy' for an HF directory", fmt)
    return path, fmt


def default_runs_its_gguf(args: EngineArgs) -> bool:
    """Whether the default model runs from its own Q4_1 GGUF (quantization "gguf") instead of the
    converted float directory: always when quantization or load_format "gguf" is asked for (only
    the file has GGUF blocks); otherwise when no dtype, quantization, load format, runner or
    compiled forward is asked for, on the CPU kind where Q4_1 served a batch of 64 faster than
    bf16. That is the Zen4 kind (AVX-512 VNNI and BF16, no AMX): benchmarks/RESULTS.md, "Against
    vLLM compiled and llama.cpp (Zen4)" (offline 64 x 128, the same run) and "Quantized kernels,
    per call (Zen4)" (the int8 GEMM against oneDNN's bf16 GEMM per projection shape). Kinds not
    measured that way (AVX2 only; AMX, where oneDNN's bf16 GEMMs run on AMX tiles) keep the float
    directory."""
    if "gguf" in (args.quantization, args.load_format):
        return True
    if (
        args.dtype != "auto"
        or args.quantization is not None
        or args.load_format != "auto"
        or args.runner not in ("auto", "generate")
        or args.convert not in ("auto", "none")
        or args.pooler_config is not None
        or resolve_compilation_config(args.compilation_config, args.enforce_eager).mode != 0
        or device_config.resolve_device(args.device) != "cpu"
        or not cpu_probe.cpu_kernels_built()
    ):
        return False
    flags = cpu_probe.cpu_flags()
    return {"avx512_vnni", "avx512_bf16"} <= flags and "amx_tile" not in flags


def tokenizer_for(path: str) -> str:
    """Where a model's tokenizer is read: its own directory or file, except the embedded
    default model's GGUF, whose tokenizer is already converted (reading it from the GGUF
    takes transformers ~10 s in each process)."""
    if (
        path.endswith(".gguf")
        and os.path.basename(path) == GGUF_NAME
        and os.path.realpath(path) == os.path.realpath(default_gguf_path())
    ):
        return default_tokenizer_path()
    return path


def config_file(path: str, load_format: str) -> str:
    """The file a model's config comes from, for error messages."""
    return path if load_format == "gguf" else os.path.join(path, "config.json")


def load_hf_config(path: str, load_format: str, trust_remote_code: bool, overrides: Optional[dict]) -> Any:
    """The model's config with ``hf_overrides`` applied: read as JSON (or from a GGUF's
    metadata) for the model types ringllm runs (engine/hf_config.py: no transformers, no
    torch), through ``AutoConfig`` otherwise."""
    if load_format == "gguf":
        data = config_dict(path)  # its metadata, as config.json's fields
        cfg = None if data is None else config_from_dict(data, path) or _transformers_config(data, path)
    else:
        cfg = read_hf_config(path)
    if cfg is None:
        cfg = _auto_config(path, load_format, trust_remote_code)
    for key, value in (overrides or {}).items():
        setattr(cfg, key, value)
    return cfg


def architecture(hf_config: Any, path: str, load_format: str) -> str:
    """The supported architecture the config names; ValueError listing the supported ones."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs and load_format == "gguf":  # a GGUF's config names its model_type only
        model_type = getattr(hf_config, "model_type", "?")
        archs = [_GGUF_ARCHITECTURES.get(model_type, model_type)]
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(
            f"model: {config_file(path, load_format)}: architecture "
            f"{archs or getattr(hf_config, 'model_type', '?')} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _transformers_config(data: dict[str, Any], path: str) -> Any:
    """A GGUF's fields (engine/gguf_file.py) in transformers' config class for their model type,
    which derives what the file leaves out (Gemma's layer types, rope parameters) as HF does."""
    from transformers import AutoConfig  # deferred: transformers imports torch (seconds)

    check_config_values(data, path)
    return AutoConfig.for_model(**data)


def _auto_config(path: str, load_format: str, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig  # deferred: transformers imports torch (seconds)

    if load_format == "gguf":
        return AutoConfig.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
