"""Random LoRA adapters made with ``peft`` on a tiny random Llama, and their references: the
adapter merged into the transformers model (float32), generating greedily."""

from __future__ import annotations

import copy
import os

import torch
from transformers import LlamaConfig

from tests.helpers.hf_families import random_hf_model

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# the tiny Llama of the LoRA tests: the default tokenizer's vocabulary, so text prompts work
TINY_LLAMA = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    tie_word_embeddings=True,
    architectures=["LlamaForCausalLM"],
)


def tiny_llama(path: str, **overrides):
    """The tiny random Llama (``overrides``: other config fields) saved to ``path`` with the
    default tokenizer; returns the HF model."""
    from engine.models.default_model import write_tiny_model

    config = {**TINY_LLAMA, **overrides}
    hf = random_hf_model(LlamaConfig, config, lambda name, p: None)
    write_tiny_model(path, **config)  # config and tokenizer files
    hf.save_pretrained(path)
    return hf


def make_adapter(hf, path: str, seed: int, r: int = 8, alpha: int = 16, targets=ALL_TARGETS, **extra):
    """A random PEFT LoRA adapter of ``hf`` saved to ``path`` (B not zero, so it changes the
    output); returns the base model with the adapter merged into it, float32."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        copy.deepcopy(hf),
        LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False, **extra),
    )
    with torch.no_grad():  # peft's random init of B is small: make the adapter change greedy tokens
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(path)
    assert os.path.isfile(os.path.join(path, "adapter_model.safetensors"))
    return model.merge_and_unload().eval()


def hf_greedy(hf, prompt: list[int], num_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    return out[0, len(prompt) :].tolist()


_GGUF_MODULES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}


def write_gguf_adapter(adapter_dir: str, path: str, cfg, alpha: float) -> None:
    """A PEFT adapter as llama.cpp's ``convert_lora_to_gguf.py`` writes it for a "llama" file:
    ``blk.N.<proj>.weight.lora_a/_b``, q/k rows of ``lora_b`` permuted as the base weights are."""
    import re

    import gguf
    from safetensors.torch import load_file

    from tests.helpers.hf_families import finish_gguf, llama_permute

    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for key, tensor in sorted(load_file(os.path.join(adapter_dir, "adapter_model.safetensors")).items()):
        layer, module, half = re.search(r"layers\.(\d+)\.\w+\.(\w+)\.lora_([AB])\.weight$", key).groups()
        data = tensor.float().numpy()
        if half == "B" and module in ("q_proj", "k_proj"):
            data = llama_permute(data, cfg.num_attention_heads if module == "q_proj" else cfg.num_key_value_heads)
        w.add_tensor(f"blk.{layer}.{_GGUF_MODULES[module]}.weight.lora_{half.lower()}", data)
    finish_gguf(w)


def base_and_adapters(d: str):
    """The LoRA tests' models under ``d``: (base dir, base HF model, {name: (adapter dir, merged
    HF model)}) for three adapters: every target at rank 8; q/v only at rank 4 with rsLoRA; the
    MLP's gate/down at rank 16."""
    hf = tiny_llama(os.path.join(d, "base"))
    specs = {
        "all": dict(seed=1),
        "qv-rslora": dict(seed=2, r=4, alpha=8, targets=["q_proj", "v_proj"], use_rslora=True),
        "mlp": dict(seed=3, r=16, alpha=8, targets=["gate_proj", "down_proj"]),
    }
    adapters = {
        name: (os.path.join(d, name), make_adapter(hf, os.path.join(d, name), **spec)) for name, spec in specs.items()
    }
    return os.path.join(d, "base"), hf, adapters
