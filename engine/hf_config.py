"""A model directory's ``config.json`` read without transformers, for the model types ringllm runs.

Why: ``AutoConfig`` imports transformers and, through it, torch: ~2.5 s of CPU in the
frontend, which needs no torch at all, and ~1 s in the EngineCore. Both processes read the
config at start-up, so this was most of the time to ``LLM()`` and ``ringllm serve`` being
ready. For the model types of every registered family (Llama, Mistral, Qwen2/3, Gemma 2/3,
Phi-3, Qwen3-MoE, Mixtral, OLMoE) the config is plain JSON plus the class defaults of the fields
it may omit and what each class's ``__post_init__`` derives (layer types, Gemma 3's and Phi-3's
rope conversions, Mixtral's expert count), all listed here; a GGUF file's metadata, mapped to
config.json's fields by engine/gguf_file.py, takes the same path. The test suite
builds the model from this config and from ``AutoConfig`` and checks that every structural
choice (the model's dims, rope frequencies, sliding layers, experts) agrees, and that the
defaults below are transformers' own.

Any other config (an unknown ``model_type``, remote code) goes through transformers, which also
gives the error message for an unsupported architecture.
"""

from __future__ import annotations

import json
import os
import types
from typing import Any, Optional

# The fields the engine reads that a config.json may leave out, with transformers 5's class
# defaults (LlamaConfig, Qwen2Config, ..., Gemma2Config, Phi3Config, Qwen3MoeConfig, MixtralConfig,
# OlmoeConfig). None for a field derived below (``_derive``, each family's ``__post_init__``).
_COMMON = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "rope_parameters": None,
    "rope_scaling": None,
}
_GEMMA = {
    **{k: v for k, v in _COMMON.items() if k != "hidden_act"},
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "layer_types": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        **_COMMON,
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "attention_bias": False,
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "mistral": {
        **_COMMON,
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen2": {
        **_COMMON,
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "qwen3": {
        **_COMMON,
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "attention_bias": False,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "gemma2": {
        **_GEMMA,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
    "gemma3_text": {
        **_GEMMA,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
    },
    "phi3": {
        **_COMMON,
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "sliding_window": None,
        "bos_token_id": 1,
        "eos_token_id": 32000,
    },
    "qwen3_moe": {
        **_COMMON,
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
        "norm_topk_prob": False,
        "mlp_only_layers": None,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "mixtral": {
        **_COMMON,
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "sliding_window": None,
        "num_experts_per_tok": 2,
        "num_local_experts": 8,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "olmoe": {
        **_COMMON,
        "vocab_size": 50304,
        "hidden_size": 2048,
        "intermediate_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": None,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "clip_qkv": None,
        "num_experts_per_tok": 8,
        "num_experts": 64,
        "norm_topk_prob": False,
        "bos_token_id": None,
        "eos_token_id": 50279,
    },
}
# A rope base other than the engine's 10000 where the config gives none (the class's ``default_theta``);
# Gemma 3's two bases are its rope conversion's (``_gemma3_rope``).
DEFAULT_THETA = {"mixtral": 1e6}
GEMMA3_THETA = {"global": 1e6, "local": 1e4}
GEMMA3_PATTERN = 6  # Gemma3TextConfig's sliding_window_pattern when the config has none


class HFConfig(types.SimpleNamespace):
    """The config as attributes, as a transformers config is read (``cfg.hidden_size``)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


# Sizes the engine builds tensors from: each must be a positive int where the config has it.
_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


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
        raise ModelConfigError(
            f"{what}: {file} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
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
    if defaults is None or "auto_map" in data or data.get("use_bidirectional_attention"):
        return None  # (Gemma 3's bidirectional variant: transformers changes its window)
    cfg = {**defaults, **data}
    check_config_values(cfg, file)
    if not cfg["num_key_value_heads"]:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    if "head_dim" in cfg and not cfg["head_dim"]:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    check_config_values(cfg, file)  # the derived ones too (hidden_size < num_attention_heads: head_dim 0)
    _derive(cfg)
    return HFConfig(**cfg)


def _derive(cfg: dict[str, Any]) -> None:
    """What each family's ``__post_init__`` (and rope conversion) derives, in place."""
    kind = cfg["model_type"]
    if kind in ("qwen2", "qwen3", "qwen3_moe") and not cfg["use_sliding_window"]:
        cfg["sliding_window"] = None
    if kind in ("qwen2", "qwen3") and cfg["layer_types"] is None:
        cfg["layer_types"] = [
            "sliding_attention"
            if cfg["sliding_window"] is not None and i >= cfg["max_window_layers"]
            else "full_attention"
            for i in range(cfg["num_hidden_layers"])
        ]
    if kind == "qwen3_moe" and cfg["mlp_only_layers"] is None:
        cfg["mlp_only_layers"] = []
    # The classes' attribute_map: the expert count is num_local_experts where a config has it (Mixtral's,
    # and Qwen3-MoE's as transformers 5 saves it; released Qwen3-MoE and OLMoE configs say num_experts).
    if kind == "mixtral" or "num_local_experts" in cfg:
        cfg["num_experts"] = cfg["num_local_experts"]
    if kind in DEFAULT_THETA and not cfg.get("rope_theta") and not (cfg["rope_parameters"] or {}).get("rope_theta"):
        cfg["rope_theta"] = DEFAULT_THETA[kind]
    if kind == "phi3":
        _phi3_rope(cfg)
    if kind.startswith("gemma") and cfg["layer_types"] is None:
        period = 2 if kind == "gemma2" else cfg.get("sliding_window_pattern") or GEMMA3_PATTERN
        cfg["layer_types"] = [
            "sliding_attention" if (i + 1) % period else "full_attention" for i in range(cfg["num_hidden_layers"])
        ]
    if kind == "gemma3_text":
        _gemma3_rope(cfg)


def _phi3_rope(cfg: dict[str, Any]) -> None:
    """Phi3Config's rope conversion: ``rope_scaling`` over ``rope_parameters``, and its first
    names for longrope ("su", and "yarn", which Phi-3 used for longrope) read as longrope."""
    params = dict(cfg.pop("rope_scaling") or cfg["rope_parameters"] or {})
    if params.get("rope_type", params.get("type")) in ("su", "yarn"):
        params["rope_type"] = "longrope"
    cfg["rope_parameters"], cfg["rope_scaling"] = params, None


def _gemma3_rope(cfg: dict[str, Any]) -> None:
    """Gemma3TextConfig's rope conversion: per-layer-type parameters; ``rope_scaling`` applies to
    the global layers, ``rope_theta`` is their base and ``rope_local_base_freq`` the local one."""
    params = {k: dict(v) for k, v in (cfg["rope_parameters"] or {}).items() if isinstance(v, dict)}
    full = params.setdefault("full_attention", {"rope_type": "default"})
    full.update(cfg.pop("rope_scaling") or {})
    full.setdefault("rope_theta", cfg.pop("rope_theta", None) or GEMMA3_THETA["global"])
    local = params.setdefault("sliding_attention", {"rope_type": "default"})
    local.setdefault("rope_theta", cfg.pop("rope_local_base_freq", None) or GEMMA3_THETA["local"])
    cfg["rope_parameters"], cfg["rope_scaling"] = params, None
