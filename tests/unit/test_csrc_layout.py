"""csrc/'s layout: the ring (csrc/ring/) and the CPU kernels (csrc/cpu/) never include each
other, neither their includes nor the calls between their .c files form a circle, and every
kernel source compiles clean under the build's flags."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _includes(folder: str) -> dict[str, set[str]]:
    """Each file of csrc/<folder> -> the quoted headers it includes."""
    path = os.path.join(CSRC, folder)
    graph = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name)) as f:
            graph[name] = set(_INCLUDE.findall(f.read()))
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of includes, or [] (a depth-first search for a back edge)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else path + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return []

    for start in graph:
        if start not in state and (found := visit(start, [start])):
            return found
    return []


@pytest.mark.parametrize("folder", ["ring", "cpu"])
def test_includes_stay_in_their_folder(folder):
    graph = _includes(folder)
    outside = {f"{name} -> {h}" for name, headers in graph.items() for h in headers if h not in graph}
    assert not outside


@pytest.mark.parametrize("folder", ["ring", "cpu"])
def test_includes_form_no_circle(folder):
    assert _circle(_includes(folder)) == []


def test_circle_finder_finds_a_circle():
    assert _circle({"a.c": {"a.h"}, "a.h": {"b.h"}, "b.h": {"a.h"}}) == ["a.h", "b.h", "a.h"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_cpu_kernel_sources_compile_without_warnings():
    folder = os.path.join(CSRC, "cpu")
    srcs = [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".c")]
    res = subprocess.run(
        ["gcc", "-std=gnu11", "-O2", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *srcs],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


def _calls(folder: str, out_dir) -> dict[str, set[str]]:
    """Each .c of csrc/<folder> -> the .c files defining the symbols it uses (from nm)."""
    path = os.path.join(CSRC, folder)
    defined, used = {}, {}
    for name in sorted(n for n in os.listdir(path) if n.endswith(".c")):
        obj = os.path.join(out_dir, name + ".o")
        subprocess.run(["gcc", "-std=gnu11", "-O0", "-c", os.path.join(path, name), "-o", obj], check=True)
        rows = [
            line.split()
            for line in subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout.splitlines()
        ]
        defined.update({r[-1]: name for r in rows if len(r) == 3 and r[1] in "TDBR"})
        used[name] = {r[-1] for r in rows if len(r) == 2 and r[0] == "U"}
    return {name: {defined[s] for s in syms if s in defined} - {name} for name, syms in used.items()}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None, reason="no gcc or nm")
@pytest.mark.parametrize("folder", ["ring", "cpu"])
def test_sources_call_each_other_in_no_circle(folder, tmp_path):
    """quant_gemv.c once called quant_kquants.c, which called back for quant_gemv.c's scratch
    and block sizes: shared helpers live in files of their own (quant_scratch.c, quant_types.c)."""
    calls = _calls(folder, tmp_path)
    assert calls["quant_gemv.c" if folder == "cpu" else "producer.c"]  # the graph is not empty
    assert _circle(calls) == []
