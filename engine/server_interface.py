"""``EngineClient``: what the OpenAI server needs from an engine (vLLM's
``vllm.engine.protocol.EngineClient``). ``AsyncLLM`` implements it; the server
(engine/entrypoints/openai/) is written against this interface, never against AsyncLLM.

Besides the methods below, an engine client exposes, as attributes: ``config`` (the
EngineConfig), ``model_config``, ``input_processor`` (chat templates, sampling defaults) and
``renderer`` (the thread pool that tokenizes and detokenizes off the event loop).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, AsyncGenerator, Iterable, Optional, Union

if TYPE_CHECKING:
    from engine.config import EngineConfig, ModelConfig
    from engine.exceptions import EngineDeadError
    from engine.frontend.input_processor import InputProcessor, PromptType
    from engine.frontend.renderer import Renderer
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams


class EngineClient(ABC):
    config: EngineConfig
    model_config: ModelConfig
    input_processor: InputProcessor
    renderer: Renderer

    @property
    @abstractmethod
    def is_running(self) -> bool: ...

    @property
    @abstractmethod
    def is_stopped(self) -> bool: ...

    @property
    @abstractmethod
    def errored(self) -> bool: ...

    @property
    @abstractmethod
    def dead_error(self) -> EngineDeadError: ...

    @abstractmethod
    def generate(
        self, prompt: PromptType, sampling_params: SamplingParams, request_id: str, **kwargs: Any
    ) -> AsyncGenerator[RequestOutput, None]:
        """The request's outputs until it finishes; closing the generator aborts it."""

    @abstractmethod
    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Each request's generator yields a last output finished with "abort" and ends."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raises EngineDeadError once the engine cannot serve."""

    @abstractmethod
    async def get_tokenizer(self) -> Any: ...

    @abstractmethod
    async def get_model_config(self) -> ModelConfig: ...

    @abstractmethod
    async def get_vllm_config(self) -> EngineConfig: ...

    @abstractmethod
    async def get_stats(self) -> list[dict[str, Any]]:
        """Each EngineCore's totals (engine/core/engine_core.py get_stats), one per rank."""

    @abstractmethod
    def add_stat_logger(self, stat_logger: Any) -> None:
        """Hand ``stat_logger.record(scheduler_stats, iteration_stats, engine_idx)`` each outputs
        message's stats (engine/stat_loggers.py); the server's /metrics is fed this way."""

    @abstractmethod
    async def reset_prefix_cache(self) -> bool: ...

    @abstractmethod
    async def add_lora(self, lora_request: Any) -> bool:
        """Load and check a LoRA adapter (engine/lora/); ValueError naming what is wrong."""

    @abstractmethod
    async def remove_lora(self, lora_id: int) -> bool: ...

    @abstractmethod
    async def collective_rpc(
        self, method: str, timeout: Optional[float] = None, args: tuple = (), kwargs: Optional[dict] = None
    ) -> list: ...

    @abstractmethod
    def shutdown(self, timeout: Optional[float] = None) -> None: ...
