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

from engine.hf_config import DEFAULTS, read_hf_config
from engine.models.llama import LlamaForCausalLM

_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
          "vocab_size": 256}
CASES = {
    "llama-minimal": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SMALL},
    "llama-v4-linear-rope": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SMALL,
                             "num_key_value_heads": 2, "rope_theta": 500000.0, "tie_word_embeddings": True,
                             "rope_scaling": {"type": "linear", "factor": 2.0}, "rms_norm_eps": 1e-5,
                             "max_position_embeddings": 512, "eos_token_id": [7, 8]},
    "llama-v4-llama3-rope": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SMALL,
                             "rope_theta": 500000.0, "head_dim": 32,
                             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "llama-v5-rope-parameters": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SMALL,
                                 "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                                 "attention_bias": True},
    "qwen2-minimal": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SMALL},
    "qwen2-sliding-from-layer-1": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SMALL,
                                   "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1,
                                   "num_key_value_heads": 2, "rope_theta": 1000000.0},
    "qwen2-sliding-off": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SMALL,
                          "use_sliding_window": False, "sliding_window": 128},
    "qwen3-minimal": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **_SMALL},
    "qwen3-head-dim-and-window": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **_SMALL,
                                  "head_dim": 32, "num_key_value_heads": 2, "use_sliding_window": True,
                                  "sliding_window": 64, "max_window_layers": 1, "tie_word_embeddings": True},
    "mistral-minimal": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], **_SMALL},
    "mistral-no-window": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], **_SMALL,
                          "sliding_window": None, "num_key_value_heads": 1},
}


def _write(tmp_path, data: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(data))
    return str(tmp_path)


def _structure(cfg) -> dict:
    model = LlamaForCausalLM(cfg, torch.float32, "cpu", max_model_len=128, backend="torch")
    d = model.dims
    return {"hidden": d.hidden, "heads": d.num_heads, "kv_heads": d.num_kv_heads,
            "head_dim": d.head_dim, "intermediate": d.intermediate, "vocab": d.vocab_size,
            "eps": d.eps, "tied": d.tied, "window": d.sliding_window,
            "sliding_layers": [layer.sliding for layer in model.layers], "layers": len(model.layers),
            "qkv_bias": d.qkv_bias, "rope": model.ropes[0].cis, "qk_norm": d.qk_norm}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_model_built_from_the_json_config_is_the_one_transformers_config_builds(tmp_path, case):
    from transformers import AutoConfig

    path = _write(tmp_path, CASES[case])
    ours, theirs = read_hf_config(path), AutoConfig.from_pretrained(path)
    assert ours is not None
    a, b = _structure(ours), _structure(theirs)
    assert torch.equal(a.pop("rope"), b.pop("rope"))
    assert a == b
    for key in ("max_position_embeddings", "vocab_size", "architectures", "model_type", "eos_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key


def test_the_default_model_config_reads_as_transformers_reads_it():
    from transformers import AutoConfig

    from engine.models.default_model import default_model_path

    path = default_model_path()
    ours, theirs = read_hf_config(path), AutoConfig.from_pretrained(path)
    a, b = _structure(ours), _structure(theirs)
    assert torch.equal(a.pop("rope"), b.pop("rope")) and a == b


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


def test_other_configs_are_left_to_transformers(tmp_path):
    assert read_hf_config(_write(tmp_path, {"model_type": "gpt2", "n_embd": 64})) is None
    assert read_hf_config(_write(tmp_path, {**CASES["llama-minimal"], "auto_map": {"AutoConfig": "x.Y"}})) is None


def test_a_config_that_is_not_an_object_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_hf_config(str(tmp_path))
