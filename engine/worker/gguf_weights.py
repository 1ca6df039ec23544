"""A ``.gguf`` file's tensors under their HF names, quantized ones kept as the file's own blocks.

For ``quantization="gguf"`` (the default for a .gguf model, vLLM's name): every tensor of a
quantized GGML type comes out as ``GGUFBlocks`` (the file's bytes, ``[out, row_bytes]``; Q5_0
re-encoded as the Q8_0 blocks of the same values, engine/kernels/quant_recode.py, so that it
fuses and runs as Q8_0), and float ones (norms; F32/F16/BF16 matrices) as float32 tensors. The
model's linear methods then run the types in ``quant.SUPPORTED_TYPES`` on their blocks and
dequantize the rest once (engine/models/linear.py).

Row order. llama.cpp's converter permutes the q and k rows of a Llama GGUF; transformers
undoes it (``_reverse_permute_weights``: rows viewed as ``[heads, head_dim / 2, 2]``, the
last two axes swapped). The same index permutation is applied here to the rows of the
blocks, which is exact, and the model then applies its own rotary pairing
(engine/models/weights.py). For a Llama GGUF the two cancel: its q/k rows are already in
adjacent pairs.

Experts. llama.cpp stacks a layer's experts into one 3-D tensor per projection
(``blk.N.ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps``, ``[experts, rows, in]``);
each expert's rows are a slice of it (whole rows of blocks: exact), yielded under the
family's per-expert HF name (Mixtral's ``block_sparse_moe.experts.E.w1``, the others'
``mlp.experts.E.gate_proj``), and ``ffn_gate_inp`` as the router. Mixtral files converted before
llama.cpp stacked experts hold one 2-D tensor per expert (``blk.N.ffn_gate.E``): taken as
they are. So experts arrive one matrix each, as an HF checkpoint's do, and each runs as a
linear of its own.

The file is read by engine/gguf_file.py, not ``gguf.GGUFReader`` (see there why).
"""

from __future__ import annotations

import logging
import os
from typing import Iterator

import numpy as np
import torch

from engine.gguf_file import read_tensor_index
from engine.models.linear import GGUFBlocks, ggml_type_name

logger = logging.getLogger(__name__)

_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GEMMA_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_LAYER_NAMES = {
    "gemma2": _GEMMA_NAMES,
    "gemma3": _GEMMA_NAMES,  # Phi-3: fused q/k/v and gate/up
    "phi3": {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
_NORMS_PLUS_ONE = ("gemma2", "gemma3")  # llama.cpp stores Gemma's (1 + w) norm weights with the 1 added
# stacked expert tensors -> the family's HF names for one expert (<e>), and its router
_EXPERTS = {
    "llama": {
        "ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
        "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
        "ffn_down_exps": "block_sparse_moe.experts.{e}.w2",
        "ffn_gate_inp": "block_sparse_moe.gate",
    }
}
_EXPERTS["qwen3moe"] = _EXPERTS["olmoe"] = {
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
    "ffn_gate_inp": "mlp.gate",
}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None: not a weight
    the model takes (``rope_freqs``, Phi-3's ``rope_factors_*``: the config has them)."""
    base, _, kind = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, idx, part = base.split(".", 2)
        names = {**_ARCH_LAYER_NAMES.get(arch, _LAYER_NAMES), **_EXPERTS.get(arch, {})}
        proj, _, expert = part.partition(".")
        if expert.isdigit() and f"{proj}_exps" in names:  # an early Mixtral file: blk.N.ffn_gate.E, one per expert
            return f"model.layers.{idx}.{names[f'{proj}_exps'].format(e=expert)}.{kind}"
        return f"model.layers.{idx}.{names[part]}.{kind}" if part in names else None
    return f"{_TOP_NAMES[base]}.{kind}" if base in _TOP_NAMES else None


def reverse_permute_index(rows: int, heads: int) -> torch.Tensor:
    """Which GGUF row each HF row of a Llama q/k matrix comes from (transformers' permutation)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def gguf_weights(path: str, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor | GGUFBlocks]]:
    import gguf

    if not os.path.isfile(path):
        raise ValueError(f"model: GGUF file {path!r} does not exist")
    meta, tensors = read_tensor_index(path)
    arch = meta.get("general.architecture") or ""
    floats = {int(getattr(gguf.GGMLQuantizationType, t)): t for t in _FLOAT_TYPES}
    recoded: set[int] = set()
    for t in tensors:
        name = hf_name(t.name, arch)
        if name is None:
            continue
        in_features = int(t.shape[0])
        out_features = int(np.prod(t.shape)) // in_features
        if t.qtype in floats:
            kind = {"F32": np.float32, "F16": np.float16, "F64": np.float64}.get(floats[t.qtype])
            if kind is None:  # BF16: the high half of a float32
                raw = torch.from_numpy(t.data.copy()).view(torch.bfloat16).float()
            else:
                raw = torch.from_numpy(t.data.view(kind).astype(np.float32))
            value = raw.reshape([int(n) for n in reversed(t.shape)])
        else:
            data = torch.from_numpy(t.data.copy()).reshape(out_features, -1)
            value = GGUFBlocks(data, t.qtype, out_features, in_features).recoded()
            if value.qtype != t.qtype and t.qtype not in recoded:
                recoded.add(t.qtype)
                logger.info(
                    "GGUF %s tensors run as %s blocks: the same values, in more bytes",
                    ggml_type_name(t.qtype),
                    ggml_type_name(value.qtype),
                )
        if arch in _NORMS_PLUS_ONE and name.endswith("norm.weight"):
            value = value - 1.0
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if "q_proj" in name else num_kv_heads
            index = reverse_permute_index(value.shape[0], heads)
            value = value.permute_rows(index) if isinstance(value, GGUFBlocks) else value[index]
        if "{e}" in name:
            yield from _per_expert(name, value, int(t.shape[2]) if len(t.shape) == 3 else 0)
        else:
            yield name, value


def _per_expert(name: str, value: torch.Tensor | GGUFBlocks, experts: int):
    """A stacked ``[experts, rows, in]`` tensor as one ``[rows, in]`` matrix per expert."""
    if experts <= 0:
        raise ValueError(f"model: GGUF tensor for {name.format(e='E')} is not a 3-D stack of experts")
    if isinstance(value, GGUFBlocks):
        rows = value.out_features // experts
        for e in range(experts):
            yield (
                name.format(e=e),
                GGUFBlocks(value.data[e * rows : (e + 1) * rows], value.qtype, rows, value.in_features),
            )
    else:
        for e in range(experts):
            yield name.format(e=e), value[e]
