"""Shared pytest fixtures and markers (several engineers append here: keep each part small)."""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "model: runs the real default model (slower; deselect with -m 'not model')")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The tiny dummy-weight Llama (2 layers, hidden 64) with the default model's tokenizer."""
    from engine.models.default_model import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))
