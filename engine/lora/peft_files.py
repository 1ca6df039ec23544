"""A PEFT LoRA adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``).

What is read: ``r``, ``lora_alpha``, ``use_rslora`` (scale ``alpha / sqrt(r)`` instead of
``alpha / r``), and the ``lora_A``/``lora_B`` pairs of the q/k/v/o and gate/up/down
projections. What an adapter may hold that ringllm does not run is refused by name (DoRA,
trained biases, ``modules_to_save``, per-module rank or alpha patterns, other target modules,
embedding LoRA), never silently dropped.
"""

from __future__ import annotations

import json
import math
import os
import re

from engine.lora.adapter import TARGETS, LoRAAdapter

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def read_peft_config(path: str, name: str) -> dict:
    """The adapter's config, checked for what ringllm cannot run (ValueError naming it)."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise ValueError(f"LoRA adapter {name!r}: {CONFIG_FILE} not found in its lora_path")
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"LoRA adapter {name!r}: {CONFIG_FILE} cannot be read ({type(e).__name__})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"LoRA adapter {name!r}: {CONFIG_FILE} is not a JSON object")
    refusals = [
        (cfg.get("peft_type", "LORA") != "LORA", f"peft_type {cfg.get('peft_type')!r} (only LORA)"),
        (bool(cfg.get("use_dora")), "use_dora (DoRA adapters)"),
        (cfg.get("bias", "none") != "none", f"bias={cfg.get('bias')!r} (trained biases)"),
        (bool(cfg.get("modules_to_save")), "modules_to_save"),
        (bool(cfg.get("rank_pattern")), "rank_pattern (per-module ranks)"),
        (bool(cfg.get("alpha_pattern")), "alpha_pattern (per-module alphas)"),
        (bool(cfg.get("fan_in_fan_out")), "fan_in_fan_out"),
    ]
    for refused, what in refusals:
        if refused:
            raise ValueError(f"LoRA adapter {name!r}: {what} is not supported")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(TARGETS))
        if unknown:
            raise ValueError(
                f"LoRA adapter {name!r}: target modules {unknown} are not supported; supported: {', '.join(TARGETS)}"
            )
    rank = cfg.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA adapter {name!r}: r must be an int >= 1, got {rank!r}")
    alpha = cfg.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"LoRA adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    return cfg


def load_peft_adapter(path: str, name: str) -> LoRAAdapter:
    cfg = read_peft_config(path, name)
    rank, alpha = cfg["r"], float(cfg.get("lora_alpha", cfg["r"]))
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    file = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(file):
        raise ValueError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} not found in its lora_path")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(file)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} cannot be read ({type(e).__name__})") from None
    halves: dict[tuple[int, str], dict[str, object]] = {}
    for key, tensor in tensors.items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in TARGETS:
            raise ValueError(
                f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA pair of a supported module ({', '.join(TARGETS)})"
            )
        halves.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = tensor.float()
    adapter = LoRAAdapter(name, rank)
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: layer {layer} {module} has lora_{''.join(pair)} only")
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or a.shape[0] != rank:
            raise ValueError(
                f"LoRA adapter {name!r}: layer {layer} {module} lora_A is {list(a.shape)}, not rank {rank}"
            )
        adapter.pairs[(layer, module)] = (a.contiguous(), (b * scaling).contiguous())
    return adapter
