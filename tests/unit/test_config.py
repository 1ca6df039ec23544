"""EngineArgs -> create_engine_config: derived defaults, and a named error for every bad value."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import CompilationConfig, EngineArgs, create_engine_config, non_default_args


def config(tiny_model_dir, **kwargs):
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("load_format", "dummy")
    return create_engine_config(EngineArgs(model=tiny_model_dir, **kwargs))


def test_defaults_are_derived_from_the_model(tiny_model_dir):
    cfg = config(tiny_model_dir)
    assert cfg.model_config.max_model_len == 2048 and cfg.model_config.vocab_size == 49152
    assert cfg.model_config.architecture == "LlamaForCausalLM" and cfg.model_config.load_format == "dummy"
    assert cfg.model_config.dtype in ("bfloat16", "float32") and cfg.device == "cpu"
    assert cfg.cache_config.block_size == 16 and cfg.cache_config.enable_prefix_caching
    assert cfg.scheduler_config.enable_chunked_prefill and cfg.scheduler_config.max_num_batched_tokens == 2048
    assert cfg.scheduler_config.max_num_seqs == 256 and cfg.num_threads >= 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.device = "cuda"


@pytest.mark.parametrize(
    "field,value",
    [
        ("block_size", 0),
        ("block_size", 24),
        ("max_model_len", 0),
        ("max_model_len", 10**6),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("dtype", "int8"),
        ("load_format", "pt"),
        ("device", "tpu"),
        ("transport", "tcp"),
        ("scheduling_policy", "lifo"),
        ("gpu_memory_utilization", 0.0),
        ("kv_cache_memory", 0),
        ("num_threads", 0),
        ("data_parallel_size", 0),
        ("ring_capacity", 1000),
        ("max_logprobs", -1),
        ("max_prompt_logprobs_entries", -1),
        ("compilation_config", "fast"),
        ("renderer_num_workers", 0),
    ],
)
def test_each_invalid_value_names_its_field(tiny_model_dir, field, value):
    with pytest.raises(ValueError, match=field):
        config(tiny_model_dir, **{field: value})


def test_without_chunked_prefill_the_budget_must_hold_a_whole_prompt(tiny_model_dir):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        config(tiny_model_dir, enable_chunked_prefill=False, max_num_batched_tokens=512)
    cfg = config(tiny_model_dir, enable_chunked_prefill=False)
    assert cfg.scheduler_config.max_num_batched_tokens >= cfg.model_config.max_model_len


def test_max_num_seqs_never_exceeds_the_token_budget(tiny_model_dir):
    assert config(tiny_model_dir, max_num_batched_tokens=8).scheduler_config.max_num_seqs == 8


def test_wrong_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a local directory"):
        create_engine_config(EngineArgs(model=str(tmp_path / "nope"), device="cpu"))
    with pytest.raises(ValueError, match="no config.json"):
        create_engine_config(EngineArgs(model=str(tmp_path), device="cpu"))
    with pytest.raises(ValueError, match="does not exist"):
        create_engine_config(EngineArgs(model=str(tmp_path / "m.gguf"), device="cpu"))


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    from engine.models.default_model import write_tiny_model

    path = write_tiny_model(str(tmp_path / "gpt2"), architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        create_engine_config(EngineArgs(model=path, load_format="dummy", device="cpu"))


def test_hf_overrides_and_compilation_mode(tiny_model_dir):
    cfg = config(tiny_model_dir, hf_overrides={"max_position_embeddings": 256}, compilation_config=2)
    assert cfg.model_config.max_model_len == 256 and cfg.compilation_config == CompilationConfig(mode=2)
    assert config(tiny_model_dir, compilation_config=2, enforce_eager=True).compilation_config.mode == 0


def test_non_default_args_lists_what_the_user_set(tiny_model_dir):
    args = EngineArgs(model=tiny_model_dir, block_size=32)
    assert non_default_args(args) == {"model": tiny_model_dir, "block_size": 32}
