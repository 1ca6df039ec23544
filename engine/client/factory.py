"""``make_client``: which client, and so where the EngineCore lives, chosen once at start-up.

Apart from the clients so that none of them imports it back (vLLM's
``EngineCoreClient.make_client``).
"""
from __future__ import annotations

from typing import Union

from engine.client.core_client import AsyncEngineCoreClient, EngineCoreClient, InprocClient
from engine.client.dp_client import DPAsyncMPClient, DPLBAsyncMPClient
from engine.client.mp_client import AsyncMPClient, SyncMPClient
from engine.config import EngineConfig


def make_client(multiprocess_mode: bool, asyncio_mode: bool, config: EngineConfig
                ) -> Union[EngineCoreClient, AsyncEngineCoreClient]:
    """``InprocClient`` (the core in this process), ``SyncMPClient`` (LLM over the ring) or,
    for asyncio, ``AsyncMPClient``; with data parallelism the balancing
    ``DPLBAsyncMPClient``, or ``DPAsyncMPClient`` for one rank behind an external balancer."""
    if asyncio_mode and not multiprocess_mode:
        raise NotImplementedError("Running EngineCore in asyncio without multiprocessing is not supported.")
    if asyncio_mode:
        parallel = config.parallel_config
        if parallel.data_parallel_size == 1:
            return AsyncMPClient(config)
        if parallel.data_parallel_external_lb:
            return DPAsyncMPClient(config)
        return DPLBAsyncMPClient(config)
    if multiprocess_mode:
        return SyncMPClient(config)
    return InprocClient(config)
