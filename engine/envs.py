"""Every environment variable ringllm reads, parsed in this one module.

Read lazily through module attributes (``envs.RINGLLM_CACHE``) so a test or a
launcher can set a variable after import and still be heard.
"""

from __future__ import annotations

import os
from typing import Any, Callable


def _bool(name: str, default: str) -> Callable[[], bool]:
    return lambda: os.environ.get(name, default).strip().lower() not in ("0", "false", "no", "off", "")


def _int(name: str, default: int) -> Callable[[], int]:
    return lambda: int(os.environ.get(name, default))


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("RINGLLM_CACHE") or os.path.join(base, "ringllm")


_VARS: dict[str, Callable[[], Any]] = {
    # Where the default model is converted to an HF directory (once).
    "RINGLLM_CACHE": _cache_dir,
    # 0: LLM runs the EngineCore in-process (like VLLM_ENABLE_V1_MULTIPROCESSING=0).
    "RINGLLM_ENABLE_MULTIPROCESSING": _bool("RINGLLM_ENABLE_MULTIPROCESSING", "1"),
    # Outputs processed per slice by AsyncLLM's output handler before yielding to the loop.
    "RINGLLM_OUTPUT_PROC_CHUNK_SIZE": _int("RINGLLM_OUTPUT_PROC_CHUNK_SIZE", 128),
    # torch intra-op threads in the process that runs the model; 0 = the measured default.
    "RINGLLM_NUM_THREADS": _int("RINGLLM_NUM_THREADS", 0),
    # Seconds the frontend waits for the EngineCore's READY handshake.
    "RINGLLM_ENGINE_READY_TIMEOUT_S": _int("RINGLLM_ENGINE_READY_TIMEOUT_S", 600),
    # The API key of `ringllm serve` (vLLM's name), read when neither --api-key nor
    # --api-key-file is given; serve removes it from the environment its EngineCore inherits.
    "VLLM_API_KEY": lambda: os.environ.get("VLLM_API_KEY") or None,
    # A llama.cpp source tree with llama-server, llama-bench and llama-quantize built under build/bin
    # (the benchmarks' llama.cpp peer); unset: found or built under RINGLLM_CACHE/peers.
    "RINGLLM_LLAMA_CPP_DIR": lambda: os.environ.get("RINGLLM_LLAMA_CPP_DIR") or None,
    # vLLM's: /v1/load_lora_adapter and /v1/unload_lora_adapter exist only when true.
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": _bool("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0"),
    # Logging level of the ``engine`` and ``shm_transport`` loggers.
    "RINGLLM_LOGGING_LEVEL": lambda: os.environ.get("RINGLLM_LOGGING_LEVEL", "INFO").upper(),
}


def __getattr__(name: str) -> Any:
    if name in _VARS:
        return _VARS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(_VARS)
