"""A model directory's ``config.json`` read without transformers, for the model types ringllm runs.

Why: ``AutoConfig`` imports transformers and, through it, torch: ~2.5 s of CPU in the
frontend, which needs no torch at all, and ~1 s in the EngineCore. Both processes read the
config at start-up, so this was most of the time to ``LLM()`` and ``ringllm serve`` being
ready. For the supported model types the config is plain JSON plus the class defaults of the
fields it may omit and two derived fields, all listed here;
tests/test_hf_config.py builds the model from this config and from ``AutoConfig`` and
checks that every structural choice (sizes, rope frequencies, sliding layers) agrees, and
that the defaults below are transformers' own.

Any other config (an unknown ``model_type``, a ``.gguf`` file) goes through transformers,
which also gives the error message for an unsupported architecture.
"""
from __future__ import annotations

import json
import os
import types
from typing import Any, Optional

# The fields the engine reads that a config.json may leave out, with transformers 5's class
# defaults (LlamaConfig, Qwen2Config, MistralConfig). None for a field derived below.
_COMMON = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
           "rope_parameters": None, "rope_scaling": None}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
              "head_dim": None, "attention_bias": False, "max_position_embeddings": 2048,
              "bos_token_id": 1, "eos_token_id": 2},
    "mistral": {**_COMMON, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": None, "max_position_embeddings": 131072, "sliding_window": 4096,
                "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {**_COMMON, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "max_position_embeddings": 32768,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
              "layer_types": None, "bos_token_id": None, "eos_token_id": None},
    "qwen3": {**_COMMON, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
              "attention_bias": False, "max_position_embeddings": 32768,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
              "layer_types": None, "bos_token_id": None, "eos_token_id": None},
}


class HFConfig(types.SimpleNamespace):
    """The config as attributes, as a transformers config is read (``cfg.hidden_size``)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def read_hf_config(path: str) -> Optional[HFConfig]:
    """``path``'s config.json as an HFConfig, or None when transformers must read it (a model
    type not in DEFAULTS, or a remote-code config)."""
    with open(os.path.join(path, "config.json"), "rb") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"model: {path!r} has a config.json that is not a JSON object")
    defaults = DEFAULTS.get(data.get("model_type"))
    if defaults is None or "auto_map" in data:
        return None
    cfg = {**defaults, **data}
    if not cfg["num_key_value_heads"]:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    if "head_dim" in cfg and not cfg["head_dim"]:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["model_type"] in ("qwen2", "qwen3"):  # Qwen2Config / Qwen3Config.__post_init__
        if not cfg["use_sliding_window"]:
            cfg["sliding_window"] = None
        if cfg["layer_types"] is None:
            cfg["layer_types"] = [
                "sliding_attention" if cfg["sliding_window"] is not None and i >= cfg["max_window_layers"]
                else "full_attention" for i in range(cfg["num_hidden_layers"])]
    return HFConfig(**cfg)
