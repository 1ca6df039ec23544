"""The blocking half of Channel (its base class): send and receive, waiting in C (spin, then
futex) when needed.

A message that does not fit yet is finished by a Pusher thread once its call returns
(pusher.py): ``try_send`` never waits, and the channel still finishes what it accepted.

Waits run in slices of ``liveness_interval``; between slices they notice a deadline, a
``wakeup()``, a close, or the peer's death. Every public method runs inside a use of the mapping
(lifetime.py), so a close from another thread wakes the wait but never unmaps the rings under
it. The methods here *are* Channel's (inherited, not wrapped) and each takes its use itself,
written out rather than through a helper or ``with``: every message takes these paths, and a
call layer, or ``with lifetime`` (four Python calls) far more, is a visible share of a whole small
send's CPU (``benchmarks/RESULTS.md``, "Kernel choices").
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ._ring import lib
from .errors import TransportError
from .lifetime import closed_here
from .ring import BATCH_RECORDS, CLOSED, READY, raise_status
from .ring_ends import RingEnds

_ring_write = lib.ring_write
_DEAD = -100  # _wait_space: the peer has exited
_UNKNOWN = (None, None)  # send_info of a type outside the codec


class SyncSide:
    """Blocking send/receive over one channel's RingEnds (see the module docstring).

    ``_uses``, ``_life`` and ``_release`` are the ends' own, kept here so that taking a use
    costs one attribute look-up less."""

    def __init__(self, ends: RingEnds) -> None:
        self._ends = ends
        self._life, self._uses, self._release = ends.life, ends.uses, ends.release

    # ------------------------------------------------------------------ sending
    def try_send(self, msg: Any) -> bool:
        """Send without blocking; False (nothing sent) when the ring has no room now, or while an
        earlier message is still going out. True: accepted, and it arrives whole with no further
        call, even when it is larger than the free space (the rest follows as the reader frees
        space: pusher.py)."""
        e, uses = self._ends, self._uses
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            if e.pending is not None and not e.clear_way():
                if not e.peer_alive():
                    raise e.peer_error()
                return False
            kind, body = e.encode(msg)
            done = e.write(kind, body, 0)
            if done == len(body) + 1:
                return True
            if done < 0:
                raise_status(done, "send")
            if done == 0:
                if not e.peer_alive():
                    raise e.peer_error()
                return False
            e.pending = (kind, body, done)  # a big message is under way: finished in the background
            e.finish_later()
            return True
        finally:
            del uses[-1]
            if self._life.closed and not uses:
                self._release()

    def send(self, msg: Any, timeout: Optional[float] = None) -> None:
        """Send, waiting for space as long as needed (or ``timeout`` seconds: TimeoutError)."""
        e, uses = self._ends, self._uses
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            kind, probe = e.send_info.get(type(msg), _UNKNOWN)  # e.encode, inlined: the hot path
            if kind is not None and (probe is None or type(v := probe(msg)) is not bytes or len(v) < e.oob_min):
                body = e.encode_body(msg)
                n = len(body)
                if n >= e.max_message_size:
                    raise e.too_large(msg, n)
                if e.pending is None:
                    done = _ring_write(e.p, kind, body, n, 0)
                    if done == n + 1:
                        return
            else:
                kind, body = e.encode(msg)  # a TypeError, or large bytes fields go out of band
                n = len(body)
                if e.pending is None:
                    done = e.write(kind, body, 0)
                    if done == n + 1:
                        return
            if e.pending is None:
                if done < 0:
                    raise_status(done, "send")
                e.pending = (kind, body, done)
                self._send_slow(kind, body, False, timeout)
            else:
                self._send_slow(kind, body, True, timeout)  # an earlier half-sent message goes first
        finally:
            del uses[-1]
            if self._life.closed and not uses:
                self._release()

    def _send_slow(self, kind: int, body: Any, queued: bool, timeout: Optional[float]) -> None:
        """Finish ``body`` (already pending unless ``queued``: then after the half-sent message
        before it), waiting for space, or for the Pusher that finishes an earlier one."""
        e = self._ends
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                pusher = e.pusher
                if pusher is not None:
                    self._wait_pusher(pusher, deadline, timeout)
                    continue
                if e.pending is None:
                    if not queued:
                        return  # ours is out
                    queued = False
                    e.pending = (kind, body, 0)
                if e.flush_pending():
                    continue
                rc = self._wait_space(deadline)
                if rc == _DEAD:
                    raise e.peer_error()
                if rc == CLOSED:
                    raise e.peer_closed_error("send")
                if rc == lib.RING_TIMEOUT:
                    raise TimeoutError(f"send timed out after {timeout} s: the peer is not reading")
        except BaseException:
            e.forget_unsent(body)
            raise

    def _wait_pusher(self, pusher: Any, deadline: Optional[float], timeout: Optional[float]) -> None:
        """Wait one liveness slice (or until ``deadline``) for the Pusher to end. It ends by
        itself on a close or the peer's death; the caller then meets either."""
        if self._ends.life.closed:
            raise closed_here()
        left = self._ends.slice_ns / 1e9
        if deadline is not None:
            left = min(left, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"send timed out after {timeout} s: the peer is not reading")
        pusher.wait(left)

    def _wait_space(self, deadline: Optional[float]) -> int:
        """Wait until the reader frees space (READY) or the ring closes (CLOSED); between
        slices, notice the deadline (TIMEOUT) or the peer's death (_DEAD)."""
        e = self._ends
        while True:
            if e.life.closed:
                raise closed_here()
            if e.peer_dead:
                return _DEAD
            left = e.slice_ns
            if deadline is not None:
                left = min(left, int((deadline - time.monotonic()) * 1e9))
                if left <= 0:
                    return lib.RING_TIMEOUT
            rc = lib.ring_wait_space(e.p, e.spin_ns, left)
            if rc == READY or rc == CLOSED:
                return rc
            e.peer_alive()  # an empty slice: is the peer still there?

    # ------------------------------------------------------------------ receiving
    def poll(self, max_messages: Optional[int] = None) -> list:
        """Every message available now (at most ``max_messages``); ``[]`` if none. Never blocks.
        Raises ChannelClosed once the peer has closed and everything it sent has been read."""
        e, uses = self._ends, self._uses
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            out: list = []
            e.drain(out, max_messages)
            if not out and e.rx_closed():
                e.drain(out, max_messages)  # what was published just before the close
                if not out:
                    raise e.peer_closed_error("recv")
            return out
        finally:
            del uses[-1]
            if self._life.closed and not uses:
                self._release()

    def recv_batch(self, timeout: Optional[float] = None, max_messages: Optional[int] = None) -> list:
        """Block until at least one message is there, then return all available (at most
        ``max_messages``). Returns ``[]`` when ``timeout`` passes or ``wakeup()`` is called."""
        if timeout == 0:
            return self.poll(max_messages)
        uses = self._uses
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            out: list = []
            self._ends.drain(out, max_messages)
            if not out:
                self._wait_recv(out, max_messages, timeout)
            return out
        finally:
            del uses[-1]
            if self._life.closed and not uses:
                self._release()

    def recv(self, timeout: Optional[float] = None) -> Any:
        """The next message; TimeoutError if none came within ``timeout`` (or on ``wakeup()``)."""
        e, uses = self._ends, self._uses
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            if e.ready:
                return e.ready.popleft()
            out: list = []
            if timeout is None and not (e.woken or e.peer_dead):
                # The common case, inlined: one wait slice straight on the ring (see _wait_recv
                # and RingEnds.drain_ring).
                try:
                    e.rx.drain(e.decoders, out, BATCH_RECORDS, e.spin_ns, e.slice_ns)
                except TransportError:
                    e.keep(out)
                    raise
            elif timeout == 0:
                out = self.poll()
            if not out:
                self._wait_recv(out, None, timeout)
                if not out:
                    raise TimeoutError("recv timed out" if timeout is not None else "recv was woken up")
            if len(out) > 1:
                e.ready.extend(out[1:])
            return out[0]
        finally:
            del uses[-1]
            if self._life.closed and not uses:
                self._release()

    def _wait_recv(self, out: list, max_messages: Optional[int], timeout: Optional[float]) -> None:
        """Wait for at least one message; between slices, notice a wakeup, the deadline, a
        close, or the peer's death."""
        e = self._ends
        deadline = None if timeout is None else time.monotonic() + timeout
        room = BATCH_RECORDS if max_messages is None else min(max_messages, BATCH_RECORDS)
        while True:
            if e.life.closed:
                raise closed_here()
            if e.woken:
                e.woken = False
                return
            left = e.slice_ns
            if deadline is not None:
                left = min(left, int((deadline - time.monotonic()) * 1e9))
                if left <= 0:
                    return
            if e.peer_dead:
                left = 0
            try:  # e.drain_ring, inlined: the wait of every receive that finds the ring empty
                n = e.rx.drain(e.decoders, out, room, e.spin_ns, left)
            except TransportError:
                e.keep(out)
                raise
            if out:
                if n == room and max_messages is None:
                    e.drain(out, None)  # there may be more
                return
            if n == CLOSED:
                raise e.peer_closed_error("recv")
            if n == 0 and not e.peer_alive():
                e.drain(out, max_messages)
                if not out:
                    raise e.peer_error()
                return

    def wakeup(self) -> None:
        """Make a ``recv``/``recv_batch`` blocked in another thread return early (or the next
        one, if none is blocked now). A no-op on a closed channel."""
        e = self._ends
        if e.life.try_enter():
            try:
                e.woken = True
                lib.ring_kick(e.c)
            finally:
                e.life.leave()
