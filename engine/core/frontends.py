"""The frontends an EngineCore serves, as its busy loop (``engine_core_proc.EngineCoreProc``) sees
them: one channel end each, with what waits to go out on it and the requests that came in on it.

By default the loop serves one frontend, the channel the core was started with. With
``ringllm serve --api-server-count N`` each API server has a ring pair of its own to the core
(nothing is brokered): their channel ends arrive over a Unix socket from the launcher
(``shm_transport.handoff``), at start and whenever a killed API server is replaced, so the core
never restarts for a frontend. The launcher's own channel then carries only the start-up READY
and the final SHUTDOWN. This module attaches them (``FrontendAttacher``); serving, routing and
dropping them is the loop's.

It imports nothing of the loop: the loop imports it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from typing import Any, Optional

from engine.core.launch import channel_class, make_codec
from engine.wire_messages import EngineCoreOutputs, EngineReady, SchedulerStats, merge_outputs
from shm_transport.handoff import close_token_fds, recv_token

logger = logging.getLogger(__name__)


class Frontend:
    """One channel end of the core, and what the loop keeps for it.

    ``launcher``: the channel the core was started with; SHUTDOWN may come only on it, and its
    loss ends the core (another frontend's loss ends only that frontend's requests).
    ``serves``: it sends requests, aborts and utility calls and gets outputs and each step's
    stats; the launcher does not once API servers attach their own channels.

    Contract: every message for the frontend goes through ``outbox``, in order; ``flush`` only
    ever *tries* to send, so a full output ring never stops the loop from draining requests and
    stepping.
    """

    __slots__ = ("channel", "pid", "launcher", "serves", "outbox", "requests")

    def __init__(self, channel: Any, pid: int, *, launcher: bool = False, serves: bool = True) -> None:
        self.channel, self.pid = channel, pid
        self.launcher, self.serves = launcher, serves
        self.outbox: deque = deque()
        self.requests: set[str] = set()  # ids of its requests the core still runs

    @property
    def name(self) -> str:
        return f"{'the launcher' if self.launcher else 'API server'} pid {self.pid}"

    def publish(self, outputs: EngineCoreOutputs) -> None:
        """Queue ``outputs``; merged into the outputs message already waiting at the end of the
        outbox if there is one (one entry per request), so what a full ring holds back grows with
        the requests, not with the steps. The only merge of outputs on the core's side."""
        box = self.outbox
        if box and isinstance(box[-1], EngineCoreOutputs):
            merge_outputs(box[-1], outputs)
        else:
            box.append(outputs)

    def flush(self) -> None:
        """Send what waits, in order, as far as the ring takes it (never blocking)."""
        box, channel = self.outbox, self.channel
        while box:
            msg = box[0]
            if isinstance(msg, EngineCoreOutputs):
                msg.timestamp = time.monotonic()  # for the frontend's publish-to-receive latency
            if not channel.try_send(msg):
                return
            box.popleft()


def share_stats(stats: Optional[SchedulerStats], counting: bool) -> Optional[SchedulerStats]:
    """The stats one frontend gets of a step: the gauges always, the step's counters only in the
    counting frontend's copy (the first serving one), so that a sum over the API servers'
    /metrics counts each once (``openai/metrics_fanin.py``)."""
    if stats is None or counting:
        return stats
    return SchedulerStats(stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage)


class FrontendAttacher:
    """Attaches the channel ends the launcher sends over ``sock``, on a thread of its own (a
    blocking receive); the loop takes them between turns (``take``), each with ``ready`` queued
    as its first message, and sleeps on ``fd`` as well as on the rings (written per arrival)."""

    def __init__(self, sock: Any, transport: str, ready: EngineReady) -> None:
        self._transport, self._ready = transport, ready
        self._arrivals: deque[Frontend] = deque()
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        threading.Thread(target=self._receive, args=(sock,), daemon=True, name="frontend-attach").start()

    @property
    def pending(self) -> bool:
        return bool(self._arrivals)

    def take(self) -> list[Frontend]:
        """The frontends attached since the last call, READY first in each one's outbox."""
        taken = []
        while self._arrivals:
            frontend = self._arrivals.popleft()
            frontend.outbox.append(self._ready)
            taken.append(frontend)
        return taken

    def _receive(self, sock: Any) -> None:
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
            self._arrivals.append(Frontend(channel, pid))
            os.eventfd_write(self.fd, 1)
