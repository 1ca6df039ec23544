"""ringllm's public API, with vLLM's names: code written for vLLM ports by changing one import.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless the user chose a policy) before anything here can
import torch: OpenMP threads that spin while waiting make a decode step many times slower
whenever another process takes a core (docs/ARCHITECTURE.md, "Threads on a small CPU").
"""
import logging
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine import envs  # noqa: E402
from engine.async_llm import AsyncLLM  # noqa: E402
from engine.config import AsyncEngineArgs, EngineArgs  # noqa: E402
from engine.frontend.input_processor import TextPrompt, TokensPrompt  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.outputs import (CompletionOutput, EmbeddingRequestOutput, Logprob, PoolingRequestOutput,  # noqa: E402
                            RequestOutput)
from engine.pooling_params import PoolingParams  # noqa: E402
from engine.sampling_params import (BeamSearchParams, RequestOutputKind, SamplingParams,  # noqa: E402
                                    StructuredOutputsParams)


def _configure_logging() -> None:
    """One handler for ringllm's loggers (as vLLM does), unless the application set its own."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                           "%m-%d %H:%M:%S"))
    for name in ("engine", "shm_transport"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.setLevel(envs.RINGLLM_LOGGING_LEVEL)


_configure_logging()

__all__ = ["LLM", "AsyncLLM", "LLMEngine", "SamplingParams", "BeamSearchParams", "RequestOutputKind", "EngineArgs",
           "AsyncEngineArgs", "RequestOutput", "CompletionOutput", "Logprob", "TextPrompt", "TokensPrompt",
           "PoolingParams", "PoolingRequestOutput", "EmbeddingRequestOutput", "StructuredOutputsParams"]
