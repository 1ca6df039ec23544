"""The package's import shape: ``import engine`` is free (no torch, no aiohttp, no side
effects), the EngineCore process never loads the frontend, and no two modules of ``engine/``
import each other at module level (an import circle makes the import order matter and hides
which layer is below which)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from engine import LLM
from tests.helpers.engine_utils import TINY
from tests.helpers import ROOT


def test_import_engine_loads_no_torch_no_aiohttp_and_changes_nothing():
    code = (
        "import json, logging, os, sys\n"
        "before = dict(os.environ)\n"
        "import engine\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'env_changed': dict(os.environ) != before,\n"
        "                  'handlers': [len(logging.getLogger(n).handlers) for n in ('engine', 'shm_transport')]}))\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    env=env, cwd=ROOT).stdout)
    heavy = [m for m in out["modules"] if m.split(".")[0] in ("torch", "aiohttp", "transformers", "numpy")]
    assert heavy == []
    assert not out["env_changed"], "import engine must not set environment variables"
    assert out["handlers"] == [0, 0], "import engine must not install log handlers"
    # the public names still resolve, on first use
    names = subprocess.run([sys.executable, "-c",
                            "import engine; print(all(getattr(engine, n) for n in engine.__all__))"],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert names.strip() == "True"


def test_a_real_core_imports_no_frontend_module(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, worker_cls="tests.helpers.modules_worker.ModulesWorker", **TINY)
    try:
        (modules,) = llm.collective_rpc("loaded_modules")
    finally:
        llm.shutdown()
    assert "engine.core.engine_core" in modules  # it is the core's view
    frontend = [m for m in modules if m.startswith(("engine.entrypoints", "engine.frontend", "engine.llm",
                                                    "engine.async_llm", "engine.llm_engine", "engine.client"))
                or m.split(".")[0] == "aiohttp"]
    assert frontend == []
    assert "tests.helpers.modules_worker" in modules  # the report came from the worker asked for


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _module_level_imports(name: str, path: str, known: set[str]) -> set[str]:
    """The engine modules ``name`` imports when it is itself imported: statements outside
    functions, and not under ``if TYPE_CHECKING``."""
    tree = ast.parse(open(path).read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    # Importing a.b.c imports its packages a and a.b first, which are edges too, except the
    # packages above ``name`` itself: Python began importing those before ``name``, and a path
    # through them reads nothing of theirs. Naming one explicitly (``from engine import envs``)
    # does read its namespace, and stays an edge.
    parts = name.split(".")
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
    closed = set(found)
    for module in found:
        parts = module.split(".")
        closed.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) not in ancestors)
    return {m for m in closed if m in known and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` as a path a -> ... -> a, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_find_cycle_sees_a_circle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_among_engine_modules():
    paths = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "engine")):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                paths[_module_name(path)] = path
    known = set(paths)
    graph = {name: _module_level_imports(name, path, known) for name, path in paths.items()}
    assert graph["engine.llm"], "the graph builder found no imports at all"
    assert find_cycle(graph) == []
