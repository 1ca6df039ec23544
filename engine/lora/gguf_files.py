"""A llama.cpp LoRA adapter file (``convert_lora_to_gguf.py``'s output).

``general.type = "adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha``, and per
projection ``blk.N.<proj>.weight.lora_a`` (``[r, in]``) and ``.lora_b`` (``[out, r]``). The
scale is llama.cpp's: ``alpha / r``, or 1 when alpha is 0. For a Llama file the converter
permuted the q/k rows of ``lora_b`` as it does the base weights (engine/worker/gguf_weights.py);
the same reverse permutation is applied here. The file is read by engine/gguf_file.py.
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from engine.gguf_file import read_tensor_index
from engine.lora.adapter import TARGETS, LoRAAdapter

_MODULES = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}
_KEY = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(".gguf")


def _dense(t) -> torch.Tensor:
    import gguf

    values = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(t.qtype))
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)]).copy())


def load_gguf_adapter(path: str, name: str, num_heads: int, num_kv_heads: int) -> LoRAAdapter:
    from engine.worker.gguf_weights import reverse_permute_index

    try:
        meta, tensors = read_tensor_index(path)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"LoRA adapter {name!r}: {os.path.basename(path)} is not a readable GGUF file ({type(e).__name__})"
        ) from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ValueError(
            f"LoRA adapter {name!r}: {os.path.basename(path)} is not a GGUF LoRA adapter "
            f"(general.type {meta.get('general.type')!r}, adapter.type {meta.get('adapter.type')!r})"
        )
    arch = meta.get("general.architecture") or ""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for t in tensors:
        m = _KEY.match(t.name)
        if m is None or m.group(2) not in _MODULES:
            raise ValueError(
                f"LoRA adapter {name!r}: tensor {t.name!r} is not a LoRA pair of a supported module "
                f"({', '.join(TARGETS)})"
            )
        halves.setdefault((int(m.group(1)), _MODULES[m.group(2)]), {})[m.group(3)] = _dense(t)
    ranks = {pair["a"].shape[0] for pair in halves.values() if "a" in pair}
    if len(ranks) > 1:
        raise ValueError(f"LoRA adapter {name!r}: its pairs have different ranks {sorted(ranks)}")
    rank = ranks.pop() if ranks else 0
    alpha = float(meta.get("adapter.lora.alpha") or 0.0)
    scaling = alpha / rank if alpha and rank else 1.0
    adapter = LoRAAdapter(name, rank)
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"a", "b"}:
            raise ValueError(f"LoRA adapter {name!r}: layer {layer} {module} has lora_{''.join(pair)} only")
        b = pair["b"]
        if arch == "llama" and module in ("q_proj", "k_proj") and b.dim() == 2:
            heads = num_heads if module == "q_proj" else num_kv_heads
            if b.shape[0] % (2 * heads) == 0:
                b = b[reverse_permute_index(b.shape[0], heads)]
        adapter.pairs[(layer, module)] = (pair["a"].contiguous(), (b * scaling).contiguous())
    return adapter
