"""An EngineCore serving several API-server processes (``ringllm serve --api-server-count N``).

Each API server has a ring pair of its own to the core; nothing is brokered. The launcher's own
channel (the one every core has, ``EngineCoreProc.channel``) carries the start-up READY and the
final SHUTDOWN, and its loss ends the core as it always did. The API servers' channels arrive
over a Unix socket from the launcher (``shm_transport.handoff``), at start and whenever a killed
API server is replaced, so the core never restarts for a frontend.

The loop is ``EngineCoreProc``'s with three differences:

- it reads every channel each turn, starting one further along each time (a busy API server's
  requests never keep the next one waiting more than one turn: each read takes at most one
  receive batch);
- each output goes to the channel its request came from, each step's scheduler stats to every
  API server (so each one's gauges are the core's), with the step's counters in one message only
  (so the sum over the API servers' /metrics counts each once, ``openai/metrics_fanin.py``);
- an API server whose process is gone loses its channel: its requests are aborted (their KV
  blocks freed) and the others are served on.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from typing import Any, Optional

from engine.config.wire import config_digest
from engine.core.engine_core_proc import _HELD_RETRY_S, _TRIM_AFTER_IDLE_S, EngineCoreProc, _malloc_trim, _send_dead
from engine.core.launch import channel_class, make_codec
from engine.wire_messages import (AbortRequests, EngineCoreOutputs, EngineCoreRequest, EngineReady, SchedulerStats,
                                  UtilityCall, merge_outputs)
from shm_transport import TransportError
from shm_transport.channel_set import peer_alive, wait_any
from shm_transport.handoff import close_token_fds, recv_token

logger = logging.getLogger(__name__)


class _Frontend:
    """One API server as the core sees it: its channel, what waits to go out, its requests."""

    __slots__ = ("channel", "pid", "outbox", "requests")

    def __init__(self, channel: Any, pid: int) -> None:
        self.channel, self.pid = channel, pid
        self.outbox: deque = deque()
        self.requests: set[str] = set()


class MultiFrontendCoreProc(EngineCoreProc):
    """The busy loop of a core with one channel per API server (see the module docstring)."""

    def __init__(self, core: Any, channel: Any, engine_index: int, config: Any, transport: str,
                 attach_socket: Any) -> None:
        super().__init__(core, channel, engine_index)
        self._config, self._transport = config, transport
        self._frontends: list[_Frontend] = []
        self._owner: dict[str, _Frontend] = {}
        self._turn = 0
        self._arrivals: deque = deque()
        self._arrival_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._attacher = threading.Thread(target=self._receive_frontends, args=(attach_socket,), daemon=True,
                                          name="frontend-attach")
        self._attacher.start()

    # ---- API servers come and go
    def _receive_frontends(self, sock: Any) -> None:
        """Attach each channel end the launcher sends; the loop takes them up between turns."""
        codec = make_codec()
        while True:
            try:
                token, meta = recv_token(sock)
            except (EOFError, OSError):
                return  # the launcher is gone (the core follows it through its own channel)
            try:
                pid = json.loads(meta)["pid"]
                channel = channel_class(self._transport).attach(codec, token, peer_pid=pid)
            except Exception as e:  # a server that died before its end arrived: nothing to serve
                close_token_fds(token)
                logger.warning("an API server's channel could not be attached: %s", e)
                continue
            self._arrivals.append(_Frontend(channel, pid))
            os.eventfd_write(self._arrival_efd, 1)

    def _take_arrivals(self) -> None:
        while self._arrivals:
            frontend = self._arrivals.popleft()
            frontend.outbox.append(EngineReady(engine_index=self.engine_index, pid=os.getpid(),
                                               num_kv_blocks=self.core.num_kv_blocks,
                                               config_digest=config_digest(self._config)))
            self._frontends.append(frontend)
            logger.info("API server pid %d attached (%d now)", frontend.pid, len(self._frontends))

    def _drop(self, frontend: _Frontend, why: str) -> None:
        """The API server is gone: abort what it asked for, free its KV blocks, close its rings."""
        self._frontends.remove(frontend)
        ids = list(frontend.requests)
        for req_id in ids:
            self._owner.pop(req_id, None)
        if ids:
            self.core.abort_requests(ids)
            self._stats_stale = self.core.log_stats
        frontend.channel.close()
        logger.log(logging.WARNING if ids or why != "closed its channel" else logging.INFO,
                   "API server pid %d %s: %d of its requests aborted, %d API server(s) left", frontend.pid, why,
                   len(ids), len(self._frontends))

    # ---- the loop
    def run_busy_loop(self) -> None:
        try:
            while self._running:
                if self._arrivals:
                    self._take_arrivals()
                # 1) take what every frontend sent, in turn; block only when there is nothing to do
                if not self.core.has_unfinished_requests():
                    self._wait()
                for msg in self.channel.poll():  # the launcher's: SHUTDOWN (a lost channel ends the core)
                    self._handle(msg)
                self._read_frontends()
                # 2) step, and route each output to its API server (never blocking on a full ring)
                if self._running and self.core.has_unfinished_requests():
                    self._stepped_since_trim = True
                    outputs = self.core.step()
                    if outputs.outputs or outputs.scheduler_stats is not None:
                        self._route(outputs)
                elif self._stats_stale:
                    self._route(self.core.stats_only())
                self._stats_stale = False
                self._flush_all()
        finally:
            for frontend in list(self._frontends):
                frontend.channel.close()

    def _wait(self) -> None:
        channels = [self.channel] + [f.channel for f in self._frontends]
        held = any(f.outbox for f in self._frontends)
        if held:
            timeout: Optional[float] = _HELD_RETRY_S
        elif self._stepped_since_trim and _malloc_trim is not None:
            timeout = _TRIM_AFTER_IDLE_S
        else:
            timeout = None
        started = time.monotonic()
        wait_any(channels, timeout, [self._arrival_efd])
        try:
            os.eventfd_read(self._arrival_efd)
        except BlockingIOError:
            pass
        if timeout == _TRIM_AFTER_IDLE_S and time.monotonic() - started >= timeout:  # idle all along
            _malloc_trim(0)
            self._stepped_since_trim = False

    def _read_frontends(self) -> None:
        frontends = self._frontends
        n = len(frontends)
        if not n:
            return
        self._turn = (self._turn + 1) % n
        for frontend in frontends[self._turn:] + frontends[:self._turn]:
            try:
                msgs = frontend.channel.poll()
            except TransportError:
                self._drop(frontend, "closed its channel")
                continue
            if not msgs and not peer_alive(frontend.channel):
                self._drop(frontend, "exited")
                continue
            for msg in msgs:
                self._handle_from(msg, frontend)

    def _handle_from(self, msg: Any, frontend: _Frontend) -> None:
        if isinstance(msg, EngineCoreRequest):
            self._owner[msg.request_id] = frontend
            frontend.requests.add(msg.request_id)
            self.core.add_request(msg, params_verified=True)  # its decode verified them
        elif isinstance(msg, AbortRequests):
            for req_id in msg.request_ids:
                if self._owner.pop(req_id, None) is not None:
                    frontend.requests.discard(req_id)
            self.core.abort_requests(msg.request_ids)
            self._stats_stale = self.core.log_stats
        elif isinstance(msg, UtilityCall):
            frontend.outbox.append(self._call_utility(msg))
        else:  # an API server may not stop the core (SHUTDOWN is the launcher's)
            raise TypeError(f"EngineCore got an unexpected message {type(msg).__name__} from an API server")

    def _route(self, outputs: EngineCoreOutputs) -> None:
        by_frontend: dict[int, list] = {}
        owner = self._owner
        for out in outputs.outputs:
            frontend = owner.get(out.request_id)
            if frontend is None:
                continue  # its API server is gone (its requests were aborted)
            by_frontend.setdefault(id(frontend), []).append(out)
            if out.finish_reason is not None:
                del owner[out.request_id]
                frontend.requests.discard(out.request_id)
        stats = outputs.scheduler_stats
        for i, frontend in enumerate(self._frontends):
            mine = by_frontend.get(id(frontend))
            if mine is None and stats is None:
                continue
            self._publish_to(frontend, EngineCoreOutputs(self.engine_index, mine or [], outputs.timestamp,
                                                         _share(stats, counting=i == 0)))

    def _publish_to(self, frontend: _Frontend, outputs: EngineCoreOutputs) -> None:
        box = frontend.outbox
        if box and isinstance(box[-1], EngineCoreOutputs):
            merge_outputs(box[-1], outputs)
        else:
            box.append(outputs)

    def _flush_all(self) -> None:
        for frontend in list(self._frontends):
            try:
                self._flush_one(frontend)
            except TransportError:
                self._drop(frontend, "is unreachable")

    def _flush_one(self, frontend: _Frontend) -> None:
        box, channel = frontend.outbox, frontend.channel
        while box:
            msg = box[0]
            if isinstance(msg, EngineCoreOutputs):
                msg.timestamp = time.monotonic()
            if not channel.try_send(msg):
                return
            box.popleft()

    def tell_dead(self, error: str) -> None:
        """The core cannot go on: every API server and the launcher hear why."""
        for frontend in self._frontends:
            _send_dead(frontend.channel, self.engine_index, error)
        _send_dead(self.channel, self.engine_index, error)


def _share(stats: Optional[SchedulerStats], counting: bool) -> Optional[SchedulerStats]:
    """The stats one API server gets: the gauges always, the step's counters only in the
    counting server's copy (the first attached), so that their sum counts each once."""
    if stats is None or counting:
        return stats
    return SchedulerStats(stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage)
