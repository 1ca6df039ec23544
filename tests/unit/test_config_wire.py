"""An EngineConfig on its way to the EngineCore (engine/config/wire.py): it decodes to the config
the frontend derived, one config has one digest, and any field that differs changes it."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.config.wire import config_digest, decode_config, encode_config
from engine.core.launch import check_ready
from engine.exceptions import EngineStartupError
from engine.wire_messages import EngineReady
from tests.helpers.engine_utils import tiny_config

EVERY_SUB_CONFIG = dict(
    hf_overrides={"rope_theta": 5000.0},
    worker_cls="engine.worker.Worker",
    structured_outputs_config={"backend": "guidance", "reasoning_start": "<think>", "reasoning_end": "</think>"},
    speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    kv_events_config={"enable_kv_cache_events": True, "endpoint": "ipc:///tmp/ringllm-unused"},
    compilation_config={"mode": 0, "cudagraph_capture_sizes": [1, 2]},
    runner="pooling",
    pooler_config={"pooling_type": "LAST"},
    data_parallel_size=2,
    renderer_num_workers=2,
    shutdown_timeout=3.0,
    max_num_prefill_tokens="auto",
)


def assert_round_trip(config: EngineConfig, worker_cls=None) -> None:
    back = decode_config(encode_config(config), worker_cls)
    assert back == config
    assert back.model_config.hf_config.to_dict() == config.model_config.hf_config.to_dict()
    assert config_digest(back) == config_digest(config)


def test_a_config_decodes_to_itself_with_every_sub_config(tiny_model_dir):
    assert_round_trip(tiny_config(tiny_model_dir))
    config = tiny_config(tiny_model_dir, **EVERY_SUB_CONFIG)
    assert config.model_config.hf_config.rope_theta == 5000.0 and config.kv_events_config is not None
    assert_round_trip(config)


def test_a_transformers_config_is_rebuilt_in_its_class(tiny_model_dir):
    """A config engine/hf_config.py did not read (remote code, a model type outside its table)
    travels as its to_dict() and comes back as transformers' class for that type, with the fields
    that class derives (Gemma 3's layer types)."""
    from transformers import Gemma3TextConfig

    config = tiny_config(tiny_model_dir)
    hf = Gemma3TextConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    config = dataclasses.replace(config, model_config=dataclasses.replace(config.model_config, hf_config=hf))
    back = decode_config(encode_config(config))
    assert config_digest(back) == config_digest(config)  # what the core checks
    assert type(back.model_config.hf_config) is Gemma3TextConfig
    assert back.model_config.hf_config.layer_types == hf.layer_types


def test_a_worker_class_is_named_in_the_digest_and_travels_beside_it(tiny_model_dir):
    from tests.helpers.modules_worker import ModulesWorker

    config = tiny_config(tiny_model_dir, worker_cls=ModulesWorker)
    named = tiny_config(tiny_model_dir, worker_cls="tests.helpers.modules_worker.ModulesWorker")
    assert config_digest(config) == config_digest(named)
    assert_round_trip(config, ModulesWorker)
    assert decode_config(encode_config(config)).worker_cls == "tests.helpers.modules_worker.ModulesWorker"


@pytest.mark.parametrize(
    "sub_config,field,value",
    [
        ("model_config", "max_model_len", 128),
        ("cache_config", "block_size", 32),
        ("scheduler_config", "max_num_seqs", 7),
        ("parallel_config", "data_parallel_rank", 0),
        ("frontend_config", "renderer_num_workers", 3),
        ("structured_outputs_config", "backend", "xgrammar"),
    ],
)
def test_any_field_that_differs_changes_the_digest(tiny_model_dir, sub_config, field, value):
    config = tiny_config(tiny_model_dir)
    other = dataclasses.replace(
        config, **{sub_config: dataclasses.replace(getattr(config, sub_config), **{field: value})}
    )
    assert config_digest(other) != config_digest(config)
    assert config_digest(dataclasses.replace(config, num_threads=config.num_threads + 1)) != config_digest(config)


def test_a_ready_stating_another_digest_is_refused(tiny_model_dir):
    digest = config_digest(tiny_config(tiny_model_dir))
    check_ready(EngineReady(engine_index=0, pid=1, num_kv_blocks=8, config_digest=digest), digest, "core")
    with pytest.raises(EngineStartupError, match="core runs another config than this frontend"):
        check_ready(EngineReady(engine_index=0, pid=1, num_kv_blocks=8, config_digest="f" * 64), digest, "core")
