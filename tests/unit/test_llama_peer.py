"""The llama.cpp peer's command and tree lookup, and the realistic model's shape (no llama.cpp
needed); one end-to-end start of llama-server on a tiny GGUF where a llama.cpp build exists."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from benchmarks import peer_llama_server as peer
from benchmarks import realistic_models


def _fake_tree(root, name: str) -> str:
    tree = os.path.join(root, name)
    os.makedirs(os.path.join(tree, "build", "bin"))
    for binary in peer.BINARIES:
        path = peer.binary(tree, binary)
        open(path, "w").close()
        os.chmod(path, 0o755)
    return tree


def test_server_command_serves_loopback_slots_on_one_unified_cache():
    cmd = peer.server_command("/t", "/m.gguf", threads=2, parallel=64, ctx=24576, port=4321)
    assert cmd[0] == "/t/build/bin/llama-server"

    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert (value("-m"), value("-np"), value("-c")) == ("/m.gguf", "64", "24576")
    assert value("-t") == value("-tb") == "2"
    assert (value("--host"), value("--port")) == ("127.0.0.1", "4321")
    assert "--kv-unified" in cmd and "--no-webui" in cmd


@pytest.mark.parametrize("field", ["threads", "parallel", "ctx"])
def test_server_command_refuses_a_nonpositive_size(field):
    sizes = {"threads": 1, "parallel": 1, "ctx": 512, field: 0}
    with pytest.raises(ValueError, match="positive"):
        peer.server_command("/t", "/m.gguf", port=1, **sizes)


def test_env_dir_without_binaries_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGLLM_LLAMA_CPP_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="RINGLLM_LLAMA_CPP_DIR"):
        peer.find_llama_cpp(build=False)


def test_env_dir_wins_over_the_cache(tmp_path, monkeypatch):
    chosen = _fake_tree(tmp_path, "mine")
    monkeypatch.setenv("RINGLLM_CACHE", str(tmp_path / "cache"))
    _fake_tree(tmp_path / "cache", "llama.cpp-9.0.0")
    monkeypatch.setenv("RINGLLM_LLAMA_CPP_DIR", chosen)
    assert peer.find_llama_cpp(build=False) == chosen


def test_newest_complete_cached_build_is_found_without_building(tmp_path, monkeypatch):
    monkeypatch.delenv("RINGLLM_LLAMA_CPP_DIR", raising=False)
    monkeypatch.setenv("RINGLLM_CACHE", str(tmp_path))
    assert peer.find_llama_cpp(build=False) is None
    _fake_tree(tmp_path, "llama.cpp-9.0.0")
    newest = _fake_tree(tmp_path, "llama.cpp-10.0.0")
    os.makedirs(tmp_path / "llama.cpp-11.0.0" / "build" / "bin")  # an unfinished build: skipped
    assert peer.find_llama_cpp(build=False) == newest


def test_realistic_shape_has_the_counted_parameters(tmp_path):
    """The config the builder writes makes a Llama of ``parameter_count()`` parameters, 1.56B."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.models.default_model import write_tiny_model

    config = AutoConfig.from_pretrained(write_tiny_model(str(tmp_path), **realistic_models.SHAPE))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (2048, 8192, 24)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (32, 8, 49152)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == realistic_models.parameter_count()
    assert round(realistic_models.parameter_count() / 1e9, 2) == 1.56


def test_gguf_path_refuses_an_unknown_quant():
    with pytest.raises(ValueError, match="Q4_0"):
        realistic_models.gguf_path("Q3_K_XS")


@pytest.mark.slow
def test_llama_server_answers_a_completion_on_a_converted_tiny_model(tmp_path):
    """convert_hf_to_gguf.py on a tiny random Llama, then llama-server on it (skips without a
    llama.cpp build: RINGLLM_LLAMA_CPP_DIR or one in the cache)."""
    if peer.find_llama_cpp(build=False) is None:
        pytest.skip("no llama.cpp build (set RINGLLM_LLAMA_CPP_DIR or run `python -m benchmarks.realistic_models`)")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.models.default_model import write_tiny_model

    hf = write_tiny_model(str(tmp_path / "hf"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf)).save_pretrained(hf)
    gguf = realistic_models.convert_to_gguf(hf, str(tmp_path / "tiny.gguf"))
    url, process = peer.start_llama_server(gguf, threads=1, parallel=2, ctx=512, log_path=str(tmp_path / "server.log"))
    try:
        body = json.dumps({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            reply = json.load(resp)
        assert reply["usage"]["completion_tokens"] == 4
    finally:
        peer.stop_server(process)
