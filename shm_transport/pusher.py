"""Finishing a half-sent message in the background: the channel finishes what it starts.

A message larger than the ring's free space goes out as fragments, as far as space allows, and
it blocks every later message until its last fragment is in. When the call that started it
returns first (``try_send`` accepted it; a ``send`` or ``send_async`` timed out or was cancelled
mid-way), a ``Pusher`` thread writes the rest as the reader frees space. So an accepted message
arrives whole whether or not its sender ever sends again: a 4 MB request on an idle server, or
the EngineCore's prompt logprobs, no longer wait for the next message to push them out.

Why a thread, and not the caller's loop: the sync ends have no loop to drive the rest from (the
EngineCore's busy loop must never wait for ring space, LLM's thread sits in a blocking receive,
and a thread that happens to run an event loop, a notebook's, may be blocked in that receive
too). Such messages are rare (the default ring is 4 MiB), so one short-lived thread each costs
nothing where it matters: the send fast paths still test only ``RingEnds.pending``.

While a pusher runs it alone writes to the ring and waits for space: ``try_send`` answers False,
``send`` waits for the pusher to end, ``send_async`` awaits it (woken through
``call_soon_threadsafe``, so the loop never blocks). It holds a use of the mapping
(lifetime.py) until it ends: on the last fragment, a close, the peer's death or a ring error
(which the next send then meets itself).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ._ring import lib
from .errors import TransportError
from .ring import CLOSED, READY


class Pusher:
    """One background writer of ``ends.pending`` (a RingEnds). Start it with ``RingEnds.finish_later``."""

    def __init__(self, ends: Any) -> None:
        self._ends = ends
        self._done = threading.Event()
        self._lock = threading.Lock()  # orders add_done_callback against the end
        self._callbacks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="shm-transport-pusher", daemon=True)

    def start(self) -> None:
        """Called with ``ends.push_lock`` held and a use of the mapping taken for the thread."""
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for the pusher to end; True once it has."""
        return self._done.wait(timeout)

    def add_done_callback(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (from the pusher's thread) when it ends; False if it has already."""
        with self._lock:
            if self._done.is_set():
                return False
            self._callbacks.append(callback)
            return True

    def _run(self) -> None:
        e = self._ends
        try:
            self._push(e)
        finally:
            with e.push_lock:  # ended early (a close, the peer's death): the next send decides
                if e.pusher is self:
                    e.pusher = None
            with self._lock:
                self._done.set()
                callbacks, self._callbacks = self._callbacks, []
            e.life.leave()  # the thread's use; after it, nothing here touches the mapping
            for callback in callbacks:
                callback()

    def _push(self, e: Any) -> None:
        """Write fragments as space frees, until nothing is half-sent (a message the sender
        started meanwhile included: see RingEnds.finish_later) or the channel cannot go on."""
        while not e.life.closed:
            if e.pending is None:
                with e.push_lock:  # atomic with finish_later: a message started now is ours
                    if e.pending is None:
                        e.pusher = None
                        return
                continue
            try:
                if e.flush_pending():
                    continue
            except TransportError:  # closed by the peer, or corrupt: the next send raises it
                return
            rc = lib.ring_wait_space(e.p, e.spin_ns, e.slice_ns)
            if rc == CLOSED:
                return
            if rc != READY and not e.peer_alive():
                return
