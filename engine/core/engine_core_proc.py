"""The EngineCore *process*: its ``main`` (run by ``python -m engine.core TOKEN SPEC``,
engine/core/__main__.py) and ``EngineCoreProc``, the busy loop that feeds one ``EngineCore``
(engine/core/engine_core.py) from its channel and publishes what each step produced.

The frontend starts it through ``engine.client.core_launcher``; what the two share at launch
(the spec, the codec, the channel class, the READY fields) is ``engine.core.launch``. torch is
imported only after the thread count and ``OMP_WAIT_POLICY`` are set (docs/ARCHITECTURE.md,
"Threads": an OpenMP thread that spins while its partner core runs the frontend makes a decode
step many times slower).
"""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any, Optional

from engine import envs
from engine.core.launch import CoreLaunchSpec, channel_class, make_codec, read_command_line, receive_config
from engine.logging_setup import configure_logging
from engine.torch_env import prepare_torch_env
from engine.wire_messages import (AbortRequests, EngineCoreOutputs, EngineCoreRequest, EngineDead, EngineReady,
                                  Shutdown, UtilityCall, UtilityResult, merge_outputs)
from shm_transport import TransportError

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.engine_core import EngineCore

logger = logging.getLogger(__name__)

# EngineCore methods a frontend may call through UTILITY; nothing else is reachable.
UTILITY_METHODS = frozenset({"get_stats", "reset_prefix_cache", "collective_rpc"})

# After this long with nothing to do, an EngineCore that has stepped hands its free heap back to the
# OS (glibc's malloc_trim): a burst of varied batch shapes leaves hundreds of MB of freed but mapped
# arenas behind. A request arriving sooner wakes the loop as usual, so busy serving never pays for it.
_TRIM_AFTER_IDLE_S = 1.0
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only

# How long the loop waits for a request when it holds outputs the full ring refused:
# short enough to retry promptly, long enough not to spin a core the frontend needs.
_HELD_RETRY_S = 0.0005


class EngineCoreProc:
    """The busy loop around one EngineCore and the core end of one channel.

    Contract: every message for the frontend goes through ``_outbox``, in order; the loop
    only ever *tries* to publish, so a full output ring never stops it from draining
    requests and stepping. Consecutive outputs waiting in the outbox merge into one.
    """

    def __init__(self, core: EngineCore, channel: Any, engine_index: int) -> None:
        self.core = core
        self.channel = channel
        self.engine_index = engine_index
        self._outbox: deque = deque()
        self._running = True
        self._stepped_since_trim = False
        self._stats_stale = False  # aborts changed the gauges and no step may follow

    def run_busy_loop(self) -> None:
        while self._running:
            # 1) take every request that has arrived; block only when there is nothing to do
            if self.core.has_unfinished_requests():
                msgs = self.channel.poll()
            else:
                msgs = self._wait_for_requests()
            for msg in msgs:
                self._handle(msg)
            # 2) step and publish (never blocking on a full output ring)
            if self._running and self.core.has_unfinished_requests():
                self._stepped_since_trim = True
                outputs = self.core.step()
                # A step without outputs (a prompt chunk) still counted prefix-cache lookups and
                # preemptions: its stats go out too, merged into the next outputs when held.
                if outputs.outputs or outputs.scheduler_stats is not None:
                    self._publish(outputs)
            elif self._stats_stale:  # aborts emptied the core: its gauges must not stay stale
                self._publish(self.core.stats_only())
            self._stats_stale = False
            self._flush()

    def _wait_for_requests(self) -> list:
        """Block until requests come (briefly while outputs wait for ring space); after a second
        of idleness following work, return freed heap to the OS once."""
        if self._outbox:
            return self.channel.recv_batch(timeout=_HELD_RETRY_S)
        if not (self._stepped_since_trim and _malloc_trim is not None):
            return self.channel.recv_batch(timeout=None)
        msgs = self.channel.recv_batch(timeout=_TRIM_AFTER_IDLE_S)
        if not msgs:
            _malloc_trim(0)
            self._stepped_since_trim = False
        return msgs

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, EngineCoreRequest):
            self.core.add_request(msg, params_verified=True)  # its decode verified them
        elif isinstance(msg, AbortRequests):
            self.core.abort_requests(msg.request_ids)
            self._stats_stale = self.core.log_stats
        elif isinstance(msg, UtilityCall):
            self._outbox.append(self._call_utility(msg))
        elif isinstance(msg, Shutdown):
            self._running = False
        else:
            raise TypeError(f"EngineCore got an unexpected message {type(msg).__name__}")

    def tell_dead(self, error: str) -> None:
        """The core cannot go on: the frontend hears why."""
        _send_dead(self.channel, self.engine_index, error)

    def _call_utility(self, call: UtilityCall) -> UtilityResult:
        if call.method not in UTILITY_METHODS or not hasattr(self.core, call.method):
            return UtilityResult(call.call_id, error=f"utility method {call.method!r} is not allowed")
        try:
            return UtilityResult(call.call_id, result=getattr(self.core, call.method)(*call.args))
        except Exception as e:  # the caller gets the error; the engine keeps serving
            return UtilityResult(call.call_id, error=f"{type(e).__name__}: {e}")

    def _publish(self, outputs: EngineCoreOutputs) -> None:
        outputs.engine_index = self.engine_index
        if self._outbox and isinstance(self._outbox[-1], EngineCoreOutputs):
            merge_outputs(self._outbox[-1], outputs)
        else:
            self._outbox.append(outputs)

    def _flush(self) -> None:
        while self._outbox:
            msg = self._outbox[0]
            if isinstance(msg, EngineCoreOutputs):
                msg.timestamp = time.monotonic()  # for the frontend's publish-to-receive latency
            if not self.channel.try_send(msg):
                return
            self._outbox.popleft()


def _exit_when_parent_dies(parent_pid: int) -> None:
    """Exit within moments of the frontend's death, even in the middle of a step."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)
    if os.getppid() != parent_pid:  # it died before the pidfd was opened
        os._exit(1)
    select.select([pidfd], [], [])
    os._exit(1)


def ignore_group_signals() -> None:
    """SIGINT and SIGTERM are for the frontend. Ctrl-C in a terminal, ``kill -TERM -PGID`` and
    a service manager stopping the whole group all reach the core too; the frontend turns them
    into aborts (LLM) or a drain of in-flight requests (the server), and both need the core
    alive until it is told SHUTDOWN. The core still ends with its frontend: PR_SET_PDEATHSIG
    and the parent pidfd watch (``_setup_process``); SIGKILL stops it in any case."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _setup_process(spec: CoreLaunchSpec) -> None:
    if spec.pdeathsig:
        from shm_transport import set_parent_death_signal

        set_parent_death_signal(signal.SIGKILL)
    threading.Thread(target=_exit_when_parent_dies, args=(spec.parent_pid,), daemon=True,
                     name="parent-watch").start()
    # first import of torch in this process: after the thread count and OpenMP's wait policy
    prepare_torch_env(num_threads=spec.num_threads)
    import torch

    torch.set_num_threads(spec.num_threads)


class _PrefixFormatter(logging.Formatter):
    """Puts the core's name in front of what the frontend's formatter writes."""

    def __init__(self, prefix: str, inner: Optional[logging.Formatter]) -> None:
        super().__init__()
        self.prefix, self.inner = prefix, inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return self.prefix + self.inner.format(record)


def _configure_logging(engine_index: int) -> None:
    """One line per record, prefixed (vLLM's ``(EngineCore_DP0 pid=...)``), on the stderr the
    core shares with its frontend. ringllm's handler (``engine.logging_setup``, the frontend's
    format) moves to the root logger with the prefix, so ringllm's records (which propagate)
    and other libraries' warnings all come out once, marked as the core's."""
    configure_logging()
    ours = [logging.getLogger(name) for name in ("engine", "shm_transport")]
    handler = next((h for logger in ours for h in logger.handlers), None) or logging.StreamHandler()
    handler.setFormatter(_PrefixFormatter(f"(EngineCore_{engine_index} pid={os.getpid()}) ", handler.formatter))
    for logger in ours:
        logger.handlers.clear()
        logger.setLevel(envs.RINGLLM_LOGGING_LEVEL)
    logging.getLogger().handlers[:] = [handler]


def _start_core(spec: CoreLaunchSpec) -> tuple[EngineConfig, EngineCore]:
    """The frontend's config, as sent (engine/core/launch.py), and the core built on it."""
    from engine.core.engine_core import EngineCore

    worker_cls = None
    if spec.worker_cls_pickle is not None:
        import base64

        import cloudpickle

        worker_cls = cloudpickle.loads(base64.b64decode(spec.worker_cls_pickle))
    config = receive_config(spec, worker_cls)
    return config, EngineCore(config, spec.engine_index)


def _send_dead(channel: Any, engine_index: int, error: str) -> None:
    try:
        channel.send(EngineDead(error, engine_index), timeout=1.0)
    except Exception:  # the frontend is gone or not reading: nothing more to tell it
        pass


def _startup_cause(exc: BaseException) -> str:
    """What the frontend reports for a core that could not start: a ValueError (a bad model
    file or setting: its message names the file and the problem) as its one line, the
    traceback kept for the core's debug log; anything else (an engine bug) with its traceback."""
    if isinstance(exc, ValueError):
        logger.debug("EngineCore failed to start:\n%s", traceback.format_exc())
        return " ".join(str(exc).split("\n")) or type(exc).__name__
    return f"EngineCore failed to start:\n{traceback.format_exc()}"


def _make_proc(spec: CoreLaunchSpec, config: EngineConfig, core: EngineCore, channel: Any) -> EngineCoreProc:
    """The loop for one frontend, or for several API servers (their channels arrive later)."""
    if spec.frontends_fd is None:
        return EngineCoreProc(core, channel, spec.engine_index)
    import socket

    from engine.core.frontends import MultiFrontendCoreProc

    attach = socket.socket(fileno=spec.frontends_fd)
    return MultiFrontendCoreProc(core, channel, spec.engine_index, config, spec.transport, attach)


def main(argv: list[str]) -> int:
    ignore_group_signals()  # first: torch's import and the model load take seconds
    token, spec = read_command_line(argv)
    sys.path.extend(p for p in spec.sys_path if p not in sys.path)
    _setup_process(spec)
    _configure_logging(spec.engine_index)
    channel = channel_class(spec.transport).attach(make_codec(), token, peer_pid=spec.parent_pid)
    try:
        try:
            config, core = _start_core(spec)
        except Exception as exc:
            _send_dead(channel, spec.engine_index, _startup_cause(exc))
            return 1
        gc.collect()  # the model and libraries stay for good: keep them out of every collection
        gc.freeze()
        channel.send(EngineReady(engine_index=spec.engine_index, pid=os.getpid(), num_kv_blocks=core.num_kv_blocks,
                                 config_digest=spec.config_digest), timeout=10.0)
        proc = _make_proc(spec, config, core, channel)
        try:
            proc.run_busy_loop()
        except TransportError:
            return 1  # the frontend is gone or closed the channel: nobody left to tell
        except Exception as e:
            # The traceback goes to the log; the frontend (and any HTTP client) gets no paths.
            logger.exception("EngineCore %d died", spec.engine_index)
            proc.tell_dead(f"it died of {type(e).__name__} (the EngineCore log has the traceback)")
            return 1
        finally:  # the KV-event publisher sends what it holds and removes its socket directory, on any exit
            core.stop_publishing()
        return 0
    finally:
        channel.close()

