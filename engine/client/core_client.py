"""The seam between the frontend (LLMEngine, AsyncLLM) and the EngineCore.

The frontend talks to the core only through ``EngineCoreClient``; ``make_client`` picks
where the core lives. In this process (``InprocClient``) a call is a method call and
``get_output`` runs one step. Behind the shared-memory ring (SyncMP/AsyncMP clients) the
same calls become messages; the frontend's code does not change.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable

from engine.config import EngineConfig
from engine.protocol import EngineCoreOutputs, EngineCoreRequest


class EngineCoreClient(ABC):
    @staticmethod
    def make_client(multiprocess_mode: bool, asyncio_mode: bool, config: EngineConfig) -> "EngineCoreClient":
        if asyncio_mode:  # AsyncLLM: always a core process (or several, data parallel)
            from engine.client.dp_client import make_async_mp_client

            return make_async_mp_client(config)
        if multiprocess_mode:
            from engine.client.mp_client import SyncMPClient

            return SyncMPClient(config)
        return InprocClient(config)

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None: ...

    @abstractmethod
    def abort_requests(self, request_ids: Iterable[str]) -> None: ...

    @abstractmethod
    def get_output(self) -> EngineCoreOutputs:
        """The next outputs of the core (in-process: the result of one step)."""

    @abstractmethod
    def call_utility(self, method: str, *args: Any) -> Any:
        """Call an EngineCore utility method (reset_prefix_cache, get_stats, ...) by name."""

    @abstractmethod
    def shutdown(self) -> None: ...


class InprocClient(EngineCoreClient):
    def __init__(self, config: EngineConfig) -> None:
        from engine.core.engine_core import EngineCore

        self.engine_core = EngineCore(config)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()

    def call_utility(self, method: str, *args: Any) -> Any:
        return getattr(self.engine_core, method)(*args)

    def shutdown(self) -> None:
        self.engine_core.shutdown()
