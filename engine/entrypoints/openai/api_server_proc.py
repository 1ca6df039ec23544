"""One of the N API-server processes of ``ringllm serve --api-server-count N``:
``python -m engine.entrypoints.openai.api_server_proc``, started by ``api_server_pool``.

It is the ordinary server (``run_server``, the same app, the same AsyncLLM) with two differences:
its EngineCores are the launcher's (``AttachedCore``: this process creates its own ring pair to
each and hands the cores' ends over through the launcher, in rank order), and it shares the port with its siblings
(SO_REUSEPORT: the kernel spreads new connections over them). Its spec comes on stdin as a
pickle from the launcher (the parent, the same program and user), never on the command line or in
the environment, which other local users can read and which would show the API key.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import signal
import socket
import sys
from contextlib import asynccontextmanager
from typing import AsyncGenerator

from engine.async_llm import AsyncLLM
from engine.client.attached_core import AttachedCore
from engine.client.factory import stopped_on_error
from engine.config import EngineConfig
from engine.entrypoints.openai.server import ServerSettings, run_server
from engine.exceptions import EngineStartupError
from engine.logging_setup import configure_logging
from shm_transport import set_parent_death_signal


@dataclasses.dataclass
class ApiServerSpec:
    """What the launcher tells one API server."""

    index: int  # its slot, 0..N-1 (a restarted server takes the slot of the one it replaces)
    config: EngineConfig  # the launcher's, the one its cores run (READY states its digest)
    log_requests: bool
    settings: ServerSettings  # its share of the admission limit, reuse_port, the metrics directory
    tool_args: argparse.Namespace  # the tool flags: the plugin file runs in each process
    core_pids: list[int]  # by data-parallel rank
    launcher_pid: int
    launcher_fd: int  # the socket its channel end goes to the core through


@asynccontextmanager
async def attached_engine(spec: ApiServerSpec, launcher: socket.socket) -> AsyncGenerator[AsyncLLM, None]:
    """The AsyncLLM of this API server over the launcher's cores, shut down however the server
    ends (which closes only this server's channels: the cores serve the others on)."""
    config = spec.config
    cores: list[AttachedCore] = []
    try:
        with stopped_on_error(cores):
            for rank, pid in zip(config.parallel_config.frontend_engine_indices, spec.core_pids):
                cores.append(AttachedCore(config, pid, launcher, engine_index=rank))
    finally:
        launcher.close()
    engine = None
    try:
        engine = AsyncLLM(config, log_requests=spec.log_requests, _started=cores)
        engine.internal_id_suffix = f".{os.getpid()}"  # unique among the core's API servers, restarts too
        yield engine
    finally:
        if engine is not None:
            engine.shutdown()


def main() -> int:
    spec: ApiServerSpec = pickle.load(sys.stdin.buffer)
    # The launcher's death ends us (it has ended the core too); so does a launcher that died already.
    set_parent_death_signal(signal.SIGKILL, expected_parent=spec.launcher_pid)
    configure_logging()
    from engine.entrypoints.cli_args import tool_serving_from

    try:
        settings = dataclasses.replace(spec.settings, tool_serving=tool_serving_from(spec.tool_args))
        run_server(attached_engine(spec, socket.socket(fileno=spec.launcher_fd)), settings)
    except (ValueError, EngineStartupError) as exc:
        sys.exit(f"ringllm serve: API server {spec.index}: error: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
