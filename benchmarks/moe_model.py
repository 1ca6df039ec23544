"""A ~3B-total / ~0.6B-active Qwen3-MoE of random weights, at a real shape, built once into a cache
directory as an HF checkpoint, then (where llama.cpp's tools are given) converted and quantized by
llama.cpp's own ``convert_hf_to_gguf.py`` and ``llama-quantize``.

Why random weights at a real shape: decode speed on a CPU is set by the bytes each token reads
(here the top-8 of 48 experts in each of 24 layers, plus attention and the LM head), not by what
the weights say; a released MoE of this size is a 6 GB download the hosts cannot make. The shape
follows Qwen3-30B-A3B scaled down (hidden 1024, 16/4 heads of 128, experts of 768, 8 of them per
token, renormalised top-k) with SmolLM2's tokenizer (vocabulary 49152):

    experts 24 x 48 x 3 x 1024 x 768 = 2.72 B, attention 24 x 5.2 M = 0.13 B, embed + head 0.10 B
    active per token: 24 x 8 x 3 x 1024 x 768 = 0.45 B in experts + 0.13 B + the head 0.05 B = 0.63 B

The checkpoint is written tensor by tensor (bf16 safetensors shards, one expert's matrices under
its own name as released Qwen3-MoE checkpoints hold them), so building it needs ~2 GB of memory,
not the model's size. Each step publishes its output by renaming a finished temporary file or
directory, so an interrupted build is redone, never used half-written.

    python -m benchmarks.moe_model --llama-cpp /path/to/llama.cpp [--cache-dir DIR]

prints the paths: the HF directory, and the Q4_0 and Q4_K_M files.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile

import torch

from engine import envs
from engine.models.default_model import default_tokenizer_path

log = logging.getLogger("benchmarks.moe_model")

NAME = "qwen3moe-3b-a0.6b-random"
CONFIG = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    vocab_size=49152,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=48,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    hidden_act="silu",
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
    attention_bias=False,
)
QUANT_TYPES = ("Q4_0", "Q4_K_M")
_SHARD_BYTES = 2 << 30
_STD = 0.02  # transformers' initializer_range


def _tensors(cfg: dict):
    """(name, shape) of every weight, in checkpoint order."""
    h, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (heads * hd, h)
        yield p + "self_attn.k_proj.weight", (kv * hd, h)
        yield p + "self_attn.v_proj.weight", (kv * hd, h)
        yield p + "self_attn.o_proj.weight", (h, heads * hd)
        yield p + "self_attn.q_norm.weight", (hd,)
        yield p + "self_attn.k_norm.weight", (hd,)
        yield p + "mlp.gate.weight", (cfg["num_experts"], h)
        for e in range(cfg["num_experts"]):
            yield p + f"mlp.experts.{e}.gate_proj.weight", (cfg["moe_intermediate_size"], h)
            yield p + f"mlp.experts.{e}.up_proj.weight", (cfg["moe_intermediate_size"], h)
            yield p + f"mlp.experts.{e}.down_proj.weight", (h, cfg["moe_intermediate_size"])
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (cfg["vocab_size"], h)


def count_parameters(cfg: dict = CONFIG) -> tuple[int, int]:
    """(total, active per token): active counts the top-k experts, every other matrix but the
    embedding (a lookup reads one row) and no router or norm."""
    total = active = 0
    k, n = cfg["num_experts_per_tok"], cfg["num_experts"]
    for name, shape in _tensors(cfg):
        size = shape[0] * (shape[1] if len(shape) > 1 else 1)
        total += size
        if len(shape) == 1 or name.endswith(("embed_tokens.weight", "mlp.gate.weight")):
            continue
        active += size * k // n if ".experts." in name else size
    return total, active


def write_checkpoint(path: str, cfg: dict = CONFIG, seed: int = 0) -> None:
    """The HF directory: config.json, the default tokenizer's files, bf16 safetensors shards of
    N(0, 0.02) matrices and unit norms, seeded."""
    from safetensors.torch import save_file

    os.makedirs(path)
    gen = torch.Generator().manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    index: dict[str, str] = {}
    shards = 0

    def flush() -> None:
        nonlocal shards
        shards += 1
        name = f"model-{shards:05d}.safetensors"
        save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
        index.update({t: name for t in shard})
        shard.clear()

    size = 0
    for name, shape in _tensors(cfg):
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen) * _STD).to(torch.bfloat16)
        shard[name] = t
        size += t.numel() * 2
        if size >= _SHARD_BYTES:
            flush()
            size = 0
    if shard:
        flush()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(
            {
                "metadata": {"total_size": sum(2 * s[0] * (s[1] if len(s) > 1 else 1) for _, s in _tensors(cfg))},
                "weight_map": index,
            },
            f,
        )
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tok = default_tokenizer_path()
    for fname in os.listdir(tok):
        if fname.startswith("tokenizer") or fname in (
            "special_tokens_map.json",
            "generation_config.json",
            "chat_template.jinja",
        ):
            shutil.copy(os.path.join(tok, fname), path)


def _published(final: str, build) -> str:
    """``final`` if it exists; else ``build(tmp)`` into a sibling temporary path renamed to it."""
    if os.path.exists(final):
        return final
    tmp = tempfile.mkdtemp(prefix=".part-", dir=os.path.dirname(final))
    target = os.path.join(tmp, os.path.basename(final))
    try:
        build(target)
        os.rename(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build(
    cache_dir: str, llama_cpp: str | None, python: str = sys.executable, types: tuple[str, ...] = QUANT_TYPES
) -> dict[str, str]:
    """{"hf": dir, "BF16": gguf, and a GGUF per type of ``types``} (the GGUFs where ``llama_cpp``,
    the llama.cpp source tree with its tools built under build/bin, is given); built once each."""
    os.makedirs(cache_dir, exist_ok=True)
    out = {"hf": _published(os.path.join(cache_dir, NAME), write_checkpoint)}
    if not llama_cpp:
        return out
    convert = os.path.join(llama_cpp, "convert_hf_to_gguf.py")
    quantize = os.path.join(llama_cpp, "build", "bin", "llama-quantize")

    def run(cmd: list[str]) -> None:
        log.info("%s", " ".join(cmd))
        subprocess.run(cmd, check=True)

    out["BF16"] = _published(
        os.path.join(cache_dir, f"{NAME}.BF16.gguf"),
        lambda t: run([python, convert, out["hf"], "--outtype", "bf16", "--outfile", t]),
    )
    for qtype in types:
        out[qtype] = _published(
            os.path.join(cache_dir, f"{NAME}.{qtype}.gguf"), lambda t, q=qtype: run([quantize, out["BF16"], t, q, "2"])
        )
    return out


def default_cache_dir() -> str:
    return os.path.join(envs.RINGLLM_CACHE, "bench-models")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", default=default_cache_dir())
    ap.add_argument("--llama-cpp", default=None, help="llama.cpp source tree with build/bin/llama-quantize")
    ap.add_argument("--python", default=sys.executable, help="the python that runs convert_hf_to_gguf.py")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    total, active = count_parameters()
    log.info("%s: %.2f B parameters, %.2f B active per token", NAME, total / 1e9, active / 1e9)
    for kind, path in build(args.cache_dir, args.llama_cpp, args.python).items():
        print(f"{kind}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
