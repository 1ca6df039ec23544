"""The frontend's launcher and handle of EngineCore processes: launch (``CoreProcess``,
``start_cores``), the READY handshake, and a clean end (``close_cores``) whatever failed on the way.

The other side of the process boundary, what runs in the core, is ``engine.core.engine_core_proc``;
what both sides share at launch is ``engine.core.launch``. Launched with ``subprocess`` as
``python -m engine.core FD``, never multiprocessing: the user's ``__main__`` is not re-imported,
no resource tracker starts, and the launch spec (in a memfd) and the ring's file descriptors
arrive through ``pass_fds``. Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from engine import envs
from engine.config import EngineConfig
from engine.config.wire import config_digest, encode_config
from engine.core.launch import CoreLaunchSpec, channel_class, check_ready, command_line, make_codec, write_spec
from engine.exceptions import EngineStartupError
from engine.torch_env import prepare_torch_env
from engine.wire_messages import EngineDead, EngineReady, Shutdown
from shm_transport import TransportError


def pickle_class(cls: type) -> str:
    """A class as base64 text for the JSON launch spec: cloudpickle carries a class the core
    could not import (defined in ``__main__``, a test module or a function) by value."""
    import base64

    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(cls)).decode()


def describe_exit(returncode: Optional[int]) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


class CoreProcess:
    """One EngineCore process and the frontend end of its channel.

    Launched with ``subprocess`` (never multiprocessing: the user's ``__main__`` is not
    re-imported, no resource tracker starts) and given its fds explicitly. Whatever fails
    after the launch, ``close`` leaves no child, fd or segment behind.
    """

    def __init__(self, config: EngineConfig, engine_index: int = 0, frontends_fd: Optional[int] = None) -> None:
        """``frontends_fd``: a Unix socket the core receives API servers' channels on
        (``--api-server-count``, engine/core/frontends.py); it is passed to the core as is."""
        self.engine_index = engine_index
        self.ready: Optional[EngineReady] = None
        self.proc: Optional[subprocess.Popen] = None
        self.pidfd: Optional[int] = None
        self.channel = channel_class(config.transport).create(make_codec(), capacity=config.ring_capacity)
        try:
            # a class as worker_cls travels cloudpickled (by value when the core could not import it)
            worker_pickle = pickle_class(config.worker_cls) if isinstance(config.worker_cls, type) else None
            spec = CoreLaunchSpec(
                token=self.channel.peer_token(),
                transport=config.transport,
                engine_index=engine_index,
                num_threads=config.num_threads,
                parent_pid=os.getpid(),
                pdeathsig=threading.current_thread() is threading.main_thread(),
                config=encode_config(config).decode(),
                config_digest=config_digest(config),
                sys_path=[os.path.abspath(p) for p in sys.path],
                worker_cls_pickle=worker_pickle,
                frontends_fd=frontends_fd,
            )
            # The thread count and OpenMP's wait policy go in the environment, so they hold even if
            # something imports torch before the core's own start-up code runs.
            env = prepare_torch_env(dict(os.environ), config.num_threads)
            spec_fd = write_spec(spec)
            try:
                self.proc = subprocess.Popen(
                    command_line(spec_fd),
                    pass_fds=[spec_fd, *self.channel.peer_fds()] + ([] if frontends_fd is None else [frontends_fd]),
                    env=env,
                    stdin=subprocess.DEVNULL,
                )
            finally:
                os.close(spec_fd)  # the core holds its own copy
            self.channel.set_peer(self.proc.pid)
            self.channel.close_peer_fds()
            self.pidfd = os.pidfd_open(self.proc.pid)
        except BaseException:
            self.close(timeout=0)
            raise

    @property
    def name(self) -> str:
        return f"EngineCore_{self.engine_index} (pid {self.proc.pid if self.proc else '?'})"

    def wait_ready(self, timeout: float) -> EngineReady:
        """Block until READY; a core that fails or dies first raises EngineStartupError
        carrying its cause (its traceback, or how it exited)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineStartupError(f"{self.name} sent no READY within {timeout:.0f} s")
                for msg in self.channel.recv_batch(timeout=min(left, 1.0)):
                    if isinstance(msg, EngineReady):
                        self.ready = msg
                        return msg
                    if isinstance(msg, EngineDead):
                        raise EngineStartupError(f"{self.name} failed to start: {msg.error}")
        except TransportError:
            raise EngineStartupError(f"{self.name} {self.exit_status()} before it was ready") from None

    def exit_status(self, wait: float = 1.0) -> str:
        try:
            return describe_exit(self.proc.wait(wait))
        except subprocess.TimeoutExpired:
            return "stopped answering"

    def request_exit(self) -> None:
        """SHUTDOWN, then close our end: the core reads what was sent, then sees the close,
        so it exits promptly even if SHUTDOWN found the ring full."""
        if self.channel.closed:
            return
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.channel.try_send(Shutdown())
            except TransportError:
                pass
        self.channel.close()

    def close(self, timeout: float) -> None:
        """Stop the core (killed after ``timeout``) and free its fds and rings."""
        self.request_exit()
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def start_cores(config: EngineConfig, engine_indices: list[int]) -> list[CoreProcess]:
    """Start the cores together (each imports torch and loads the model) without waiting: the
    frontend reads the model's tokenizer meanwhile."""
    cores: list[CoreProcess] = []
    try:
        for i in engine_indices:
            cores.append(CoreProcess(config, i))
        return cores
    except BaseException:
        close_cores(cores, timeout=0)
        raise


def wait_cores(cores: list[CoreProcess], config: EngineConfig) -> list[CoreProcess]:
    """Wait until every core is READY with the config this frontend derived (by its digest,
    engine/core/launch.py); on any failure all of them are stopped."""
    digest = config_digest(config)
    try:
        for core in cores:
            check_ready(core.wait_ready(envs.RINGLLM_ENGINE_READY_TIMEOUT_S), digest, core.name)
        return cores
    except BaseException:
        close_cores(cores, timeout=0)
        raise


def close_cores(cores: list[CoreProcess], timeout: float = 5.0) -> None:
    for core in cores:  # all told first, so data-parallel cores wind down together
        core.request_exit()
    for core in cores:
        core.close(timeout)
