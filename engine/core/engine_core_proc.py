"""The EngineCore *process*: its ``main`` (run by ``python -m engine.core FD``,
engine/core/__main__.py) and ``EngineCoreProc``, the one busy loop that feeds one ``EngineCore``
(engine/core/engine_core.py) from its frontends' channels (``engine.core.frontends``: one by
default, one per API server with ``--api-server-count``) and sends each of them what is theirs.

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
from typing import TYPE_CHECKING, Any, Optional

from engine import envs
from engine.core.frontends import Frontend, FrontendAttacher, share_stats
from engine.core.launch import CoreLaunchSpec, channel_class, make_codec, read_spec, receive_config
from engine.logging_setup import configure_logging
from engine.torch_env import prepare_torch_env
from engine.wire_messages import (
    AbortRequests,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineDead,
    EngineReady,
    Shutdown,
    UtilityCall,
    UtilityResult,
)
from shm_transport import TransportError
from shm_transport.channel_set import peer_alive, wait_any
from shm_transport.wakeup import clear_eventfd

if TYPE_CHECKING:
    from engine.core.engine_core import EngineCore

logger = logging.getLogger(__name__)

# EngineCore methods a frontend may call through UTILITY; nothing else is reachable.
UTILITY_METHODS = frozenset(
    {"get_stats", "reset_prefix_cache", "collective_rpc", "add_lora", "remove_lora", "list_loras"}
)

# After this long with nothing to do, an EngineCore that has stepped hands its free heap back to the
# OS (glibc's malloc_trim): a burst of varied batch shapes leaves hundreds of MB of freed but mapped
# arenas behind. A request arriving sooner wakes the loop as usual, so busy serving never pays for it.
_TRIM_AFTER_IDLE_S = 1.0
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only

# How long the loop waits for a request when it holds outputs the full ring refused:
# short enough to retry promptly, long enough not to spin a core the frontend needs.
_HELD_RETRY_S = 0.0005


class EngineCoreProc:
    """The busy loop around one EngineCore: it serves a list of frontends (``engine.core.frontends``),
    by default the one channel the core was started with. With ``attacher`` (``ringllm serve
    --api-server-count N``) API servers attach channels of their own while it runs, and the
    launcher's channel carries only SHUTDOWN; the loop is the same.

    Each turn: read every frontend in turn, starting one further along each time (each read takes
    at most one receive batch, so a busy frontend's requests never keep the next one waiting more
    than one turn); step; send each output to the frontend its request came from and each step's
    stats to every serving frontend (``share_stats``); try to send what waits. A frontend other
    than the launcher whose channel closes or whose process exits is dropped: its requests are
    aborted (their KV blocks freed) and the others are served on. The loop never blocks on a full
    output ring (``Frontend.flush``).
    """

    def __init__(
        self, core: EngineCore, channel: Any, engine_index: int, attacher: Optional[FrontendAttacher] = None
    ) -> None:
        self.core = core
        self.engine_index = engine_index
        self._attacher = attacher
        self._frontends = [Frontend(channel, os.getppid(), launcher=True, serves=attacher is None)]
        self._owner: dict[str, Frontend] = {}  # request id -> the frontend it came from
        self._turn = 0
        self._running = True
        self._stepped_since_trim = False
        self._stats_stale = False  # aborts changed the gauges and no step may follow

    def run_busy_loop(self) -> None:
        while self._running:
            # 1) take what every frontend sent; block only when there is nothing to do
            if self._attacher is not None and self._attacher.pending:
                self._attach()
            if not self.core.has_unfinished_requests():
                self._wait()
            self._read()
            # 2) step, and route each output to its frontend
            if self._running and self.core.has_unfinished_requests():
                self._stepped_since_trim = True
                outputs = self.core.step()
                # A step without outputs (a prompt chunk) still counted prefix-cache lookups and
                # preemptions: its stats go out too, merged into the next outputs when held.
                if outputs.outputs or outputs.scheduler_stats is not None:
                    self._route(outputs)
            elif self._stats_stale:  # aborts emptied the core: its gauges must not stay stale
                self._route(self.core.stats_only())
            self._stats_stale = False
            # 3) send what waits, as far as each ring takes it (never blocking)
            self._flush()

    def close(self) -> None:
        """Close the attached frontends' channels (after ``tell_dead``, so they hear why); the
        launcher's channel is main's to close."""
        for frontend in self._frontends[1:]:
            frontend.channel.close()

    def tell_dead(self, error: str) -> None:
        """The core cannot go on: every frontend hears why."""
        for frontend in self._frontends:
            _send_dead(frontend.channel, self.engine_index, error)

    # ---- frontends come and go
    def _attach(self) -> None:
        assert self._attacher is not None  # called only when API servers can attach
        for frontend in self._attacher.take():
            self._frontends.append(frontend)
            logger.info("%s attached (%d API server(s) now)", frontend.name, len(self._frontends) - 1)

    def _drop(self, frontend: Frontend, why: str) -> None:
        """A frontend is gone: abort what it asked for, free its KV blocks, close its rings."""
        self._frontends.remove(frontend)
        ids = list(frontend.requests)
        for req_id in ids:
            self._owner.pop(req_id, None)
        if ids:
            self.core.abort_requests(ids)
            self._stats_stale = self.core.log_stats
        frontend.channel.close()
        logger.log(
            logging.WARNING if ids or why != "closed its channel" else logging.INFO,
            "%s %s: %d of its requests aborted, %d API server(s) left",
            frontend.name,
            why,
            len(ids),
            len(self._frontends) - 1,
        )

    # ---- 1) requests in
    def _wait(self) -> None:
        """Sleep until a frontend sends something (briefly while outputs wait for ring space);
        after a second of idleness following work, return freed heap to the OS once."""
        frontends = self._frontends
        if any(f.outbox for f in frontends):
            timeout: Optional[float] = _HELD_RETRY_S
        elif self._stepped_since_trim and _malloc_trim is not None:
            timeout = _TRIM_AFTER_IDLE_S
        else:
            timeout = None
        started = time.monotonic()
        if self._attacher is None:  # one ring: its own receive spins briefly before the futex sleep
            self._handle_all(frontends[0], frontends[0].channel.recv_batch(timeout=timeout))
        else:  # every ring and the attacher at once (eventfds in poll)
            wait_any([f.channel for f in frontends], timeout, [self._attacher.fd])
            clear_eventfd(self._attacher.fd)
        if timeout == _TRIM_AFTER_IDLE_S and time.monotonic() - started >= timeout:  # idle all along
            assert _malloc_trim is not None  # the timeout is set only with it
            _malloc_trim(0)
            self._stepped_since_trim = False

    def _read(self) -> None:
        frontends = self._frontends
        self._turn = (self._turn + 1) % len(frontends)
        for frontend in frontends[self._turn :] + frontends[: self._turn]:
            try:
                msgs = frontend.channel.poll()
            except TransportError:
                if frontend.launcher:
                    raise  # the core's own channel: nobody is left to serve
                self._drop(frontend, "closed its channel")
                continue
            if not msgs and not frontend.launcher and not peer_alive(frontend.channel):
                self._drop(frontend, "exited")
                continue
            self._handle_all(frontend, msgs)

    def _handle_all(self, frontend: Frontend, msgs: list) -> None:
        for msg in msgs:
            self._handle(msg, frontend)

    def _handle(self, msg: Any, frontend: Frontend) -> None:
        if isinstance(msg, Shutdown) and frontend.launcher:
            self._running = False
        elif not frontend.serves or isinstance(msg, Shutdown):  # SHUTDOWN is the launcher's alone
            raise TypeError(f"EngineCore got an unexpected message {type(msg).__name__} from {frontend.name}")
        elif isinstance(msg, EngineCoreRequest):
            self._owner[msg.request_id] = frontend
            frontend.requests.add(msg.request_id)
            self.core.add_request(msg, params_verified=True)  # its decode verified them
        elif isinstance(msg, AbortRequests):
            for req_id in msg.request_ids:
                owner = self._owner.pop(req_id, None)
                if owner is not None:
                    owner.requests.discard(req_id)
            self.core.abort_requests(msg.request_ids)
            self._stats_stale = self.core.log_stats
        elif isinstance(msg, UtilityCall):
            frontend.outbox.append(self._call_utility(msg))
        else:
            raise TypeError(f"EngineCore got an unexpected message {type(msg).__name__} from {frontend.name}")

    def _call_utility(self, call: UtilityCall) -> UtilityResult:
        if call.method not in UTILITY_METHODS or not hasattr(self.core, call.method):
            return UtilityResult(call.call_id, error=f"utility method {call.method!r} is not allowed")
        try:
            return UtilityResult(call.call_id, result=getattr(self.core, call.method)(*call.args))
        except Exception as e:  # the caller gets the error; the engine keeps serving
            return UtilityResult(call.call_id, error=f"{type(e).__name__}: {e}")

    # ---- 2) outputs out
    def _route(self, outputs: EngineCoreOutputs) -> None:
        """Each output to the frontend its request came from (dropped if that frontend is gone);
        the step's stats to every serving frontend, its counters in the first one's copy only."""
        by_frontend: dict[int, list] = {}
        owner = self._owner
        for out in outputs.outputs:
            frontend = owner.get(out.request_id)
            if frontend is None:
                continue  # its frontend is gone (its requests were aborted)
            by_frontend.setdefault(id(frontend), []).append(out)
            if out.finish_reason is not None:
                del owner[out.request_id]
                frontend.requests.discard(out.request_id)
        stats = outputs.scheduler_stats
        counting = True
        for frontend in self._frontends:
            mine = by_frontend.get(id(frontend))
            if not frontend.serves or (mine is None and stats is None):
                continue
            frontend.publish(
                EngineCoreOutputs(self.engine_index, mine or [], outputs.timestamp, share_stats(stats, counting))
            )
            counting = False

    def _flush(self) -> None:
        for frontend in list(self._frontends):
            try:
                frontend.flush()
            except TransportError:
                if frontend.launcher:
                    raise
                self._drop(frontend, "is unreachable")


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
    threading.Thread(target=_exit_when_parent_dies, args=(spec.parent_pid,), daemon=True, name="parent-watch").start()
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


def _start_core(spec: CoreLaunchSpec) -> EngineCore:
    """The core built on the frontend's config, as sent (engine/core/launch.py)."""
    from engine.core.engine_core import EngineCore

    worker_cls = None
    if spec.worker_cls_pickle is not None:
        import base64

        import cloudpickle

        worker_cls = cloudpickle.loads(base64.b64decode(spec.worker_cls_pickle))
    return EngineCore(receive_config(spec, worker_cls), spec.engine_index)


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


def _attacher(spec: CoreLaunchSpec, ready: EngineReady) -> Optional[FrontendAttacher]:
    """With several API servers (``frontends_fd``), what attaches their channels as they arrive."""
    if spec.frontends_fd is None:
        return None
    import socket

    return FrontendAttacher(socket.socket(fileno=spec.frontends_fd), spec.transport, ready)


def main(argv: list[str]) -> int:
    ignore_group_signals()  # first: torch's import and the model load take seconds
    spec = read_spec(argv)
    sys.path.extend(p for p in spec.sys_path if p not in sys.path)
    _setup_process(spec)
    _configure_logging(spec.engine_index)
    channel = channel_class(spec.transport).attach(make_codec(), spec.token, peer_pid=spec.parent_pid)
    try:
        try:
            core = _start_core(spec)
        except Exception as exc:
            _send_dead(channel, spec.engine_index, _startup_cause(exc))
            return 1
        gc.collect()  # the model and libraries stay for good: keep them out of every collection
        gc.freeze()
        ready = EngineReady(
            engine_index=spec.engine_index,
            pid=os.getpid(),
            num_kv_blocks=core.num_kv_blocks,
            config_digest=spec.config_digest,
        )
        channel.send(ready, timeout=10.0)
        proc = EngineCoreProc(core, channel, spec.engine_index, _attacher(spec, ready))
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
            proc.close()
            core.stop_publishing()
        return 0
    finally:
        channel.close()
