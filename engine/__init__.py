"""ringllm's public API, with vLLM's names: code written for vLLM ports by changing one import.

The names resolve on first use (PEP 562): ``import engine`` imports neither torch nor aiohttp
nor the frontend, and changes nothing in the importing program (no environment variable, no log
handler). The EngineCore process imports ``engine.core`` alone and so never loads the frontend.
OpenMP's defaults are set where torch is first imported (``engine.torch_env``), logging by the
entry points (``engine.logging_setup``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS = {
    "LLM": "engine.llm",
    "AsyncLLM": "engine.async_llm",
    "LLMEngine": "engine.llm_engine",
    "EngineArgs": "engine.config",
    "AsyncEngineArgs": "engine.config",
    "TextPrompt": "engine.frontend.input_processor",
    "TokensPrompt": "engine.frontend.input_processor",
    "CompletionOutput": "engine.outputs",
    "EmbeddingRequestOutput": "engine.outputs",
    "ClassificationRequestOutput": "engine.outputs",
    "ScoringRequestOutput": "engine.outputs",
    "Logprob": "engine.outputs",
    "PoolingRequestOutput": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "PoolingParams": "engine.pooling_params",
    "BeamSearchParams": "engine.sampling_params",
    "RequestOutputKind": "engine.sampling_params",
    "SamplingParams": "engine.sampling_params",
    "StructuredOutputsParams": "engine.sampling_params",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from engine.async_llm import AsyncLLM
    from engine.config import AsyncEngineArgs, EngineArgs
    from engine.frontend.input_processor import TextPrompt, TokensPrompt
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine
    from engine.outputs import (
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingRequestOutput,
        Logprob,
        PoolingRequestOutput,
        RequestOutput,
        ScoringRequestOutput,
    )
    from engine.pooling_params import PoolingParams
    from engine.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, StructuredOutputsParams
