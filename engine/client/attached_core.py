"""An API server's handle on an EngineCore it did not start (``--api-server-count N``).

The launcher starts the core and the API servers; each API server creates its own channel and
hands the core's end over (``shm_transport.handoff``, forwarded by the launcher). From there the
clients treat it as the ``CoreProcess`` of a core they launched, with the differences a
non-parent has: the core is watched through a pidfd of a process that is not our child (it
cannot be reaped or killed here), and leaving closes only our channel: SHUTDOWN is the
launcher's to send, since the core serves the other API servers too.
"""

from __future__ import annotations

import json
import os
import select
import socket
from typing import Optional

from engine.client.core_launcher import CoreProcess
from engine.config import EngineConfig
from engine.core.launch import channel_class, make_codec
from engine.wire_messages import EngineReady
from shm_transport.handoff import send_peer_end


class _PeerProcess:
    """What the clients ask of ``CoreProcess.proc``, for a process that is not our child."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid, self._pidfd = pid, pidfd
        self.returncode: Optional[int] = None  # not ours to reap: unknown

    def poll(self) -> Optional[int]:
        return None if self._running(0) else -1

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._running(timeout)
        return None

    def _running(self, timeout: Optional[float]) -> bool:
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(None if timeout is None else int(timeout * 1000))


class AttachedCore(CoreProcess):
    """The core behind this API server (see the module docstring)."""

    def __init__(self, config: EngineConfig, core_pid: int, launcher: socket.socket, engine_index: int = 0) -> None:
        """Create our channel to the core (pid ``core_pid``) and send its other end to the
        launcher over ``launcher``, which hands it to the core; READY then comes as usual."""
        if config.transport != "shm":
            raise ValueError("--api-server-count > 1 needs --transport shm (channel ends are handed over as fds)")
        self.engine_index = engine_index
        self.ready: Optional[EngineReady] = None
        self.pidfd: Optional[int] = os.pidfd_open(core_pid)
        self.proc = _PeerProcess(core_pid, self.pidfd)
        self.channel = channel_class(config.transport).create(make_codec(), capacity=config.ring_capacity)
        try:
            self.channel.set_peer(core_pid)
            send_peer_end(launcher, self.channel, json.dumps({"pid": os.getpid()}).encode())
            self.channel.close_peer_fds()
        except BaseException:
            self.close(timeout=0)
            raise

    def exit_status(self, wait: float = 1.0) -> str:
        return "stopped answering" if self.proc._running(wait) else "exited"

    def request_exit(self) -> None:
        self.channel.close()  # the core aborts what we left running and serves the others on

    def close(self, timeout: float) -> None:
        self.request_exit()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
