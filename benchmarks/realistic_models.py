"""Models of a size people serve, built once into the cache: a random-weight 1.56B-shape Llama.

Speed at 135M says little about speed at 1-8B, where a decode step is ~100 ms of weight reading
rather than a few ms of Python. The benchmarks therefore build a Llama of a realistic shape
(hidden 2048, MLP 8192, 24 layers, 32 query / 8 KV heads, head_dim 64, SmolLM2's tokenizer and
vocabulary of 49152, tied embeddings): random weights, since speed does not depend on their
values and no download is needed. It is written as an HF directory (bf16 safetensors), converted
by llama.cpp's own ``convert_hf_to_gguf.py`` to an F16 GGUF and quantized by its
``llama-quantize``, so ringllm and llama.cpp read the very same file.

    hf_model_path()            # RINGLLM_CACHE/llama-1.56b-random-hf
    gguf_path("Q4_0")          # RINGLLM_CACHE/llama-1.56b-random-Q4_0/model.gguf

Each is built once (``engine.models.default_model.cached_dir``); the GGUFs need llama.cpp
(``benchmarks.peer_llama_server.find_llama_cpp``).
"""

from __future__ import annotations

import os
import subprocess
import sys

from engine.models.default_model import cached_dir, write_tiny_model

NAME = "llama-1.56b-random"
# LlamaConfig fields over write_tiny_model's (which gives the tokenizer, ids, rope theta, tied
# embeddings and the architecture).
SHAPE = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=24,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=8192,
)
QUANTS = ("Q4_0", "Q4_K_M")  # llama-quantize type names
SEED = 0


def parameter_count(shape: dict = SHAPE, vocab: int = 49152) -> int:
    """Parameters of a tied-embedding Llama of this shape (norms included)."""
    h, f, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_key_value_heads"] * shape["head_dim"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
    return vocab * h + shape["num_hidden_layers"] * layer + h


def hf_model_path() -> str:
    """The HF directory (config, tokenizer, bf16 safetensors), built once."""
    return cached_dir(f"{NAME}-hf", _write_hf_model)


def _write_hf_model(dst: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    write_tiny_model(dst, **SHAPE)
    config = AutoConfig.from_pretrained(dst)
    torch.manual_seed(SEED)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the memory of float32 and then a cast
    try:
        model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(dst)


def gguf_path(quant: str) -> str:
    """The model quantized by ``llama-quantize`` to ``quant`` (one of ``QUANTS``, or ``F16``: the
    converter's own output), built once."""
    if quant == "F16":
        return os.path.join(cached_dir(f"{NAME}-F16", _convert_f16), "model.gguf")
    if quant not in QUANTS:
        raise ValueError(f"quant must be F16 or one of {QUANTS}, got {quant!r}")
    return os.path.join(cached_dir(f"{NAME}-{quant}", lambda dst: _quantize(quant, dst)), "model.gguf")


def convert_to_gguf(hf_dir: str, out: str, outtype: str = "f16") -> str:
    """``hf_dir`` written as the GGUF ``out`` by llama.cpp's ``convert_hf_to_gguf.py`` (run by this
    Python, which has torch, transformers and numpy; the script brings its own ``gguf-py``)."""
    from benchmarks.peer_llama_server import find_llama_cpp

    subprocess.run(
        [
            sys.executable,
            os.path.join(find_llama_cpp(), "convert_hf_to_gguf.py"),
            hf_dir,
            "--outfile",
            out,
            "--outtype",
            outtype,
        ],
        check=True,
    )
    return out


def _convert_f16(dst: str) -> None:
    convert_to_gguf(hf_model_path(), os.path.join(dst, "model.gguf"))


def _quantize(quant: str, dst: str) -> None:
    from benchmarks.peer_llama_server import binary, find_llama_cpp

    subprocess.run(
        [binary(find_llama_cpp(), "llama-quantize"), gguf_path("F16"), os.path.join(dst, "model.gguf"), quant],
        check=True,
    )


def main() -> None:
    """Build every file now (``python -m benchmarks.realistic_models``) and print the paths."""
    print(f"{NAME}: {parameter_count() / 1e9:.3f} B parameters")
    print(hf_model_path())
    for quant in QUANTS:
        print(gguf_path(quant))


if __name__ == "__main__":
    main()
