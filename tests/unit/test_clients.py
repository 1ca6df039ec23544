"""The shape of the client layer and of the process boundary: each client has an explicit
interface, no client imports the factory (or another client that imports it back), and the
core's entry module never imports the frontend's launcher."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from engine.client import AsyncEngineCoreClient, EngineCoreClient, InprocClient, make_client
from engine.client.dp_client import DPLBAsyncMPClient
from engine.client.mp_client import AsyncMPClient, SyncMPClient


def imported_modules(module: str) -> set[str]:
    """Every ``engine.*`` module that ``module`` imports, at its top or inside a function."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("engine.")}


def test_every_client_implements_its_interface():
    assert issubclass(InprocClient, EngineCoreClient) and issubclass(SyncMPClient, EngineCoreClient)
    for cls in (AsyncMPClient, DPLBAsyncMPClient):
        assert issubclass(cls, AsyncEngineCoreClient) and not cls.__abstractmethods__


def test_asyncio_without_multiprocessing_is_not_implemented():
    with pytest.raises(NotImplementedError):
        make_client(multiprocess_mode=False, asyncio_mode=True, config=None)


def test_no_client_module_imports_the_factory_or_a_module_that_imports_it_back():
    clients = ["engine.client.core_client", "engine.client.mp_client", "engine.client.dp_client"]
    graph = {m: imported_modules(m) & set(clients + ["engine.client.factory"]) for m in clients}
    assert graph == {
        "engine.client.core_client": set(),
        "engine.client.mp_client": {"engine.client.core_client"},
        "engine.client.dp_client": {"engine.client.mp_client"},
    }


def test_the_core_process_side_never_imports_the_frontend_side():
    core_side = imported_modules("engine.core.engine_core_proc")
    assert not any(m.startswith("engine.client") for m in core_side)
    # what both sides share at launch lives in one module, which each of them imports
    assert "engine.core.launch" in core_side and "engine.core.launch" in imported_modules("engine.client.core_launcher")
    assert "engine.core.engine_core_proc" not in imported_modules("engine.client.core_launcher")
