"""The package's import shape: ``import engine`` is free (no torch, no aiohttp, no side
effects), the EngineCore process never loads the frontend, and no two modules of ``engine/``
import each other (an import circle makes the import order matter and hides which layer is below
which). A function-level import counts as much as one at the top: it only moves the circle to
run time. ``ALLOWED_DEFERRED`` names the few that exist to delay loading torch."""

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
        "                  'handlers': [len(logging.getLogger(n).handlers) for n in ('engine', 'shm_transport')]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT
        ).stdout
    )
    heavy = [m for m in out["modules"] if m.split(".")[0] in ("torch", "aiohttp", "transformers", "numpy")]
    assert heavy == []
    assert not out["env_changed"], "import engine must not set environment variables"
    assert out["handlers"] == [0, 0], "import engine must not install log handlers"
    # the public names still resolve, on first use
    names = subprocess.run(
        [sys.executable, "-c", "import engine; print(all(getattr(engine, n) for n in engine.__all__))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert names.strip() == "True"


def test_a_real_core_imports_no_frontend_module(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, worker_cls="tests.helpers.modules_worker.ModulesWorker", **TINY)
    try:
        (modules,) = llm.collective_rpc("loaded_modules")
    finally:
        llm.shutdown()
    assert "engine.core.engine_core" in modules  # it is the core's view
    frontend = [
        m
        for m in modules
        if m.startswith(
            (
                "engine.entrypoints",
                "engine.frontend",
                "engine.llm",
                "engine.async_llm",
                "engine.llm_engine",
                "engine.client",
            )
        )
        or m.split(".")[0] == "aiohttp"
    ]
    assert frontend == []
    assert "tests.helpers.modules_worker" in modules  # the report came from the worker asked for


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _imported_names(node: ast.Import | ast.ImportFrom, package: str) -> set[str]:
    """The dotted names an import statement in ``package`` reads: the module and, for ``from m
    import x``, ``m.x`` too (x may be a submodule)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return {base} | {f"{base}.{alias.name}" for alias in node.names}


def _engine_imports(name: str, path: str, known: set[str]) -> tuple[set[str], set[str]]:
    """The engine modules ``name`` imports, as (module level, deferred): module level when it is
    itself imported (statements outside functions), deferred when one of its functions runs. Imports
    under ``if TYPE_CHECKING`` are neither: they never run."""
    tree = ast.parse(open(path).read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: dict[bool, set[str]] = {False: set(), True: set()}
    stack: list[tuple[ast.AST, bool]] = [(node, False) for node in tree.body]
    while stack:
        node, deferred = stack.pop()
        deferred = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend((child, deferred) for child in node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found[deferred].update(_imported_names(node, package))
        stack.extend((child, deferred) for child in ast.iter_child_nodes(node))
    # Importing a.b.c imports its packages a and a.b first, which are edges too, except the
    # packages above ``name`` itself: Python began importing those before ``name``, and a path
    # through them reads nothing of theirs. Naming one explicitly (``from engine import envs``)
    # does read its namespace, and stays an edge.
    parts = name.split(".")
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}

    def closed(modules: set[str]) -> set[str]:
        out = set(modules)
        for module in modules:
            parts = module.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) not in ancestors)
        return {m for m in out if m in known and m != name}

    module_level = closed(found[False])
    return module_level, closed(found[True]) - module_level


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` as a path a -> ... -> a, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
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


# Deferred (function-level) imports that the circle check leaves out, each with its reason. Only an
# import that exists to delay loading torch (or another heavy library) belongs here; a deferred
# import that merely hides a circle is a circle, and the test names it.
ALLOWED_DEFERRED = {
    (
        "engine.worker.worker",
        "engine.worker.model_runner",
    ): "delays torch: the frontend imports engine.worker to check a worker_cls, and must not load torch",
}


def _engine_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every module of ``engine/`` with the engine modules it imports: (module level, deferred)."""
    paths = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "engine")):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                paths[_module_name(path)] = path
    known = set(paths)
    module_level, deferred = {}, {}
    for name, path in paths.items():
        module_level[name], deferred[name] = _engine_imports(name, path, known)
    return module_level, deferred


def test_imports_are_read_as_module_level_deferred_or_never_run(tmp_path):
    (tmp_path / "pkg").mkdir()
    for name in ("__init__", "a", "b", "c", "d"):
        (tmp_path / "pkg" / f"{name}.py").write_text("")
    path = tmp_path / "pkg" / "a.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nfrom pkg import b\nif TYPE_CHECKING:\n    import pkg.d\n"
        "def f():\n    from pkg.c import x\n"
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    assert _engine_imports("pkg.a", str(path), known) == ({"pkg", "pkg.b"}, {"pkg.c"})


def test_allowed_deferred_imports_exist_and_say_why():
    """An entry whose import is gone is stale: drop it (the lead does, at merge)."""
    _, deferred = _engine_graph()
    for (importer, imported), reason in ALLOWED_DEFERRED.items():
        assert imported in deferred[importer], f"{importer} no longer defers importing {imported}: drop the entry"
        assert len(reason) > 20


def test_no_import_circle_among_engine_modules_deferred_imports_included():
    module_level, deferred = _engine_graph()
    assert module_level["engine.llm"], "the graph builder found no imports at all"
    assert deferred["engine.worker.worker"], "the graph builder found no deferred imports"
    graph = {
        name: module_level[name] | {m for m in deferred[name] if (name, m) not in ALLOWED_DEFERRED}
        for name in module_level
    }
    cycle = find_cycle(graph)
    assert cycle == [], (
        f"import circle {' -> '.join(cycle)}; deferred edges in it: "
        f"{[(a, b) for a, b in zip(cycle, cycle[1:]) if b in deferred[a]]} "
        f"({sum(map(len, deferred.values()))} deferred imports between engine modules in all)"
    )
