"""Channel: typed messages both ways between two processes, one shared-memory ring per direction.

Contract (the engine builds on exactly this):

- ``Channel.create`` (frontend) makes both rings and four eventfds; the child gets
  ``peer_token()`` on its command line and ``peer_fds()`` through ``Popen(pass_fds=...)``, then
  calls ``Channel.attach``. The frontend calls ``set_peer(pid)`` and ``close_peer_fds()``.
- Each direction's end is used by one thread at a time (sending and receiving may be two
  threads). ``close()`` and ``wakeup()`` may be called from any thread.
- Sends apply backpressure and never drop: ``send`` blocks (spin, then futex) for space,
  ``try_send`` returns False instead, ``send_async`` waits on an eventfd without blocking the
  loop. A message larger than the ring goes out as fragments; if it cannot all go at once the
  channel finishes it before anything else (``try_send`` answers False meanwhile).
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

import collections
import os
import threading
import time
import weakref
from typing import Any, Optional

from . import channel_async, endpoints
from ._ring import lib
from .codec import OOB_KIND, OOB_MIN
from .errors import ChannelClosed, MessageTooLarge, PeerDied, TransportError
from .lifetime import Lifetime, closed_here
from .peer_token import PeerToken, RingSpec
from .ring import BATCH_RECORDS, CLOSED, DEFAULT_MAX_MESSAGE_SIZE, READY, Consumer, Gather, Producer, raise_status
from .wakeup import PeerWatch

_ring_write = lib.ring_write

DEFAULT_CAPACITY = 1 << 22
DEFAULT_SPIN_US = 10.0
BATCH_BYTES = 256 << 10  # the byte budget of one receive batch (see the module docstring)
_MAX_SPIN_NS = 10 ** 15
_DEAD = -100
_UNKNOWN = (None, None)  # send_info of a type outside the codec


class Channel(channel_async.AsyncChannelMixin):
    """A bidirectional typed channel over two SPSC rings (see the module docstring)."""

    def __init__(self, codec: Any, tx: Producer, rx: Consumer, res: endpoints.Resources,
                 max_message_size: int, token: Optional[PeerToken] = None) -> None:
        if not all(hasattr(codec, a) for a in ("kind_and_body", "kind_of", "encode_body", "decoders")):
            raise TypeError(f"codec must be a MsgspecCodec, got {type(codec).__name__}")
        self._codec = codec
        self._tx, self._rx = tx, rx
        rx.set_batch_bytes(BATCH_BYTES)
        self._p, self._c = tx.handle, rx.handle
        self._res = res
        self._finalizer = weakref.finalize(self, res.release)
        # Not at interpreter exit: a daemon thread may still be blocked in a wait on the
        # mapping; the OS reclaims everything at exit and the peer sees PeerDied instead.
        self._finalizer.atexit = False
        # Every call that touches the mapping holds a use; the last one after close() releases.
        self._life = Lifetime(self._finalizer)
        self._uses = self._life.uses
        self._token = token
        self.max_message_size = max_message_size
        self._peer_fds = [s.fd for s in res.segments if s.fd is not None] + list(res.fds)
        self._spin_ns = int(DEFAULT_SPIN_US * 1000)
        self.oob_min = OOB_MIN  # a bytes field this long goes out of band (larger than any: never)
        self._slice_ns = 0
        self.liveness_interval = 0.1
        self._ready: collections.deque = collections.deque()
        self._pending: Optional[tuple] = None  # (kind, body, done) of a half-sent fragmented message
        # (body: the msgpack bytes, or a Gather of an out-of-band frame, whose kind is OOB_KIND)
        self._peer_dead = False
        self._peer_checked = 0.0
        self._kind_of = codec.kind_of
        self._send_info = codec.send_info
        self._oob_parts = codec.oob_parts
        self._oob_fields = codec.oob_fields
        self._encode_body = codec.encode_body
        self._decoders = codec.decoders
        self._woken = False
        self._init_async()

    # ------------------------------------------------------------------ lifetime
    @classmethod
    def create(cls, codec: Any, capacity: int = DEFAULT_CAPACITY, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
               recv_capacity: Optional[int] = None) -> "Channel":
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
        for seg in self._res.segments if self._res else ():
            seg.close_fd()
        self._peer_fds = []

    def set_peer(self, pid: int) -> None:
        """Watch ``pid``: waits raise PeerDied once it has exited."""
        self._async_peer_changed()  # unregister the old pidfd from the loop before closing it
        if self._res.peer is not None:
            self._res.peer.close()
        self._res.peer = PeerWatch(pid)

    @property
    def liveness_interval(self) -> float:
        """Seconds a wait sleeps at most before checking that the peer is alive (default 0.1)."""
        return self._slice_ns / 1e9

    @liveness_interval.setter
    def liveness_interval(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"liveness_interval must be > 0, got {seconds}")
        self._slice_ns = int(seconds * 1e9)

    @property
    def closed(self) -> bool:
        return self._life.closed

    @property
    def _closed(self) -> bool:
        return self._life.closed

    @property
    def batch_bytes(self) -> int:
        """The byte budget of one receive batch (0: none; default BATCH_BYTES)."""
        return self._rx.batch_bytes

    @batch_bytes.setter
    def batch_bytes(self, nbytes: int) -> None:
        self._rx.set_batch_bytes(nbytes)

    @property
    def spin_us(self) -> float:
        """Microseconds a waiting reader (or writer) spins before sleeping on the futex."""
        return self._spin_ns / 1000

    @spin_us.setter
    def spin_us(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"spin_us must be >= 0, got {value}")
        self._spin_ns = int(min(value * 1000, _MAX_SPIN_NS))

    def close(self) -> None:
        """Close both directions (idempotent, any thread). The peer reads what was already sent,
        then gets ChannelClosed. Resources are freed once no thread can touch them any more
        (see lifetime.py): by this call, or by the last call that it woke."""
        if self._life.close(self._notify_close):
            self._peer_fds = []

    def _notify_close(self) -> None:
        self._tx.close()  # marks both rings closed and wakes every sleeper, ours included
        self._rx.close()
        self._async_close()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> dict:
        """Counters of the C ends: sleeps, timeouts, wakes sent, ... (for tests and tuning)."""
        with self._life:
            return {"tx": self._tx.stats(), "rx": self._rx.stats()}

    def _peer_error(self) -> PeerDied:
        peer = self._res.peer if self._res else None
        return PeerDied(peer.describe() if peer else "peer died")

    def _peer_alive(self) -> bool:
        """False once the peer has exited. Polls its pidfd at most every 20 ms."""
        if self._peer_dead:
            return False
        peer = self._res.peer
        if peer is None:
            return True
        now = time.monotonic()
        if now - self._peer_checked < 0.02:
            return True
        self._peer_checked = now
        if not peer.alive():
            self._peer_dead = True
        return not self._peer_dead

    def _wait_space(self, deadline: Optional[float]) -> int:
        """Wait (spin, then futex) in slices of ``liveness_interval`` until the reader frees
        space (READY) or the ring closes (CLOSED); between slices, notice the deadline
        (TIMEOUT) or the peer's death (_DEAD)."""
        while True:
            if self._closed:
                raise closed_here()
            if self._peer_dead:
                return _DEAD
            left = self.liveness_interval
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
                if left <= 0:
                    return lib.RING_TIMEOUT
            rc = lib.ring_wait_space(self._p, self._spin_ns, int(left * 1e9))
            if rc == READY or rc == CLOSED:
                return rc
            self._peer_alive()  # an empty slice: is the peer still there?

    # ------------------------------------------------------------------ sending
    def _encode(self, msg: Any) -> tuple[int, Any]:
        """(kind byte, body): the msgpack bytes, or (OOB_KIND, a Gather) when large bytes
        fields go out of band (copied once, straight into the ring; see codec.py)."""
        kind = self._kind_of.get(type(msg))
        if kind is None:
            kind, body = self._codec.kind_and_body(msg)  # raises the TypeError naming the type
        names = self._oob_fields[kind]
        if names:
            parts = self._oob_parts(msg, kind, names, self.oob_min)
            if parts is not None:
                body = Gather(parts)
                if len(body) < self.max_message_size:
                    return OOB_KIND, body
        body = self._encode_body(msg)
        if len(body) >= self.max_message_size:
            raise self._too_large(msg, len(body))
        return kind, body

    def _too_large(self, msg: Any, n: int) -> MessageTooLarge:
        return MessageTooLarge(f"{type(msg).__name__} encodes to {n + 1} bytes; "
                               f"max_message_size is {self.max_message_size}")

    def _write(self, kind: int, body: Any, done: int) -> int:
        """Write kind||body from byte ``done`` on (see ring_write); the new progress."""
        if type(body) is bytes:
            return _ring_write(self._p, kind, body, len(body), done)
        return body.write(self._p, kind, done)

    def _flush_pending(self) -> bool:
        """Push on with a half-sent fragmented message; True when none is left."""
        kind, body, done = self._pending
        done = self._write(kind, body, done)
        if done < 0:
            raise_status(done, "send")
        if done == len(body) + 1:
            self._pending = None
            return True
        self._pending = (kind, body, done)
        return False

    def try_send(self, msg: Any) -> bool:
        """Send without blocking; False (nothing sent) when the ring has no room now."""
        uses = self._uses  # a use of the mapping (lifetime.py), inlined: the hot path
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            return self._try_send(msg)
        finally:
            uses.pop()
            if self._life.closed and not uses:
                self._finalizer()

    def _try_send(self, msg: Any) -> bool:
        kind, body = self._encode(msg)
        if self._pending is not None and not self._flush_pending():
            return False
        done = self._write(kind, body, 0)
        if done == len(body) + 1:
            return True
        if done < 0:
            raise_status(done, "send")
        if done == 0:
            if not self._peer_alive():
                raise self._peer_error()
            return False
        self._pending = (kind, body, done)  # a big message is under way: it will be finished first
        return True

    def send(self, msg: Any, timeout: Optional[float] = None) -> None:
        """Send, waiting for space as long as needed (or ``timeout`` seconds: TimeoutError)."""
        uses = self._uses  # a use of the mapping (lifetime.py), inlined: the hot path
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            self._send(msg, timeout)
        finally:
            uses.pop()
            if self._life.closed and not uses:
                self._finalizer()

    def _send(self, msg: Any, timeout: Optional[float]) -> None:
        kind, probe = self._send_info.get(type(msg), _UNKNOWN)  # _encode, inlined: the hot path
        if kind is not None and (probe is None or type(v := probe(msg)) is not bytes or len(v) < self.oob_min):
            body = self._encode_body(msg)
            n = len(body)
            if n >= self.max_message_size:
                raise self._too_large(msg, n)
            if self._pending is None:
                done = _ring_write(self._p, kind, body, n, 0)
                if done == n + 1:
                    return
        else:
            kind, body = self._encode(msg)  # a TypeError, or large bytes fields go out of band
            n = len(body)
            if self._pending is None:
                done = self._write(kind, body, 0)
                if done == n + 1:
                    return
        if self._pending is None:
            if done < 0:
                raise_status(done, "send")
            self._pending = (kind, body, done)
            self._send_slow(kind, body, False, timeout)
        else:
            self._send_slow(kind, body, True, timeout)  # an earlier half-sent message goes first

    def _send_slow(self, kind: int, body: Any, queued: bool, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if self._flush_pending():
                    if not queued:
                        return
                    queued = False
                    self._pending = (kind, body, 0)
                    continue
                rc = self._wait_space(deadline)
                if rc == _DEAD:
                    raise self._peer_error()
                if rc == CLOSED:
                    raise ChannelClosed("send: the peer closed the channel")
                if rc == lib.RING_TIMEOUT:
                    raise TimeoutError(f"send timed out after {timeout} s: the peer is not reading")
        except BaseException:
            pending = self._pending
            if pending is not None and pending[1] is body and pending[2] == 0:
                self._pending = None  # nothing of ours went out: the send simply did not happen
            raise

    # ------------------------------------------------------------------ receiving
    def _drain_ring(self, out: list, room: int, spin_ns: int = 0, timeout_ns: int = 0) -> int:
        """One batch from the ring into ``out`` (waiting up to ``timeout_ns`` for it): the
        number of records consumed, or CLOSED."""
        try:
            return self._rx.drain(self._decoders, out, room, spin_ns, timeout_ns)
        except TransportError:
            self._ready.extend(out)  # keep what decoded; raise now, return them next call
            out.clear()
            raise

    def _drain(self, out: list, max_messages: Optional[int]) -> None:
        """Everything available now (at most ``max_messages``), without waiting."""
        ready = self._ready
        while ready and (max_messages is None or len(out) < max_messages):
            out.append(ready.popleft())
        if ready:
            return
        for _ in range(16):  # a producer as fast as we are must not keep us here forever
            room = BATCH_RECORDS if max_messages is None else min(max_messages - len(out), BATCH_RECORDS)
            if room <= 0 or self._drain_ring(out, room) < room:
                return

    def _peer_closed_error(self) -> ChannelClosed:
        if self._closed:
            return closed_here()
        return ChannelClosed("recv: the peer closed the channel")

    def poll(self, max_messages: Optional[int] = None) -> list:
        """Every message available now (at most ``max_messages``); ``[]`` if none. Never blocks.
        Raises ChannelClosed once the peer has closed and everything it sent has been read."""
        uses = self._uses  # a use of the mapping (lifetime.py), inlined: the hot path
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            return self._poll(max_messages)
        finally:
            uses.pop()
            if self._life.closed and not uses:
                self._finalizer()

    def _poll(self, max_messages: Optional[int]) -> list:
        out: list = []
        self._drain(out, max_messages)
        if not out and lib.ring_is_closed(self._rx.segment.base):
            self._drain(out, max_messages)  # what was published just before the close
            if not out:
                raise self._peer_closed_error()
        return out

    def recv_batch(self, timeout: Optional[float] = None, max_messages: Optional[int] = None) -> list:
        """Block until at least one message is there, then return all available (at most
        ``max_messages``). Returns ``[]`` when ``timeout`` passes or ``wakeup()`` is called."""
        uses = self._uses  # a use of the mapping (lifetime.py), inlined: the hot path
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            if timeout == 0:
                return self._poll(max_messages)
            out: list = []
            self._drain(out, max_messages)
            if not out:
                self._wait_recv(out, max_messages, timeout)
            return out
        finally:
            uses.pop()
            if self._life.closed and not uses:
                self._finalizer()

    def _next_ready(self) -> Any:
        """A message decoded earlier and not yet returned, or None (after checking that this side
        is still open): the start of ``recv`` and ``recv_async``."""
        ready = self._ready
        if ready:
            return ready.popleft()
        if self._closed:
            raise closed_here()
        return None

    def recv(self, timeout: Optional[float] = None) -> Any:
        """The next message; TimeoutError if none came within ``timeout`` (or on ``wakeup()``)."""
        msg = self._next_ready()
        if msg is not None:
            return msg
        uses = self._uses  # a use of the mapping (lifetime.py), inlined: the hot path
        uses.append(None)
        try:
            if self._life.closed:
                raise closed_here()
            return self._recv(timeout)
        finally:
            uses.pop()
            if self._life.closed and not uses:
                self._finalizer()

    def _recv(self, timeout: Optional[float]) -> Any:
        out: list = []
        if timeout is None and not (self._woken or self._peer_dead):
            # The common case, inlined: one wait slice straight on the ring (see _wait_recv).
            try:
                self._rx.drain(self._decoders, out, BATCH_RECORDS, self._spin_ns, self._slice_ns)
            except TransportError:
                self._ready.extend(out)
                out.clear()
                raise
        elif timeout == 0:
            out = self._poll(None)
        if not out:
            self._wait_recv(out, None, timeout)
            if not out:
                raise TimeoutError("recv timed out" if timeout is not None else "recv was woken up")
        if len(out) > 1:
            self._ready.extend(out[1:])
        return out[0]

    def _wait_recv(self, out: list, max_messages: Optional[int], timeout: Optional[float]) -> None:
        """Wait (spin, then futex) in slices of ``liveness_interval`` for at least one message;
        between slices, notice a wakeup, the deadline, a close, or the peer's death."""
        deadline = None if timeout is None else time.monotonic() + timeout
        room = BATCH_RECORDS if max_messages is None else min(max_messages, BATCH_RECORDS)
        while True:
            if self._closed:
                raise closed_here()
            if self._woken:
                self._woken = False
                return
            left = self.liveness_interval
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
                if left <= 0:
                    return
            if self._peer_dead:
                left = 0
            try:  # _drain_ring, inlined: this is the hot path of every blocking receive
                n = self._rx.drain(self._decoders, out, room, self._spin_ns, int(left * 1e9))
            except TransportError:
                self._ready.extend(out)
                out.clear()
                raise
            if out:
                if n == room and max_messages is None:
                    self._drain(out, None)  # there may be more
                return
            if n == CLOSED:
                raise self._peer_closed_error()
            if n == 0 and not self._peer_alive():
                self._drain(out, max_messages)
                if not out:
                    raise self._peer_error()
                return

    def wakeup(self) -> None:
        """Make a ``recv``/``recv_batch`` blocked in another thread return early (or the next
        one, if none is blocked now)."""
        if not self._life.try_enter():
            return
        try:
            self._woken = True
            lib.ring_kick(self._c)
        finally:
            self._life.leave()
