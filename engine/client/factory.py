"""``make_client``: which client, and so where the EngineCore lives, chosen once at start-up.

Apart from the clients so that none of them imports it back (vLLM's
``EngineCoreClient.make_client``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Union

from engine.client.core_client import AsyncEngineCoreClient, EngineCoreClient, InprocClient
from engine.client.core_launcher import CoreProcess, close_cores, start_cores
from engine.client.dp_client import DPLBAsyncMPClient
from engine.client.mp_client import AsyncMPClient, SyncMPClient
from engine.config import EngineArgs, EngineConfig
from engine.logging_setup import configure_logging


def make_client(
    multiprocess_mode: bool, asyncio_mode: bool, config: EngineConfig, started: Optional[list[CoreProcess]] = None
) -> Union[EngineCoreClient, AsyncEngineCoreClient]:
    """``InprocClient`` (the core in this process), ``SyncMPClient`` (LLM over the ring) or,
    for asyncio, ``AsyncMPClient``; with data parallelism the balancing
    ``DPLBAsyncMPClient``. One rank behind an external balancer (``data_parallel_external_lb``)
    is a plain ``AsyncMPClient`` of that rank's core (``frontend_engine_indices``)."""
    if asyncio_mode and not multiprocess_mode:
        raise NotImplementedError("Running EngineCore in asyncio without multiprocessing is not supported.")
    if asyncio_mode:
        parallel = config.parallel_config
        if parallel.data_parallel_size == 1 or parallel.data_parallel_external_lb:
            return AsyncMPClient(config, started)
        return DPLBAsyncMPClient(config, started)
    if multiprocess_mode:
        return SyncMPClient(config, started)
    return InprocClient(config)


def config_and_cores(
    engine_args: EngineArgs, multiprocess_mode: bool, sync_frontend: bool
) -> tuple[EngineConfig, Optional[list[CoreProcess]]]:
    """The EngineConfig, derived here once, with the core processes already started on it when
    there are to be any: they import torch and load the model while this process reads the
    tokenizer (the frontend's caller builds it under ``stopped_on_error``). ``sync_frontend``: the
    caller waits while the core steps (LLMEngine), so the model's default threads take every core
    (engine/thread_policy.py)."""
    configure_logging()
    config = engine_args.create_engine_config(sync_frontend)
    if not multiprocess_mode:
        return config, None
    return config, start_cores(config, config.parallel_config.frontend_engine_indices)


@contextlib.contextmanager
def stopped_on_error(started: Optional[list[CoreProcess]]) -> Iterator[None]:
    """Around what a frontend builds between ``config_and_cores`` and its client (the tokenizer):
    if that fails, the cores started ahead are stopped, not left to the garbage collector."""
    try:
        yield
    except BaseException:
        close_cores(started or [], timeout=0)
        raise
