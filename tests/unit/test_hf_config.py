"""config.json read without transformers (engine/hf_config.py) builds the model transformers' config builds.

Each case is a config.json as found in the wild (complete, or leaving fields to the class
defaults; transformers 4 and 5 rope forms; sliding windows), read both ways; the engine's
model is built from each and every structural choice must agree.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from engine.hf_config import DEFAULT_THETA, DEFAULTS, GEMMA3_PATTERN, GEMMA3_THETA, read_hf_config
from engine.models import get_model_class

_SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "vocab_size": 256,
}
CASES = {
    "llama-minimal": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SMALL},
    "llama-v4-linear-rope": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **_SMALL,
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512,
        "eos_token_id": [7, 8],
    },
    "llama-v4-llama3-rope": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **_SMALL,
        "rope_theta": 500000.0,
        "head_dim": 32,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "llama-v5-rope-parameters": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **_SMALL,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        "attention_bias": True,
    },
    "qwen2-minimal": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SMALL},
    "qwen2-sliding-from-layer-1": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        **_SMALL,
        "use_sliding_window": True,
        "sliding_window": 64,
        "max_window_layers": 1,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
    },
    "qwen2-sliding-off": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        **_SMALL,
        "use_sliding_window": False,
        "sliding_window": 128,
    },
    "qwen3-minimal": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **_SMALL},
    "qwen3-head-dim-and-window": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        **_SMALL,
        "head_dim": 32,
        "num_key_value_heads": 2,
        "use_sliding_window": True,
        "sliding_window": 64,
        "max_window_layers": 1,
        "tie_word_embeddings": True,
    },
    "mistral-minimal": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], **_SMALL},
    "mistral-no-window": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        **_SMALL,
        "sliding_window": None,
        "num_key_value_heads": 1,
    },
    # the families beyond Llama's: each minimal (class defaults and derived fields), then as released
    "gemma2-minimal": {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        **_SMALL,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
    },
    "gemma2-released": {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        **_SMALL,
        "head_dim": 16,
        "num_key_value_heads": 2,
        "query_pre_attn_scalar": 24,
        "sliding_window": 8,
        "attn_logit_softcapping": 40.0,
        "final_logit_softcapping": 20.0,
        "rope_theta": 20000.0,
    },
    "gemma3-minimal": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        **_SMALL,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "num_hidden_layers": 7,
    },
    "gemma3-v4-rope": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        **_SMALL,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window_pattern": 2,
        "rope_theta": 1e5,
        "rope_local_base_freq": 100.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    },
    "gemma3-v5-rope": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        **_SMALL,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    },
    "phi3-minimal": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_SMALL},
    "phi3-su-rope": {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        **_SMALL,
        "sliding_window": 16,
        "original_max_position_embeddings": 32,
        "max_position_embeddings": 128,
        "rope_scaling": {
            "type": "su",
            "short_factor": [1.0 + i / 8 for i in range(8)],
            "long_factor": [1.0 + i for i in range(8)],
        },
    },
    "phi4-mini-partial-rotary": {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        **_SMALL,
        "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": 32,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6},
    },
    "qwen3-moe-minimal": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        **_SMALL,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "qwen3-moe-released": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        **_SMALL,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
        "use_sliding_window": False,
        "sliding_window": 64,
        "rope_theta": 1e6,
    },
    "qwen3-moe-saved-by-transformers-5": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        **_SMALL,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "olmoe-local-experts": {
        "model_type": "olmoe",
        "architectures": ["OlmoeForCausalLM"],
        **_SMALL,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "mixtral-minimal": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **_SMALL},
    "mixtral-released": {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        **_SMALL,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 32,
        "rope_theta": 1e4,
    },
    "olmoe-minimal": {
        "model_type": "olmoe",
        "architectures": ["OlmoeForCausalLM"],
        **_SMALL,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
}


def _write(tmp_path, data: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(data))
    return str(tmp_path)


def _structure(cfg) -> dict:
    """The model the family's class builds from ``cfg``: its dims (sizes, norms, windows, soft-caps,
    scales, experts), each layer's window and rope table, and the rope tables' angles."""
    cls = get_model_class(cfg.architectures[0])
    model = cls(cfg, torch.float32, "cpu", max_model_len=128, backend="torch")
    return {
        "dims": model.dims,
        "sliding_layers": [layer.sliding for layer in model.layers],
        "layer_ropes": [layer.rope for layer in model.layers],
        "ropes": [r.cis for r in model.ropes],
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_model_built_from_the_json_config_is_the_one_transformers_config_builds(tmp_path, case):
    from transformers import AutoConfig

    path = _write(tmp_path, CASES[case])
    ours, theirs = read_hf_config(path), AutoConfig.from_pretrained(path)
    assert ours is not None
    a, b = _structure(ours), _structure(theirs)
    ropes_a, ropes_b = a.pop("ropes"), b.pop("ropes")
    assert len(ropes_a) == len(ropes_b) and all(torch.equal(x, y) for x, y in zip(ropes_a, ropes_b))
    assert a == b
    for key in ("max_position_embeddings", "vocab_size", "architectures", "model_type", "eos_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key


def test_the_default_model_config_reads_as_transformers_reads_it():
    from transformers import AutoConfig

    from engine.models.default_model import default_model_path

    path = default_model_path()
    ours, theirs = read_hf_config(path), AutoConfig.from_pretrained(path)
    a, b = _structure(ours), _structure(theirs)
    assert all(torch.equal(x, y) for x, y in zip(a.pop("ropes"), b.pop("ropes"))) and a == b


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_the_defaults_are_transformers_class_defaults(model_type):
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type))
    # The declared defaults (before __post_init__ derives fields, which read_hf_config repeats).
    declared = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    instance = cls()
    for key, value in DEFAULTS[model_type].items():
        if value is None:  # derived from other fields (read_hf_config), or unset there too
            continue
        assert declared.get(key, getattr(instance, key, None)) == value, (model_type, key)


def test_the_rope_bases_and_gemma3_pattern_are_transformers_defaults():
    from transformers import AutoConfig

    for model_type in DEFAULTS:
        theta = type(AutoConfig.for_model(model_type)).default_theta
        if model_type == "gemma3_text":
            assert theta == GEMMA3_THETA
        else:
            assert theta == DEFAULT_THETA.get(model_type, 10000.0), model_type
    gemma3 = AutoConfig.for_model("gemma3_text", num_hidden_layers=GEMMA3_PATTERN * 2)
    assert [i for i, kind in enumerate(gemma3.layer_types) if kind == "full_attention"] == [
        GEMMA3_PATTERN - 1,
        2 * GEMMA3_PATTERN - 1,
    ]


def test_other_configs_are_left_to_transformers(tmp_path):
    assert read_hf_config(_write(tmp_path, {"model_type": "gpt2", "n_embd": 64})) is None
    assert read_hf_config(_write(tmp_path, {**CASES["llama-minimal"], "auto_map": {"AutoConfig": "x.Y"}})) is None


def test_a_config_that_is_not_an_object_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_hf_config(str(tmp_path))
