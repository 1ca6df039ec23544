"""``ringllm serve --api-server-count N``: N API-server processes over the EngineCore(s).

Past some concurrency one Python event loop is the bottleneck (output processing, detokenizing,
SSE writing), so vLLM runs several API servers on one port. Here the launcher (this process)
starts the EngineCore, then N API servers (``api_server_proc``), and supervises them:

- **One port**: every API server binds it with SO_REUSEPORT; the kernel spreads connections.
- **One ring pair per API server and core**, no broker: each server creates one channel per core
  (``--data-parallel-size`` of them, rank order) and sends the cores' ends here over a Unix socket,
  and this process forwards each (fds by SCM_RIGHTS, ``shm_transport.handoff``) to its core, which
  polls all its API servers' rings in turn (``engine/core/frontends.py``). Each API server balances
  its own requests over the cores (``DPLBAsyncMPClient``). The launcher keeps its own channel to
  each core (READY, SHUTDOWN).
- **One admission limit**: ``--max-waiting-requests`` is split into per-server shares that sum to
  it (the remainder to the first servers). A share needs no cross-process lock on the request
  path; the price is that one server can refuse while another has room. Connections
  (``--max-connections``) are per server.
- **/metrics** answers the sum over all servers from whichever one a scrape reaches
  (``metrics_fanin.py``, through sockets in a private directory removed at exit).
- **Failures**: an API server that is killed is restarted in its slot (the core has aborted its
  requests and freed their KV blocks meanwhile), at most ``MAX_RESTARTS`` times a minute; one
  that exits on its own (a start-up error), or too many restarts, stops the whole server with
  that exit. A core that dies (any rank) stops every API server (each has already answered its streams
  with errors and /health with 503) and the launcher exits 1. SIGTERM/SIGINT: the API servers
  drain, then the core is told SHUTDOWN.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Optional

from engine.client.core_launcher import CoreProcess, close_cores, describe_exit, wait_cores
from engine.config import AsyncEngineArgs, EngineConfig
from engine.entrypoints.openai.api_server_proc import ApiServerSpec
from engine.entrypoints.openai.server import END_GRACE_S, ServerSettings
from shm_transport.handoff import close_token_fds, recv_token, send_token

logger = logging.getLogger(__name__)

MAX_RESTARTS = 3  # per API-server slot within RESTART_WINDOW_S; one more stops the server
RESTART_WINDOW_S = 60.0
_HANDOFF_TIMEOUT_S = 120.0  # an API server's channel end arrives after its imports


def admission_shares(limit: Optional[int], count: int) -> list[Optional[int]]:
    """Per-server shares of ``--max-waiting-requests`` that sum to it (None: unbounded)."""
    if limit is None:
        return [None] * count
    if limit < count:
        raise ValueError(
            f"--max-waiting-requests {limit} cannot be shared by --api-server-count {count} "
            "API servers (each needs a share of at least 1)"
        )
    return [limit // count + (1 if i < limit % count else 0) for i in range(count)]


def check_pool_args(count: int, engine_args: AsyncEngineArgs) -> None:
    if count < 1:
        raise ValueError(f"--api-server-count must be >= 1, got {count}")
    if engine_args.transport != "shm":
        raise ValueError(
            "--api-server-count > 1 needs --transport shm (each API server's ring pair is handed to "
            "the core as file descriptors)"
        )
    if engine_args.data_parallel_external_lb and engine_args.data_parallel_size > 1:
        raise ValueError(
            "--api-server-count > 1 with --data-parallel-external-lb is not supported (run one "
            "server per rank behind the external balancer)"
        )


class _Slot:
    """One API server's place: its process, and when it was restarted."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Optional[subprocess.Popen] = None
        self.pidfd: Optional[int] = None
        self.restarts: deque[float] = deque()


class ApiServerPool:
    """The launcher (see the module docstring): ``run()`` returns the process's exit status."""

    def __init__(
        self, engine_args: AsyncEngineArgs, settings: ServerSettings, tool_args: argparse.Namespace, count: int
    ) -> None:
        check_pool_args(count, engine_args)
        if settings.port == 0:
            raise ValueError(
                "--api-server-count > 1 needs a --port other than 0 (each API server would bind a different free port)"
            )
        self.engine_args, self.tool_args, self.count = engine_args, tool_args, count
        self.config: Optional[EngineConfig] = None  # derived at start, sent to the cores and API servers
        self.settings = settings
        self.shares = admission_shares(settings.max_waiting_requests, count)
        self.slots = [_Slot(i) for i in range(count)]
        self.cores: list[CoreProcess] = []
        self._to_cores: list[socket.socket] = []  # by rank: where API servers' channel ends go
        self._metrics_dir: Optional[str] = None
        self._stopping = False

    # ---- start
    def run(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._start()
            return self._supervise(wake_r)
        finally:
            self._stop_all()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)

    def _start(self) -> None:
        config = self.config = self.engine_args.create_engine_config()  # a bad one ends here, before any process
        for rank in config.parallel_config.frontend_engine_indices:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._to_cores.append(ours)
            try:
                self.cores.append(CoreProcess(config, rank, frontends_fd=theirs.fileno()))
            finally:
                theirs.close()
        self._metrics_dir = tempfile.mkdtemp(prefix="ringllm-metrics-")  # 0700: this user's only
        for slot in self.slots:  # they import and read the tokenizer while the cores load the model
            self._launch(slot)
        wait_cores(self.cores, config)
        logger.info(
            "%d EngineCore(s) ready; %d API servers on port %d", len(self.cores), self.count, self.settings.port
        )

    def _launch(self, slot: _Slot) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            settings = dataclasses.replace(
                self.settings,
                max_waiting_requests=self.shares[slot.index],
                reuse_port=True,
                metrics_fanin_dir=self._metrics_dir,
            )
            spec = ApiServerSpec(
                slot.index,
                self.config,
                self.engine_args.enable_log_requests,
                settings,
                self.tool_args,
                [core.proc.pid for core in self.cores],
                os.getpid(),
                theirs.fileno(),
            )
            slot.proc = subprocess.Popen(
                [sys.executable, "-m", "engine.entrypoints.openai.api_server_proc"],
                stdin=subprocess.PIPE,
                pass_fds=[theirs.fileno()],
            )
            slot.pidfd = os.pidfd_open(slot.proc.pid)
            theirs.close()
            slot.proc.stdin.write(pickle.dumps(spec))
            slot.proc.stdin.close()
            for to_core in self._to_cores:  # the server sends its ends in rank order
                if not self._forward_channel(ours, slot, to_core):
                    break
        finally:
            theirs.close()
            ours.close()

    def _forward_channel(self, sock: socket.socket, slot: _Slot, to_core: socket.socket) -> bool:
        """The API server's next channel end, on to its core (as the pid we started: not what it
        says); False when none came."""
        deadline = time.monotonic() + _HANDOFF_TIMEOUT_S
        while True:
            try:
                token, _ = recv_token(sock, timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                break
            except TimeoutError:
                if slot.proc.poll() is not None or time.monotonic() >= deadline:
                    return False  # it died first (its exit is seen by the supervisor) or never sent one
            except EOFError:
                return False
        try:
            send_token(to_core, token, json.dumps({"pid": slot.proc.pid}).encode())
        finally:
            close_token_fds(token)
        return True

    # ---- run
    def _on_signal(self, signum: int, frame) -> None:
        if not self._stopping:
            logger.info(
                "%s: stopping the API servers (they drain for up to %g s)",
                signal.Signals(signum).name,
                self.settings.drain_timeout_s,
            )
        self._stopping = True

    def _supervise(self, wake_fd: int) -> int:
        while not self._stopping:
            poller = select.poll()
            poller.register(wake_fd, select.POLLIN)
            for core in self.cores:
                poller.register(core.pidfd, select.POLLIN)
            for slot in self.slots:
                poller.register(slot.pidfd, select.POLLIN)
            poller.poll()
            try:
                os.read(wake_fd, 512)
            except BlockingIOError:
                pass
            for core in self.cores:
                if core.proc.poll() is not None:
                    logger.error("%s %s: stopping the API servers", core.name, describe_exit(core.proc.returncode))
                    return 1
            for slot in self.slots:
                if slot.proc.poll() is not None and not self._stopping:
                    status = self._replace(slot)
                    if status is not None:
                        return status
        return 0

    def _replace(self, slot: _Slot) -> Optional[int]:
        """Restart a killed API server; the exit status to stop with when it cannot be."""
        rc = slot.proc.returncode
        os.close(slot.pidfd)
        slot.pidfd = None
        if rc >= 0:  # it ended itself: a start-up error it has already reported
            logger.error("API server %d (pid %d) %s: stopping", slot.index, slot.proc.pid, describe_exit(rc))
            return rc or 1
        now = time.monotonic()
        while slot.restarts and now - slot.restarts[0] > RESTART_WINDOW_S:
            slot.restarts.popleft()
        if len(slot.restarts) >= MAX_RESTARTS:
            logger.error(
                "API server %d %s, %d restarts within %g s already: stopping",
                slot.index,
                describe_exit(rc),
                MAX_RESTARTS,
                RESTART_WINDOW_S,
            )
            return 1
        slot.restarts.append(now)
        logger.warning("API server %d (pid %d) %s: restarting it", slot.index, slot.proc.pid, describe_exit(rc))
        self._launch(slot)
        return None

    # ---- stop
    def _stop_all(self) -> None:
        """API servers first (they drain), then the core; nothing left behind."""
        live = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for slot in live:
            slot.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.drain_timeout_s + END_GRACE_S + 10.0
        for slot in live:
            try:
                slot.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait()
        for slot in self.slots:
            if slot.proc is not None:
                slot.proc.wait()
            if slot.pidfd is not None:
                try:
                    os.close(slot.pidfd)
                except OSError:
                    pass
                slot.pidfd = None
        close_cores(self.cores)
        for to_core in self._to_cores:
            to_core.close()
        if self._metrics_dir is not None:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
