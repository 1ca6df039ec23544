"""Waiting on several channels at once, from one thread that reads them all (an EngineCore
serving several API-server processes, one channel each).

A blocking ``recv_batch`` sleeps on one ring's futex; a reader of many cannot. So an idle reader
*arms* every ring it reads for an eventfd wake-up (the same Dekker pair as the asyncio side:
set "waiting", full fence, re-check), then sleeps in ``poll(2)`` on their data eventfds, their
peers' pidfds and any extra fd, and disarms on the way out. A producer writes the eventfd only
when it sees the flag, so channels that are busy cost no system call.
"""

from __future__ import annotations

import select
from typing import Iterable, Optional

from ._ring import lib
from .wakeup import clear_eventfd


def peer_alive(channel) -> bool:
    """Whether the channel's peer process still runs (its pidfd, polled at most every 20 ms)."""
    return channel._ends.peer_alive()


def wait_any(channels: Iterable, timeout: Optional[float], extra_fds: Iterable[int] = ()) -> None:
    """Return once any channel has a message to read (or was closed, or its peer exited), any of
    ``extra_fds`` is readable, or ``timeout`` seconds passed (None: no limit). What is ready is
    for the caller to read; spurious returns are allowed."""
    armed, fds = [], list(extra_fds)
    try:
        for ch in channels:
            e = ch._ends
            if e.life.closed or e.ready:
                return
            with e.life:
                if lib.ring_arm_data(e.c) or e.rx_closed():
                    return
                armed.append(e)
            fds.append(e.rx.data_efd)
            peer = e.res.peer
            if peer is not None and peer.fd is not None:
                fds.append(peer.fd)
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(None if timeout is None else max(0, int(timeout * 1000)))
    finally:
        for e in armed:
            if e.life.try_enter():
                try:
                    lib.ring_disarm_data(e.c)
                    clear_eventfd(e.rx.data_efd)
                finally:
                    e.life.leave()
