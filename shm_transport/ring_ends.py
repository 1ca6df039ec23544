"""What a Channel's sync and asyncio halves share: the two ring ends and the steps both take.

``RingEnds`` owns the resources (segments, eventfds, the peer's pidfd) and their lifetime
(lifetime.py: every step that touches the mapping runs inside a use), the messages decoded
but not yet returned, the half-sent fragmented message (and the Pusher thread that finishes
it when its sender has returned: pusher.py), and the peer's liveness. The halves
(channel_sync.py, channel_async.py) add only their way of waiting: futex, or eventfd on a loop.
Neither half reaches past this API into the other.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any, Callable, Optional

from ._ring import lib
from .codec import OOB_KIND, OOB_MIN
from .endpoints import Resources
from .errors import ChannelClosed, MessageTooLarge, PeerDied, TransportError
from .lifetime import Lifetime, closed_here
from .pusher import Pusher
from .ring import BATCH_RECORDS, Consumer, Gather, Producer, raise_status

_ring_write = lib.ring_write

DEFAULT_SPIN_US = 10.0
BATCH_BYTES = 256 << 10  # the byte budget of one receive batch (see channel.py)


class RingEnds:
    """The shared state of one channel (see the module docstring). Attributes are the API:

    ``tx``/``rx`` the Producer/Consumer, ``p``/``c`` their C handles, ``life`` the Lifetime
    (``uses`` its list), ``ready`` decoded messages not yet returned, ``pending`` the
    ``(kind, body, done)`` of a half-sent fragmented message, ``pusher`` the Pusher writing it
    while its sender is gone (``push_lock`` orders its end against ``finish_later``), ``woken`` a
    ``wakeup()`` not yet seen by a receive, ``spin_ns``/``slice_ns`` the sync waits' spin and
    liveness slice.
    """

    def __init__(self, codec: Any, tx: Producer, rx: Consumer, res: Resources, max_message_size: int) -> None:
        if not all(hasattr(codec, a) for a in ("kind_and_body", "kind_of", "encode_body", "decoders")):
            raise TypeError(f"codec must be a MsgspecCodec, got {type(codec).__name__}")
        self.codec = codec
        self.tx, self.rx = tx, rx
        rx.set_batch_bytes(BATCH_BYTES)
        self.p, self.c = tx.handle, rx.handle
        self.res = res
        self.release = weakref.finalize(self, res.release)
        # Not at interpreter exit: a daemon thread may still be blocked in a wait on the
        # mapping; the OS reclaims everything at exit and the peer sees PeerDied instead.
        self.release.atexit = False
        self.life = Lifetime(self.release)
        self.uses = self.life.uses
        self.max_message_size = max_message_size
        self.oob_min = OOB_MIN  # a bytes field this long goes out of band (larger than any: never)
        self.spin_ns = int(DEFAULT_SPIN_US * 1000)
        self.slice_ns = 100_000_000
        self.ready: collections.deque = collections.deque()
        self.pending: Optional[tuple] = None  # (kind, body, done); body: bytes, or a Gather (OOB_KIND)
        self.pusher: Optional[Pusher] = None
        self.push_lock = threading.Lock()
        self.woken = False
        self.peer_dead = False
        self._peer_checked = 0.0
        self.kind_of = codec.kind_of
        self.send_info = codec.send_info
        self.encode_body = codec.encode_body
        self.decoders = codec.decoders

    # ------------------------------------------------------------------ lifetime and errors
    def close(self, also: Callable[[], None]) -> bool:
        """Mark both rings closed and wake every sleeper on both sides, then run ``also``,
        inside a use (lifetime.py); False if already closed."""

        def notify() -> None:
            self.tx.close()
            self.rx.close()
            also()

        return self.life.close(notify)

    def peer_closed_error(self, where: str) -> ChannelClosed:
        """The error of a ring found closed: by this process, or by the peer."""
        if self.life.closed:
            return closed_here()
        return ChannelClosed(f"{where}: the peer closed the channel")

    def peer_error(self) -> PeerDied:
        peer = self.res.peer
        return PeerDied(peer.describe() if peer else "peer died")

    def peer_alive(self) -> bool:
        """False once the peer has exited. Polls its pidfd at most every 20 ms."""
        if self.peer_dead:
            return False
        peer = self.res.peer
        if peer is None:
            return True
        now = time.monotonic()
        if now - self._peer_checked < 0.02:
            return True
        self._peer_checked = now
        if not peer.alive():
            self.peer_dead = True
        return not self.peer_dead

    # ------------------------------------------------------------------ sending
    def encode(self, msg: Any) -> tuple[int, Any]:
        """(kind byte, body): the msgpack bytes, or (OOB_KIND, a Gather) when large bytes
        fields go out of band (copied once, straight into the ring; see codec.py)."""
        codec = self.codec
        kind = self.kind_of.get(type(msg))
        if kind is None:
            kind, body = codec.kind_and_body(msg)  # raises the TypeError naming the type
        names = codec.oob_fields[kind]
        if names:
            parts = codec.oob_parts(msg, kind, names, self.oob_min)
            if parts is not None:
                body = Gather(parts)
                if len(body) < self.max_message_size:
                    return OOB_KIND, body
        body = self.encode_body(msg)
        if len(body) >= self.max_message_size:
            raise self.too_large(msg, len(body))
        return kind, body

    def too_large(self, msg: Any, n: int) -> MessageTooLarge:
        return MessageTooLarge(
            f"{type(msg).__name__} encodes to {n + 1} bytes; max_message_size is {self.max_message_size}"
        )

    def write(self, kind: int, body: Any, done: int) -> int:
        """Write kind||body from byte ``done`` on (see ring_write); the new progress."""
        if type(body) is bytes:
            return _ring_write(self.p, kind, body, len(body), done)
        return body.write(self.p, kind, done)

    def flush_pending(self) -> bool:
        """Push on with a half-sent fragmented message; True when none is left."""
        assert self.pending is not None  # called with a message half-sent
        kind, body, done = self.pending
        done = self.write(kind, body, done)
        if done < 0:
            raise_status(done, "send")
        if done == len(body) + 1:
            self.pending = None
            return True
        self.pending = (kind, body, done)
        return False

    def clear_way(self) -> bool:
        """Before a new message, without waiting: True when nothing earlier is half-sent (pushing
        on with one that is, unless a Pusher owns it: only this thread starts pushers, so once
        none is seen, none appears)."""
        if self.pusher is not None:
            return False
        return self.pending is None or self.flush_pending()

    def finish_later(self) -> None:
        """The sending call returns with a message half-sent: a Pusher thread finishes it as the
        reader frees space (pusher.py). A no-op when nothing is half-sent, a pusher already runs
        (it takes this message on too), or the channel is closed or its peer dead."""
        with self.push_lock:
            if self.pending is None or self.pusher is not None or self.peer_dead:
                return
            if not self.life.try_enter():  # the pusher's use, ended by its thread
                return
            try:
                self.pusher = Pusher(self)
                self.pusher.start()
            except BaseException:
                self.pusher = None
                self.life.leave()
                raise

    def forget_unsent(self, body: Any) -> None:
        """A send failed or was cancelled: if nothing of ``body`` went out yet, it simply did not
        happen; what is half-sent (``body``, or an earlier message) is finished in the
        background (``finish_later``), so the ring never stops at half a message."""
        pending = self.pending
        if pending is not None and pending[1] is body and pending[2] == 0 and self.pusher is None:
            self.pending = None  # (a pusher that took it on owns it now: it goes out)
        self.finish_later()

    # ------------------------------------------------------------------ receiving
    def drain_ring(self, out: list, room: int, spin_ns: int = 0, timeout_ns: int = 0) -> int:
        """One batch from the ring into ``out`` (waiting up to ``timeout_ns`` for it): the
        number of records consumed, or CLOSED. If a message fails to decode, the others of the
        batch are kept for the next call and the error is raised now."""
        try:
            return self.rx.drain(self.decoders, out, room, spin_ns, timeout_ns)
        except TransportError:
            self.keep(out)
            raise

    def keep(self, out: list) -> None:
        """A batch drain raised after decoding the messages in ``out``: they come next."""
        self.ready.extend(out)
        out.clear()

    def drain(self, out: list, max_messages: Optional[int]) -> None:
        """Everything available now (at most ``max_messages``), without waiting."""
        ready = self.ready
        while ready and (max_messages is None or len(out) < max_messages):
            out.append(ready.popleft())
        if ready:
            return
        for _ in range(16):  # a producer as fast as we are must not keep us here forever
            room = BATCH_RECORDS if max_messages is None else min(max_messages - len(out), BATCH_RECORDS)
            if room <= 0 or self.drain_ring(out, room) < room:
                return

    def rx_closed(self) -> bool:
        """Whether the ring we read is marked closed (by either side)."""
        return bool(lib.ring_is_closed(self.rx.segment.base))
