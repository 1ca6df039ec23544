"""The model's default thread count (engine/thread_policy.py): every core for a model whose
weights make a decode step long, all but one otherwise; explicit settings win. Weight files are
sparse (their size without their bytes)."""

from __future__ import annotations

import os

import pytest

from engine.thread_policy import (
    LONG_STEP_WEIGHT_BYTES,
    default_num_threads,
    model_threads,
    model_weight_bytes,
    threads_adapt,
)

CORES = os.cpu_count() or 2


def _sparse(path, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


@pytest.fixture(autouse=True)
def _no_thread_override(monkeypatch):
    monkeypatch.delenv("RINGLLM_NUM_THREADS", raising=False)


def test_a_large_gguf_gets_every_core_and_a_small_one_leaves_one(tmp_path):
    large = _sparse(tmp_path / "large.gguf", LONG_STEP_WEIGHT_BYTES)
    small = _sparse(tmp_path / "small.gguf", LONG_STEP_WEIGHT_BYTES - 1)
    assert model_threads(None, large) == CORES
    assert model_threads(None, small) == max(1, CORES - 1)


def test_a_sync_frontend_gives_every_model_every_core(tmp_path):
    """LLM's caller waits while the core steps: no frontend work to leave a core for."""
    small = _sparse(tmp_path / "small.gguf", LONG_STEP_WEIGHT_BYTES - 1)
    assert model_threads(None, small, sync_frontend=True) == CORES
    assert default_num_threads(None, sync_frontend=True) == CORES
    assert model_threads(1, small, sync_frontend=True) == 1  # given: kept


def test_an_hf_directory_counts_its_weight_files(tmp_path):
    for i in range(2):
        _sparse(tmp_path / f"model-0000{i}.safetensors", LONG_STEP_WEIGHT_BYTES // 2)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_weight_bytes(str(tmp_path)) == LONG_STEP_WEIGHT_BYTES // 2 * 2
    assert default_num_threads(str(tmp_path)) == CORES


def test_the_default_model_and_unknown_paths_leave_a_core_to_the_frontend(tmp_path):
    assert default_num_threads(None) == default_num_threads("HuggingFaceTB/SmolLM2-135M-Instruct") == max(1, CORES - 1)
    assert model_weight_bytes(str(tmp_path / "missing.gguf")) == 0


def test_explicit_settings_win_over_the_model_size(tmp_path, monkeypatch):
    large = _sparse(tmp_path / "large.gguf", LONG_STEP_WEIGHT_BYTES)
    assert model_threads(1, large) == 1
    monkeypatch.setenv("RINGLLM_NUM_THREADS", "3")
    assert model_threads(None, large) == 3


def test_only_the_engines_own_default_above_one_thread_adapts(monkeypatch):
    assert threads_adapt(None, 2)
    assert not threads_adapt(None, 1)  # nothing to choose from
    assert not threads_adapt(2, 2)  # the user's count is kept
    monkeypatch.setenv("RINGLLM_NUM_THREADS", "2")
    assert not threads_adapt(None, 2)
