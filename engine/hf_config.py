"""A model directory's ``config.json`` read without transformers, for the model types ringllm runs.

Why: ``AutoConfig`` imports transformers and, through it, torch: ~2.5 s of CPU in the
frontend, which needs no torch at all, and ~1 s in the EngineCore. Both processes read the
config at start-up, so this was most of the time to ``LLM()`` and ``ringllm serve`` being
ready. For the supported model types the config is plain JSON plus the class defaults of the
fields it may omit and two derived fields, all listed here; the test suite builds the model
from this config and from ``AutoConfig`` and checks that every structural choice (sizes, rope
frequencies, sliding layers) agrees, and that the defaults below are transformers' own.

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


# Sizes the engine builds tensors from: each must be a positive int where the config has it.
_POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings")


class ModelConfigError(ValueError):
    """A model file is unreadable or inconsistent: the message names the file and the problem
    in one line (what ``ringllm serve`` prints, what ``LLM()`` raises)."""


def check_config_values(values: dict[str, Any], file: str) -> None:
    """The sizes the engine builds tensors from are positive ints (what transformers' configs
    also accept is left to the model's build and the weights' shapes to refuse)."""
    for key in _POSITIVE_INTS:
        value = values.get(key)
        if value is None and key in ("head_dim", "num_key_value_heads"):
            continue  # derived from the others
        if key in values and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ModelConfigError(f"model: {file}: {key} must be a positive integer, got {value!r}")
    eps = values.get("rms_norm_eps")
    if "rms_norm_eps" in values and (not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0):
        raise ModelConfigError(f"model: {file}: rms_norm_eps must be a positive number, got {eps!r}")


def read_json_object(file: str, what: str = "model") -> dict[str, Any]:
    """``file`` as a JSON object, or a ModelConfigError naming it and what is wrong."""
    try:
        with open(file, "rb") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ModelConfigError(f"{what}: {file} does not exist") from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{what}: {file} is not UTF-8 text, so not valid JSON") from None
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{what}: {file} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
                               ) from None
    except OSError as e:
        raise ModelConfigError(f"{what}: cannot read {file}: {e.strerror}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{what}: {file} is not a JSON object")
    return data


def read_hf_config(path: str) -> Optional[HFConfig]:
    """``path``'s config.json as an HFConfig, or None when transformers must read it (a model
    type not in DEFAULTS, or a remote-code config). A config whose sizes cannot build a model
    is a ModelConfigError naming the file and the field."""
    file = os.path.join(path, "config.json")
    return config_from_dict(read_json_object(file), file)


def config_from_dict(data: dict[str, Any], file: str) -> Optional[HFConfig]:
    """``data`` (a config.json's object, or the fields of a GGUF's metadata) with the class
    defaults and derived fields; None when transformers must read it (see ``read_hf_config``)."""
    defaults = DEFAULTS.get(data.get("model_type"))
    if defaults is None or "auto_map" in data:
        return None
    cfg = {**defaults, **data}
    check_config_values(cfg, file)
    if not cfg["num_key_value_heads"]:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    if "head_dim" in cfg and not cfg["head_dim"]:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    check_config_values(cfg, file)  # the derived ones too (hidden_size < num_attention_heads: head_dim 0)
    if cfg["model_type"] in ("qwen2", "qwen3"):  # Qwen2Config / Qwen3Config.__post_init__
        if not cfg["use_sliding_window"]:
            cfg["sliding_window"] = None
        if cfg["layer_types"] is None:
            cfg["layer_types"] = [
                "sliding_attention" if cfg["sliding_window"] is not None and i >= cfg["max_window_layers"]
                else "full_attention" for i in range(cfg["num_hidden_layers"])]
    return HFConfig(**cfg)
