"""The EngineCore in its own process: launched by the frontend (``CoreProcess``) as
``python -m engine.core.engine_core_proc TOKEN SPEC``, where it runs ``EngineCoreProc``.

``subprocess`` rather than multiprocessing: the user's ``__main__`` is never re-imported
and the ring's file descriptors arrive through ``pass_fds``. ``SPEC`` is a JSON
``CoreLaunchSpec``. torch is imported only after the thread count and ``OMP_WAIT_POLICY``
are set (FACTS.md: an OpenMP thread that spins while its partner core runs the frontend
makes a decode step many times slower).

This module's top level imports no torch: the frontend side lives here too.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, Optional

import msgspec

from engine import envs
from engine.exceptions import EngineStartupError
from engine.protocol import (MESSAGE_TYPES, AbortRequests, EngineCoreOutput, EngineCoreOutputs,
                             EngineCoreRequest, EngineDead, EngineReady, LogprobsLists, Shutdown,
                             UtilityCall, UtilityResult)
from shm_transport import TransportError

logger = logging.getLogger(__name__)

# EngineCore methods a frontend may call through UTILITY; nothing else is reachable.
UTILITY_METHODS = frozenset({"get_stats", "reset_prefix_cache", "has_unfinished_requests"})

# How long the loop waits for a request when it holds outputs the full ring refused:
# short enough to retry promptly, long enough not to spin a core the frontend needs.
_HELD_RETRY_S = 0.0005


class CoreLaunchSpec(msgspec.Struct):
    transport: str  # "shm" | "zmq"
    engine_index: int
    num_threads: int
    parent_pid: int
    # SIGKILL on parent death; only when launched from the main thread, because the
    # signal follows the launching *thread*, which may end long before the frontend.
    pdeathsig: bool
    engine_args: dict[str, Any]  # EngineArgs fields; the core derives its own config
    # The frontend's import path, appended to the core's own, so a worker_cls the frontend
    # imports by name imports in the core too (as multiprocessing's spawn passes sys.path).
    sys_path: list[str] = []


def make_codec():
    from shm_transport import MsgspecCodec

    return MsgspecCodec(list(MESSAGE_TYPES))


def channel_class(transport: str):
    if transport == "zmq":
        from shm_transport.zmq_channel import ZmqChannel

        return ZmqChannel
    from shm_transport import Channel

    return Channel


def command_line(token: str, spec: CoreLaunchSpec) -> list[str]:
    return [sys.executable, "-m", "engine.core.engine_core_proc", token, msgspec.json.encode(spec).decode()]


def engine_args_dict(args: Any) -> dict[str, Any]:
    """The EngineArgs fields of ``args`` as JSON-able values (an AsyncEngineArgs carries
    frontend-only extras; a CompilationConfig travels as its dict)."""
    from engine.config import EngineArgs

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs)}
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in values.items()}


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

    def __init__(self, config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.ready: Optional[EngineReady] = None
        self.proc: Optional[subprocess.Popen] = None
        self.pidfd: Optional[int] = None
        self.channel = channel_class(config.transport).create(make_codec(), capacity=config.ring_capacity)
        try:
            args = engine_args_dict(config.engine_args)
            args["worker_cls"] = config.worker_cls  # a class travels by its name
            if config.parallel_config.data_parallel_size > 1:
                args["data_parallel_rank"] = engine_index
            spec = CoreLaunchSpec(
                transport=config.transport, engine_index=engine_index, num_threads=config.num_threads,
                parent_pid=os.getpid(), pdeathsig=threading.current_thread() is threading.main_thread(),
                engine_args=args, sys_path=[os.path.abspath(p) for p in sys.path])
            # The OpenMP settings go in the environment too, so they hold even if something
            # imports torch before the core's own start-up code runs (FACTS.md: threads).
            env = dict(os.environ, OMP_NUM_THREADS=str(config.num_threads))
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            self.proc = subprocess.Popen(command_line(self.channel.peer_token(), spec),
                                         pass_fds=self.channel.peer_fds(), env=env,
                                         stdin=subprocess.DEVNULL)
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


def launch_cores(config: Any, engine_indices: list[int]) -> list[CoreProcess]:
    """Start the cores together (each imports torch and loads the model), then wait for all."""
    cores: list[CoreProcess] = []
    try:
        for i in engine_indices:
            cores.append(CoreProcess(config, i))
        for core in cores:
            core.wait_ready(envs.RINGLLM_ENGINE_READY_TIMEOUT_S)
        return cores
    except BaseException:
        close_cores(cores, timeout=0)
        raise


def close_cores(cores: list[CoreProcess], timeout: float = 5.0) -> None:
    for core in cores:  # all told first, so data-parallel cores wind down together
        core.request_exit()
    for core in cores:
        core.close(timeout)


def _merge_output(into: EngineCoreOutput, new: EngineCoreOutput) -> None:
    into.new_token_ids.extend(new.new_token_ids)
    for name in ("new_logprobs", "new_prompt_logprobs"):
        a, b = getattr(into, name), getattr(new, name)
        if a is None:
            setattr(into, name, b)
        elif b is not None:
            setattr(into, name, LogprobsLists(a.token_ids + b.token_ids, a.logprobs + b.logprobs,
                                              a.ranks + b.ranks))
    into.finish_reason, into.stop_reason = new.finish_reason, new.stop_reason
    into.error, into.internal_error = new.error, new.internal_error


def merge_outputs(into: EngineCoreOutputs, new: EngineCoreOutputs) -> None:
    """Fold a later step into outputs not yet published: one entry per request, so what the
    core holds while the frontend is slow stays bounded by the number of live requests."""
    index = {o.request_id: o for o in into.outputs}
    for out in new.outputs:
        held = index.get(out.request_id)
        if held is None or held.finished:
            into.outputs.append(out)
            index[out.request_id] = out
        else:
            _merge_output(held, out)
    into.scheduler_stats = new.scheduler_stats or into.scheduler_stats
    if new.finished_requests:
        into.finished_requests = (into.finished_requests or []) + new.finished_requests


class EngineCoreProc:
    """The busy loop around one EngineCore and the core end of one channel.

    Contract: every message for the frontend goes through ``_outbox``, in order; the loop
    only ever *tries* to publish, so a full output ring never stops it from draining
    requests and stepping. Consecutive outputs waiting in the outbox merge into one.
    """

    def __init__(self, core: Any, channel: Any, engine_index: int) -> None:
        self.core = core
        self.channel = channel
        self.engine_index = engine_index
        self._outbox: deque = deque()
        self._running = True

    def run_busy_loop(self) -> None:
        while self._running:
            # 1) take every request that has arrived; block only when there is nothing to do
            if self.core.has_unfinished_requests():
                msgs = self.channel.poll()
            else:
                msgs = self.channel.recv_batch(timeout=_HELD_RETRY_S if self._outbox else None)
            for msg in msgs:
                self._handle(msg)
            # 2) step and publish (never blocking on a full output ring)
            if self._running and self.core.has_unfinished_requests():
                outputs = self.core.step()
                if outputs.outputs or outputs.finished_requests:
                    self._publish(outputs)
            self._flush()

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, EngineCoreRequest):
            self.core.add_request(msg)
        elif isinstance(msg, AbortRequests):
            self.core.abort_requests(msg.request_ids)
        elif isinstance(msg, UtilityCall):
            self._outbox.append(self._call_utility(msg))
        elif isinstance(msg, Shutdown):
            self._running = False
        else:
            raise TypeError(f"EngineCore got an unexpected message {type(msg).__name__}")

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
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OMP_NUM_THREADS"] = str(spec.num_threads)
    import torch  # first import of torch in this process, after the two settings above

    torch.set_num_threads(spec.num_threads)


def _start_core(spec: CoreLaunchSpec) -> Any:
    from engine.config import EngineArgs, create_engine_config
    from engine.core.engine_core import EngineCore

    config = create_engine_config(EngineArgs(**spec.engine_args))
    return config, EngineCore(config)


def _send_dead(channel: Any, engine_index: int, error: str) -> None:
    try:
        channel.send(EngineDead(error, engine_index), timeout=1.0)
    except Exception:  # the frontend is gone or not reading: nothing more to tell it
        pass


def main(argv: list[str]) -> int:
    ignore_group_signals()  # first: torch's import and the model load take seconds
    token, spec = argv[0], msgspec.json.decode(argv[1], type=CoreLaunchSpec)
    sys.path.extend(p for p in spec.sys_path if p not in sys.path)
    _setup_process(spec)
    logging.basicConfig(level=envs.RINGLLM_LOGGING_LEVEL,
                        format=f"(EngineCore_{spec.engine_index} pid={os.getpid()}) %(levelname)s %(name)s: %(message)s")
    channel = channel_class(spec.transport).attach(make_codec(), token, peer_pid=spec.parent_pid)
    try:
        try:
            config, core = _start_core(spec)
        except Exception:
            _send_dead(channel, spec.engine_index, f"EngineCore failed to start:\n{traceback.format_exc()}")
            return 1
        gc.collect()  # the model and libraries stay for good: keep them out of every collection
        gc.freeze()
        channel.send(EngineReady(
            engine_index=spec.engine_index, pid=os.getpid(), num_kv_blocks=core.num_kv_blocks,
            block_size=config.cache_config.block_size, max_model_len=config.model_config.max_model_len,
            vocab_size=config.model_config.vocab_size), timeout=10.0)
        try:
            EngineCoreProc(core, channel, spec.engine_index).run_busy_loop()
        except TransportError:
            return 1  # the frontend is gone or closed the channel: nobody left to tell
        except Exception:
            logger.exception("EngineCore %d died", spec.engine_index)
            _send_dead(channel, spec.engine_index, traceback.format_exc())
            return 1
        return 0
    finally:
        channel.close()


if __name__ == "__main__":
    code = main(sys.argv[1:])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the channel is closed and nothing else needs saving: skip torch's slow teardown
