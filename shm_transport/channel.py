"""Channel: typed messages both ways between two processes, one shared-memory ring per direction.

Contract (the engine builds on exactly this):

- ``Channel.create`` (frontend) makes both rings and four eventfds; the child gets
  ``peer_token()`` on its command line and ``peer_fds()`` through ``Popen(pass_fds=...)``, then
  calls ``Channel.attach``. The frontend calls ``set_peer(pid)`` and ``close_peer_fds()``.
- Each direction's end is used by one thread at a time (sending and receiving may be two
  threads). ``close()`` and ``wakeup()`` may be called from any thread.
- Sends apply backpressure and never drop: ``send`` blocks (spin, then futex) for space,
  ``try_send`` returns False instead, ``send_async`` waits on an eventfd without blocking the
  loop. A message larger than the ring goes out as fragments.
- **The channel finishes what it starts.** A message accepted by a send call (``try_send``
  answered True, ``send``/``send_async`` returned) arrives whole with no further call, however
  large: what did not fit yet is written by a Pusher thread as the reader frees space
  (pusher.py), and it goes out before anything else (``try_send`` answers False meanwhile,
  ``send`` and ``send_async`` wait for it). A send that raises (timeout, cancel) after part of
  its message went out still delivers it whole: a ring cannot take half a message back.
  Over zmq (zmq_channel.py) the same holds through zmq's own I/O thread.
- Receives decode straight from shared memory into owned objects before the space is released.
  ``recv_batch``/``poll`` return every message available, up to a byte budget per batch
  (``batch_bytes``, default ``BATCH_BYTES`` = 256 KiB; the rest comes with the next call), so a
  reader that fell behind never decodes many large messages at once: dropped together, they
  make malloc hand the memory back to the kernel, and every page of the next ones faults in
  again (measured on this VM: a 1 MiB copy into fresh pages costs ten times the copy itself);
  ``recv_batch`` returns ``[]`` when its timeout passes or ``wakeup()`` is called, ``recv``
  raises TimeoutError instead.
- Large ``bytes`` fields travel out of band (codec.py): copied once, straight into the ring.
- A dead peer raises PeerDied within ``liveness_interval`` (0.1 s) of any wait; a closed channel
  raises ChannelClosed (after the peer's last messages have been read). Nothing hangs.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from . import endpoints
from .channel_async import AsyncSide
from .channel_sync import SyncSide
from .peer_token import PeerToken, RingSpec
from .ring import DEFAULT_MAX_MESSAGE_SIZE
from .ring_ends import BATCH_BYTES, DEFAULT_SPIN_US, RingEnds
from .wakeup import PeerWatch

DEFAULT_CAPACITY = 1 << 22
_MAX_SPIN_NS = 10**15

__all__ = ["Channel", "BATCH_BYTES", "DEFAULT_CAPACITY", "DEFAULT_SPIN_US"]


class Channel(SyncSide, AsyncSide):
    """A bidirectional typed channel over two SPSC rings (see the module docstring): the
    lifetime and settings here, the blocking calls inherited from SyncSide and the awaitable
    ones from AsyncSide, both over one RingEnds (``_ends``). Inherited, not wrapped: a wrapper
    costs a call layer on every message."""

    def __init__(
        self,
        codec: Any,
        tx: Any,
        rx: Any,
        res: endpoints.Resources,
        max_message_size: int,
        token: Optional[PeerToken] = None,
    ) -> None:
        ends = RingEnds(codec, tx, rx, res, max_message_size)
        SyncSide.__init__(self, ends)
        AsyncSide.__init__(self, ends)
        self._token = token
        self._peer_fds = [s.fd for s in res.segments if s.fd is not None] + list(res.fds)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(
        cls,
        codec: Any,
        capacity: int = DEFAULT_CAPACITY,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        recv_capacity: Optional[int] = None,
    ) -> "Channel":
        """The creating (frontend) side: ``capacity`` bytes toward the peer, ``recv_capacity``
        (default: the same) back. Capacities are powers of two, at least 4096."""
        tx, rx, res, token = endpoints.create(capacity, recv_capacity, max_message_size)
        return cls(codec, tx, rx, res, max_message_size, token)

    @classmethod
    def attach(cls, codec: Any, token: str, peer_pid: Optional[int] = None) -> "Channel":
        """The child side: map the rings named by ``token`` (fds inherited through pass_fds)
        and watch ``peer_pid`` (default: the creator named in the token)."""
        tx, rx, res, tok = endpoints.attach(token, peer_pid)
        ch = cls(codec, tx, rx, res, tok.max_message_size)
        ch._peer_fds = []
        return ch

    @classmethod
    def pair(cls, codec: Any, **kwargs: Any) -> tuple["Channel", "Channel"]:
        """Both ends in this process (tests, tools): like create + attach, with dup'd fds."""
        a = cls.create(codec, **kwargs)
        try:
            dups = {fd: os.dup(fd) for fd in a.peer_fds()}
            tok = a._token
            assert tok is not None  # a created end holds its token until the peer attaches
            remap = lambda s: RingSpec(dups[s.fd], s.capacity, dups[s.data_efd], dups[s.space_efd])  # noqa: E731
            text = PeerToken(tok.creator_pid, tok.max_message_size, remap(tok.tx), remap(tok.rx)).text()
            try:
                b = cls.attach(codec, text)  # owns the dups from here on (closes the segment ones)
            except BaseException:
                for fd in dups.values():  # those attach did not get to
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                raise
            a.close_peer_fds()
        except BaseException:
            a.close()
            raise
        return a, b

    def peer_token(self) -> str:
        if self._token is None:
            raise RuntimeError("only the creating side has a peer token")
        return self._token.text()

    def peer_fds(self) -> list[int]:
        """The fds the child must inherit: ``Popen(..., pass_fds=ch.peer_fds())``."""
        return list(self._peer_fds)

    def close_peer_fds(self) -> None:
        """After the child is launched: drop our copies of its segment fds (we keep the mapping)."""
        for seg in self._ends.res.segments:
            seg.close_fd()
        self._peer_fds = []

    def set_peer(self, pid: int) -> None:
        """Watch ``pid``: waits raise PeerDied once it has exited."""
        res = self._ends.res
        self._detach_loop()  # unregister the old pidfd from the loop before closing it
        if res.peer is not None:
            res.peer.close()
        res.peer = PeerWatch(pid)

    def close(self) -> None:
        """Close both directions (idempotent, any thread). The peer reads what was already sent,
        then gets ChannelClosed. Resources are freed once no thread can touch them any more
        (see lifetime.py): by this call, or by the last call that it woke."""
        if self._ends.close(self._close_async):
            self._peer_fds = []

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ settings
    @property
    def closed(self) -> bool:
        return self._life.closed

    @property
    def max_message_size(self) -> int:
        return self._ends.max_message_size

    @property
    def oob_min(self) -> int:
        """A ``bytes`` field at least this long travels out of band (codec.py)."""
        return self._ends.oob_min

    @oob_min.setter
    def oob_min(self, nbytes: int) -> None:
        self._ends.oob_min = nbytes

    @property
    def liveness_interval(self) -> float:
        """Seconds a wait sleeps at most before checking that the peer is alive (default 0.1)."""
        return self._ends.slice_ns / 1e9

    @liveness_interval.setter
    def liveness_interval(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"liveness_interval must be > 0, got {seconds}")
        self._ends.slice_ns = int(seconds * 1e9)

    @property
    def batch_bytes(self) -> int:
        """The byte budget of one receive batch (0: none; default BATCH_BYTES)."""
        return self._ends.rx.batch_bytes

    @batch_bytes.setter
    def batch_bytes(self, nbytes: int) -> None:
        self._ends.rx.set_batch_bytes(nbytes)

    @property
    def spin_us(self) -> float:
        """Microseconds a waiting reader (or writer) spins before sleeping on the futex."""
        return self._ends.spin_ns / 1000

    @spin_us.setter
    def spin_us(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"spin_us must be >= 0, got {value}")
        self._ends.spin_ns = int(min(value * 1000, _MAX_SPIN_NS))

    @property
    def async_spin_us(self) -> float:
        """Microseconds an asyncio reader spins (in C, GIL released, holding up the loop) before
        arming the eventfd and awaiting. 10 by default: a reply that comes that fast skips the
        loop's sleep and wake-up (tens of microseconds on a VM); 0 never holds up the loop."""
        return self._async_spin_ns / 1000

    @async_spin_us.setter
    def async_spin_us(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"async_spin_us must be >= 0, got {value}")
        self._async_spin_ns = int(value * 1000)

    def stats(self) -> dict:
        """Counters of the C ends: sleeps, timeouts, wakes sent, ... (for tests and tuning)."""
        with self._life:
            return {"tx": self._ends.tx.stats(), "rx": self._ends.rx.stats()}

    # ------------------------------------------------------------------ messages
    # send, try_send, recv, recv_batch, poll and wakeup: SyncSide's; send_async, recv_async
    # and recv_batch_async: AsyncSide's.
