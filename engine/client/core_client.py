"""The seam between the frontend (LLMEngine, AsyncLLM) and the EngineCore: the two client
interfaces, and the in-process client.

The frontend talks to the core only through a client; ``engine.client.factory.make_client``
picks where the core lives. ``EngineCoreClient`` is the synchronous interface (LLMEngine):
in this process (``InprocClient``) a call is a method call and ``get_output`` runs one
step; behind the ring (``SyncMPClient``) the same calls become messages.
``AsyncEngineCoreClient`` is the asyncio interface (AsyncLLM), always over the ring
(``AsyncMPClient`` and its data-parallel kinds). Implementations import this module; it
imports none of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable, Optional

from engine.config import EngineConfig
from engine.exceptions import EngineDeadError, EngineShutdownError
from engine.torch_env import prepare_torch_env
from engine.wire_messages import EngineCoreOutputs, EngineCoreRequest, EngineReady


class EngineCoreClient(ABC):
    """Synchronous client (vLLM's ``EngineCoreClient``)."""

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
    def begin_shutdown(self) -> None:
        """From any thread: a call blocked in the thread that uses the client returns at once,
        and every call from now on raises ``EngineShutdownError`` (unless the engine died
        first); aborts are dropped. That thread then lets go of the client, and ``shutdown``
        stops the core (the client itself is used by one thread at a time: LLM's lock)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the core; later calls raise ``EngineShutdownError``."""


class AsyncEngineCoreClient(ABC):
    """Asyncio client (the ``*_async`` half of vLLM's client): the core runs in its own
    process(es). Once the engine is dead every call raises ``EngineDeadError``."""

    @property
    @abstractmethod
    def ready(self) -> EngineReady:
        """The (first) core's handshake: KV blocks, model limits, pid."""

    @property
    @abstractmethod
    def dead_error(self) -> Optional[EngineDeadError]:
        """Why the engine is dead, or None while it serves."""

    @abstractmethod
    async def get_outputs_async(self) -> list[EngineCoreOutputs]:
        """Every OUTPUTS message that has arrived from any core (at least one), in each core's order."""

    def requests_finished(self, request_ids: list[str]) -> None:
        """The output processor has the core's last output of these requests (the data-parallel
        balancer counts them off its ranks; one core has nothing to count)."""

    @abstractmethod
    async def add_request_async(self, request: EngineCoreRequest, data_parallel_rank: Optional[int] = None) -> None:
        """Send a request; ``data_parallel_rank`` (one of this client's ranks, checked by the
        caller) picks the core that runs it, else the client chooses."""

    @abstractmethod
    def abort_requests_nowait(self, request_ids: list[str]) -> None:
        """Abort without awaiting (usable from a cancellation handler), ordered with the sends."""

    @abstractmethod
    async def call_utility_async(self, method: str, *args: Any, engine_index: int = 0) -> Any: ...

    @abstractmethod
    def shutdown(self, timeout: float = 5.0) -> None: ...


class InprocClient(EngineCoreClient):
    def __init__(self, config: EngineConfig) -> None:
        prepare_torch_env()  # the model runs in this process: before its first torch import
        from engine.core.engine_core import EngineCore

        self.engine_core = EngineCore(config)
        self._shut_down: Optional[EngineShutdownError] = None

    def _check(self) -> None:
        if self._shut_down is not None:
            raise self._shut_down

    def add_request(self, request: EngineCoreRequest) -> None:
        """``request`` comes from this process's input processor, whose admission verified its
        params (the frontend's one verification): the core checks it against the model's limits
        and does not verify the params again."""
        self._check()
        self.engine_core.add_request(request, params_verified=True)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        if request_ids and self._shut_down is None:
            self.engine_core.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        self._check()  # a step is short: the next call notices a shutdown
        return self.engine_core.step()

    def call_utility(self, method: str, *args: Any) -> Any:
        self._check()
        return getattr(self.engine_core, method)(*args)

    def begin_shutdown(self) -> None:
        if self._shut_down is None:
            self._shut_down = EngineShutdownError(EngineShutdownError.RUNNING)

    def shutdown(self) -> None:
        self.begin_shutdown()
        self.engine_core.shutdown()
        self._shut_down = EngineShutdownError()
