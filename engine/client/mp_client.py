"""Clients of an EngineCore in another process: ``SyncMPClient`` (LLM) and ``AsyncMPClient``
(AsyncLLM), both over one channel per core (the shm ring by default, zmq as baseline).

Who gives way (docs/ARCHITECTURE.md): the core never blocks on a full output ring, so the frontend
may block on a full request ring, but only while still taking outputs: the sync client
drains outputs between send attempts and the async client waits for space in a task on
the event loop, while the output handler keeps pulling outputs.

Liveness: every wait is bounded by the peer's pidfd (the sync channel checks it on each
wait timeout; the async client registers it with ``loop.add_reader``), so a core killed
with ``kill -9`` turns into ``EngineDeadError`` within a second, never a hang.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from collections import deque
from typing import Any, Optional

from engine.client.core_client import AsyncEngineCoreClient, EngineCoreClient
from engine.client.core_launcher import CoreProcess, close_cores, start_cores, wait_cores
from engine.client.sigint_guard import SigintGuard
from engine.config import EngineConfig
from engine.exceptions import EngineDeadError, EngineShutdownError
from engine.wire_messages import (
    AbortRequests,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineDead,
    EngineReady,
    UtilityCall,
    UtilityResult,
)
from shm_transport import TransportError

logger = logging.getLogger(__name__)

# How long a core that reported its death may take to exit before it is killed: it exits
# right after ENGINE_DEAD, so only a machine under heavy load needs more than moments.
_DEAD_CORE_EXIT_S = 30.0


class SyncMPClient(EngineCoreClient):
    """For ``LLM``/``LLMEngine``: one thread at a time, blocking (futex) reads with liveness
    checks; ``begin_shutdown`` alone may come from another thread (it wakes the wait)."""

    def __init__(self, config: EngineConfig, started: Optional[list[CoreProcess]] = None) -> None:
        """``started``: the core, already launched on ``config`` (it loads while the frontend
        reads the tokenizer); else it is launched here."""
        self._cores = wait_cores(started or start_cores(config, [0]), config)
        self._core = self._cores[0]
        self._finalizer = weakref.finalize(self, close_cores, self._cores)
        self._outputs: deque[EngineCoreOutputs] = deque()
        self._results: dict[int, UtilityResult] = {}
        self._call_ids = itertools.count()
        self._dead: Optional[EngineDeadError] = None
        self._guard = SigintGuard(self._core.channel.wakeup)

    @property
    def ready(self) -> EngineReady:
        return self._core.ready

    def _receive(self, timeout: Optional[float]) -> None:
        if self._dead is not None:
            raise self._dead
        try:
            batch = self._core.channel.recv_batch(timeout=timeout)
        except TransportError as e:
            raise self._die(f"{self._core.name} {self._core.exit_status()} ({type(e).__name__}: {e})") from None
        for msg in batch:
            if isinstance(msg, EngineCoreOutputs):
                self._outputs.append(msg)
            elif isinstance(msg, UtilityResult):
                self._results[msg.call_id] = msg
            elif isinstance(msg, EngineDead):
                # Not raised here: the outputs that came before it are handed out first (the
                # next wait, with nothing left to hand out, raises).
                self._die(msg.error)
                break
        self._guard.check()  # a Ctrl-C that woke the wait (sigint_guard.py), once the batch is kept

    def _die(self, cause: str) -> EngineDeadError:
        """The core is gone or going: reap it and free its rings now, not at shutdown (a dead
        core left unwaited stays a zombie for as long as this process lives). The first cause
        stands: a send that finds the channel closed after ENGINE_DEAD reports the core's own."""
        if self._dead is not None:
            return self._dead
        self._dead = EngineDeadError(cause)
        self._core.close(timeout=_DEAD_CORE_EXIT_S)
        return self._dead

    def _send(self, msg: Any) -> None:
        if self._dead is not None:
            raise self._dead
        channel = self._core.channel
        with self._guard:
            try:
                # A full request ring: keep taking outputs while the core catches up.
                while not channel.try_send(msg):
                    self._receive(timeout=0.001)
            except TransportError as e:
                raise self._die(f"{self._core.name} {self._core.exit_status()} ({type(e).__name__}: {e})") from None

    def get_output(self) -> EngineCoreOutputs:
        """The next OUTPUTS; EngineDeadError once the core is dead (after the outputs that
        arrived before)."""
        with self._guard:
            while not self._outputs:
                self._receive(timeout=None)
        return self._outputs.popleft()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and self._dead is None:
            self._send(AbortRequests(list(request_ids)))

    def call_utility(self, method: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        self._send(UtilityCall(call_id, method, list(args)))
        with self._guard:
            while call_id not in self._results:
                self._receive(timeout=None)
        return _utility_value(self._results.pop(call_id))

    def begin_shutdown(self) -> None:
        if self._dead is None:
            self._dead = EngineShutdownError(EngineShutdownError.RUNNING)
        self._core.channel.wakeup()  # a wait in progress returns; _receive then raises _dead

    def shutdown(self) -> None:
        if self._dead is None or isinstance(self._dead, EngineShutdownError):
            self._dead = EngineShutdownError()
        self._finalizer()


def _utility_value(result: UtilityResult) -> Any:
    if result.error is not None:
        raise RuntimeError(f"EngineCore utility call failed: {result.error}")
    return result.result


class AsyncMPClient(AsyncEngineCoreClient):
    """For ``AsyncLLM``: the core's channel is read on the event loop, woken through an
    eventfd (``loop.add_reader``); each core's pidfd is watched on the loop too.

    With one core, whoever awaits ``get_outputs_async`` (the output handler) reads the channel
    itself: no task or queue between the eventfd and the handler. A utility call made while
    nobody reads does the reading; one reader at a time, the others wait for its batch. With
    several cores (data parallel) one task per core reads. Work starts on first use inside a
    running loop, so the client can be built before the loop exists.
    """

    def __init__(self, config: EngineConfig, started: Optional[list[CoreProcess]] = None) -> None:
        self._cores = wait_cores(started or start_cores(config, config.parallel_config.frontend_engine_indices), config)
        self._finalizer = weakref.finalize(self, _close_async, self._cores)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._outputs: deque[EngineCoreOutputs] = deque()
        self._reading = False  # a coroutine is awaiting the (single) core's channel
        self._waiters: list[asyncio.Future] = []  # woken after each batch read
        self._readers: list[asyncio.Task] = []  # data parallel: one per core
        self._futures: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._pending: dict[int, deque] = {}  # per core: (message, future) waiting for ring space
        self._aborts: dict[CoreProcess, list[str]] = {}  # ids aborted this loop turn, per core
        self._dead: Optional[EngineDeadError] = None
        self._closing = False

    @property
    def ready(self) -> EngineReady:
        return self._cores[0].ready

    @property
    def dead_error(self) -> Optional[EngineDeadError]:
        return self._dead

    def _ensure_started(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        for core in self._cores:
            self._pending[core.engine_index] = deque()
            self._loop.add_reader(core.pidfd, self._on_core_exit, core)
            if len(self._cores) > 1:
                self._readers.append(self._loop.create_task(self._read_forever(core), name=f"read-{core.name}"))
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_async, self._cores, self._loop, self._readers)

    async def _read_forever(self, core: CoreProcess) -> None:
        while self._dead is None:
            await self._read_batch(core)

    async def _read_batch(self, core: CoreProcess) -> None:
        try:
            batch = await core.channel.recv_batch_async()
            self._dispatch(core, batch)
        except TransportError:
            self._on_core_lost(core)
        finally:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _until(self, done) -> None:
        """Return once ``done()`` holds, reading the channel when nobody else is."""
        self._ensure_started()
        while not done():
            if self._dead is not None:
                raise self._dead
            if self._readers or self._reading:
                fut = self._loop.create_future()
                self._waiters.append(fut)
                await fut
                continue
            self._reading = True
            try:
                await self._read_batch(self._cores[0])
            finally:
                self._reading = False

    def _dispatch(self, core: CoreProcess, batch: list) -> None:
        for msg in batch:
            if isinstance(msg, EngineCoreOutputs):
                self._outputs.append(msg)
            elif isinstance(msg, UtilityResult):
                fut = self._futures.pop(msg.call_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, EngineDead):
                self._fail(EngineDeadError(f"{core.name}: {msg.error}"))

    def _on_core_exit(self, core: CoreProcess) -> None:
        """The core's pidfd is readable: it has exited. Reap it at once (the wait cannot
        block), whether or not it said why first, then fail whatever still waits on it."""
        self._loop.remove_reader(core.pidfd)
        core.proc.wait()
        self._on_core_lost(core)

    def _on_core_lost(self, core: CoreProcess) -> None:
        """The core exited or its channel broke: the engine is dead (unless shutting down)."""
        if self._closing or self._dead is not None:
            return
        try:  # the core may have said why before it exited: read that first
            self._dispatch(core, core.channel.poll())
        except TransportError:
            pass
        self._fail(EngineDeadError(f"{core.name} {core.exit_status(wait=0.1)}"))

    def _fail(self, error: EngineDeadError) -> None:
        if self._dead is not None:
            return
        self._dead = error
        if not self._closing:
            logger.error("%s", error)
        waiting = list(self._futures.values())
        for pending in self._pending.values():
            waiting.extend(fut for _, fut in pending)
            pending.clear()
        self._futures.clear()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # nobody may be awaiting (an abort): no "never retrieved" warning
        self._wake_waiters()

    async def get_outputs_async(self) -> list[EngineCoreOutputs]:
        """Every OUTPUTS message that has arrived (at least one), in each core's order;
        EngineDeadError once the engine is dead (after the outputs that arrived before). All of
        them at once, so that the output processor can fold what a fast core sent while this
        process was busy (``OutputProcessor.fold``)."""
        await self._until(lambda: self._outputs)
        arrived = list(self._outputs)
        self._outputs.clear()
        return arrived

    def _send_nowait(self, core: CoreProcess, msg: Any) -> Optional[asyncio.Future]:
        """Send in order without blocking: at once when the ring has room and nothing waits
        before it; otherwise queued behind the others for a task that waits for space on the
        loop. Returns None when sent, else a future done when it is sent."""
        self._ensure_started()
        if self._dead is not None:
            raise self._dead
        if core in self._aborts:  # aborts made earlier in this turn go first
            self._send_aborts(core)
        pending = self._pending[core.engine_index]
        if not pending:
            try:
                if core.channel.try_send(msg):
                    return None
            except TransportError:
                self._on_core_lost(core)
                raise self._dead from None
        fut = self._loop.create_future()
        pending.append((msg, fut))
        if len(pending) == 1:
            self._loop.create_task(self._flush(core, pending))
        return fut

    async def _flush(self, core: CoreProcess, pending: deque) -> None:
        try:
            while pending:
                msg, fut = pending[0]
                await core.channel.send_async(msg)
                pending.popleft()
                if not fut.done():
                    fut.set_result(None)
        except TransportError:
            self._on_core_lost(core)

    async def _send(self, core: CoreProcess, msg: Any) -> None:
        fut = self._send_nowait(core, msg)
        if fut is not None:
            await fut

    async def add_request_async(self, request: EngineCoreRequest, data_parallel_rank: Optional[int] = None) -> None:
        await self._send(self._cores[0], request)  # one core: the rank can only be its own

    def abort_requests_nowait(self, request_ids: list[str]) -> None:
        """Abort without awaiting: usable from cancellation handlers. Every abort made in one
        turn of the event loop travels in one AbortRequests per core (an HTTP request that
        goes away cancels one stream per prompt; a thousand aborts are one message, not a
        thousand), sent at the end of the turn or before the next message to that core: still
        after every earlier send and before every later one, so an aborted id can be reused."""
        if not request_ids or self._dead is not None:
            return
        self._ensure_started()
        if not self._aborts:
            self._loop.call_soon(self._send_aborts)
        for core, ids in self._aborts_by_core(request_ids):
            self._aborts.setdefault(core, []).extend(ids)

    def _aborts_by_core(self, request_ids: list[str]) -> list[tuple[CoreProcess, list[str]]]:
        """Which core runs each request (the data-parallel balancer knows)."""
        return [(self._cores[0], list(request_ids))]

    def _send_aborts(self, core: Optional[CoreProcess] = None) -> None:
        """Send the aborts gathered so far, to every core or to ``core`` only."""
        for target in [core] if core is not None else list(self._aborts):
            ids = self._aborts.pop(target, None)
            if ids and self._dead is None:
                try:
                    self._send_nowait(target, AbortRequests(ids))
                except EngineDeadError:  # nothing left to abort
                    pass

    async def call_utility_async(self, method: str, *args: Any, engine_index: int = 0) -> Any:
        self._ensure_started()
        call_id = next(self._call_ids)
        fut = self._futures[call_id] = self._loop.create_future()
        core = next(c for c in self._cores if c.engine_index == engine_index)
        await self._send(core, UtilityCall(call_id, method, list(args)))
        await self._until(fut.done)
        return _utility_value(fut.result())

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the cores; later calls (and requests still waiting) get EngineDeadError."""
        self._closing = True
        if _in_loop(self._loop):
            self._fail(EngineShutdownError())
        elif self._dead is None:
            self._dead = EngineShutdownError()
        self._finalizer.detach()
        _close_async(self._cores, self._loop, self._readers, timeout)


def _in_loop(loop: Optional[asyncio.AbstractEventLoop]) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _close_async(
    cores: list[CoreProcess],
    loop: Optional[asyncio.AbstractEventLoop] = None,
    readers: Optional[list] = None,
    timeout: float = 5.0,
) -> None:
    """Stop the reader tasks and pidfd watches (only from the loop's own thread, or once the
    loop has stopped: neither is thread-safe), then close the cores."""
    if loop is not None and not loop.is_closed():
        if _in_loop(loop) or not loop.is_running():
            for task in readers or ():
                task.cancel()
            for core in cores:
                if core.pidfd is not None:
                    loop.remove_reader(core.pidfd)
    close_cores(cores, timeout)
