"""The baseline transport: ``Channel``'s interface over pyzmq ``ipc://`` sockets.

vLLM's frontend and EngineCore talk this way (PUSH/PULL, one msgspec message per zmq
message), so every benchmark runs it side by side with the ring. The same codec frames
the same messages, so the engine cannot tell the two apart. Later, ``tcp://`` addresses
give the route to a core on another host.

The socket files live in a private directory (ipc_dir.py: mode 0700, ours), never in the
abstract namespace, which any local user could connect to. The creating side makes the
directory and removes it on close (or at exit); the token names it. Peer death is watched
with a pidfd polled next to the socket, so a blocked ``send``/``recv`` raises ``PeerDied``
at once rather than waiting forever on a peer that will never answer.

A message ``try_send`` or ``send`` accepted is whole in zmq's queue, and zmq's I/O thread writes
it out as the peer reads: it arrives with no further call, as channel.py promises for the ring.

``close()`` and ``wakeup()`` may come from any thread, as for ``Channel``: an eventfd polled
next to the socket wakes a blocked call, and the sockets are closed by whoever ends the last
use (lifetime.py), never under a thread that is still in a zmq call. The asyncio shadows are
hooked to one loop; that registration holds a use until it is undone on the loop.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from typing import Any, Awaitable, Optional, cast

import zmq
import zmq.asyncio

from . import ipc_dir
from .errors import MessageTooLarge, PeerDied
from .lifetime import Lifetime, closed_here
from .wakeup import clear_eventfd, new_eventfd

_TOKEN_PREFIX = "zmq:"


class _Sockets:
    """What a ZmqChannel holds outside Python objects, released once (see the module docstring)."""

    def __init__(self, ctx: zmq.Context, tx: zmq.Socket, rx: zmq.Socket, wake_fd: int) -> None:
        self.ctx, self.tx, self.rx, self.wake_fd = ctx, tx, rx, wake_fd
        self.atx: Optional[zmq.asyncio.Socket] = None
        self.arx: Optional[zmq.asyncio.Socket] = None
        self.pidfd: Optional[int] = None

    def release(self) -> None:
        # The asyncio shadows first (closing one closes its socket and unhooks it from the
        # loop). Like the ring, what was sent still reaches a live peer: a short linger.
        for sock, linger in ((self.arx, 0), (self.rx, 0), (self.atx, 100), (self.tx, 100)):
            if sock is not None and not sock.closed:
                sock.close(linger=linger)
        self.ctx.term()
        for fd in (self.pidfd, self.wake_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.pidfd, self.wake_fd = None, -1  # closed: a second release closes nothing


class ZmqChannel:
    """Two PUSH/PULL pairs; the creating side binds, the attaching side connects.

    Like ``Channel``, each end is used by one thread; the asyncio methods shadow the same
    sockets with ``zmq.asyncio`` (vLLM's AsyncMPClient does the same).
    """

    spin_us = 0  # zmq blocks in the kernel; there is no spin phase to tune

    def __init__(self, codec: Any, directory: str, bind: bool, capacity: int, max_message_size: Optional[int]) -> None:
        self._codec = codec
        self._dir = directory
        ctx = zmq.Context()
        tx, rx = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
        self._res = _Sockets(ctx, tx, rx, new_eventfd())
        self._finalizer = weakref.finalize(self, self._res.release)
        self._finalizer.atexit = False  # as for Channel: a daemon thread may still be in a call
        self._life = Lifetime(self._finalizer)
        self._tx, self._rx = tx, rx
        try:
            for sock in (tx, rx):
                sock.setsockopt(zmq.LINGER, 0)
            tx.setsockopt(zmq.SNDBUF, capacity)  # the kernel buffer plays the ring's role
            rx.setsockopt(zmq.RCVBUF, capacity)
            a, b = f"ipc://{directory}/a", f"ipc://{directory}/b"
            if bind:
                tx.bind(a)
                rx.bind(b)
            else:
                rx.connect(a)
                tx.connect(b)
        except BaseException:
            self._life.close(lambda: None)
            raise
        self._max_message_size = max_message_size
        self._peer_pid: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the shadows' loop
        self._waits: set[asyncio.Future] = set()
        self._peer_dead = False
        self._woken = False

    # -- lifetime (same surface as Channel) --------------------------------------------
    @classmethod
    def create(cls, codec: Any, capacity: int = 1 << 22, max_message_size: Optional[int] = None) -> "ZmqChannel":
        directory = ipc_dir.make()
        remover = weakref.finalize(cls, ipc_dir.remove, directory)  # at exit at the latest
        try:
            ch = cls(codec, directory, True, capacity, max_message_size)
        except BaseException:
            remover()
            raise
        ch._remove_dir = remover
        return ch

    @classmethod
    def attach(
        cls,
        codec: Any,
        token: str,
        peer_pid: Optional[int] = None,
        capacity: int = 1 << 22,
        max_message_size: Optional[int] = None,
    ) -> "ZmqChannel":
        if not token.startswith(_TOKEN_PREFIX):
            raise ValueError(f"not a ZmqChannel token: {token!r}")
        ch = cls(codec, ipc_dir.check(token[len(_TOKEN_PREFIX) :]), False, capacity, max_message_size)
        if peer_pid is not None:
            ch.set_peer(peer_pid)
        return ch

    _remove_dir: Optional[weakref.finalize] = None  # the creating side's: removes the socket directory

    def peer_token(self) -> str:
        return _TOKEN_PREFIX + self._dir

    def peer_fds(self) -> list[int]:
        return []  # the peer finds the sockets by path

    def close_peer_fds(self) -> None:
        pass  # nothing was handed over

    def set_peer(self, pid: int) -> None:
        with self._life:
            if self._res.pidfd is not None:
                raise RuntimeError("set_peer: this channel already watches a peer")
            self._peer_pid = pid
            self._res.pidfd = os.pidfd_open(pid)

    @property
    def closed(self) -> bool:
        return self._life.closed

    def close(self) -> None:
        """Idempotent, any thread: wakes every blocked call (ChannelClosed); the sockets close
        once the last of them has left, the socket directory at once (its peer is connected)."""
        if self._life.close(self._notify_close) and self._remove_dir is not None:
            self._remove_dir()

    def _notify_close(self) -> None:
        os.eventfd_write(self._res.wake_fd, 1)  # wakes sync waits
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or not loop.is_running():
            self._detach(loop)
            return
        try:
            loop.call_soon_threadsafe(self._detach, loop)
        except RuntimeError:  # the loop closed meanwhile: nothing can call back any more
            self._detach(loop)

    def wakeup(self) -> None:
        """Make a ``recv``/``recv_batch`` blocked in another thread return early (or the next one)."""
        if self._life.try_enter():
            try:
                self._woken = True
                os.eventfd_write(self._res.wake_fd, 1)
            finally:
                self._life.leave()

    # -- sync ------------------------------------------------------------------------
    def _wait(self, sock: zmq.Socket, event: int, timeout: Optional[float]) -> bool:
        """Wait for ``event`` on ``sock``; False on timeout or wakeup, PeerDied when the peer
        exits, ChannelClosed when this side is closed meanwhile."""
        poller = zmq.Poller()
        poller.register(sock, event)
        poller.register(self._res.wake_fd, zmq.POLLIN)
        pidfd = self._res.pidfd
        if pidfd is not None:
            poller.register(pidfd, zmq.POLLIN)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._life.closed:
                raise closed_here()
            if self._woken:
                self._woken = False
                return False
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = dict(poller.poll(None if left is None else int(left * 1000)))
            if sock in ready:
                return True
            if self._res.wake_fd in ready:
                clear_eventfd(self._res.wake_fd)
                continue
            if pidfd is not None and pidfd in ready:
                raise PeerDied(f"peer process {self._peer_pid} died")
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _encode(self, msg: Any) -> bytes:
        frame = self._codec.encode(msg)
        if self._max_message_size and len(frame) > self._max_message_size:
            raise MessageTooLarge(f"message of {len(frame)} bytes exceeds max_message_size={self._max_message_size}")
        return frame

    def try_send(self, msg: Any) -> bool:
        with self._life:
            try:
                self._tx.send(self._encode(msg), zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                return False

    def send(self, msg: Any, timeout: Optional[float] = None) -> None:
        with self._life:
            frame = self._encode(msg)
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    self._tx.send(frame, zmq.NOBLOCK, copy=False)
                    return
                except zmq.Again:
                    left = None if deadline is None else deadline - time.monotonic()
                    if not self._wait(self._tx, zmq.POLLOUT, left) and left is not None:
                        raise TimeoutError("send timed out: the peer is not reading")

    def _poll(self, max_messages: Optional[int]) -> list:
        out: list = []
        while max_messages is None or len(out) < max_messages:
            try:
                out.append(self._codec.decode(self._rx.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
        return out

    def poll(self, max_messages: Optional[int] = None) -> list:
        with self._life:
            return self._poll(max_messages)

    def recv_batch(self, timeout: Optional[float] = None, max_messages: Optional[int] = None) -> list:
        with self._life:
            batch = self._poll(max_messages)
            if batch or not self._wait(self._rx, zmq.POLLIN, timeout):
                return batch
            return self._poll(max_messages)

    def recv(self, timeout: Optional[float] = None) -> Any:
        batch = self.recv_batch(timeout, max_messages=1)
        if not batch:
            raise TimeoutError("recv timed out" if timeout is not None else "recv was woken up")
        return batch[0]

    # -- asyncio (zmq.asyncio shadows of the same sockets) ---------------------------
    def _async_sockets(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        res = self._res
        if res.arx is None:
            self._life.enter()  # the loop registration's use, ended by _detach on the loop
            self._loop = asyncio.get_running_loop()
            res.atx = zmq.asyncio.Socket.from_socket(self._tx)
            res.arx = zmq.asyncio.Socket.from_socket(self._rx)
            if res.pidfd is not None:
                self._loop.add_reader(res.pidfd, self._on_peer_exit)
        elif self._loop is not asyncio.get_running_loop():
            raise RuntimeError("ZmqChannel: the asyncio methods were first used on another loop")
        assert res.atx is not None  # made with arx
        return res.atx, res.arx

    def _detach(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: unhook the shadows and the pidfd, fail the waits, end the use."""
        if self._loop is not loop:
            return
        self._loop = None
        res = self._res
        try:
            if not loop.is_closed():
                if res.pidfd is not None and not self._peer_dead:
                    loop.remove_reader(res.pidfd)
                for sock, linger in ((res.arx, 0), (res.atx, 100)):
                    if sock is not None:  # made when the loop was attached
                        sock.close(linger=linger)  # also fails its pending futures
            for fut in list(self._waits):
                fut.cancel()
        finally:
            self._life.leave()

    def _on_peer_exit(self) -> None:
        """Called by the loop, on the pidfd it watches since _async_sockets."""
        self._peer_dead = True
        assert self._loop is not None and self._res.pidfd is not None
        self._loop.remove_reader(self._res.pidfd)  # readable from now on: stop polling it
        for fut in list(self._waits):
            fut.cancel()

    async def _await(self, pending: Awaitable[Any]) -> Any:
        """Await a zmq.asyncio send or recv; PeerDied if the peer exits meanwhile,
        ChannelClosed if this side is closed."""
        fut = cast(asyncio.Future, pending)  # zmq.asyncio returns futures (its stubs say awaitables)
        if self._peer_dead:
            fut.cancel()
            raise PeerDied(f"peer process {self._peer_pid} died")
        self._waits.add(fut)
        try:
            return await fut
        except (asyncio.CancelledError, zmq.ZMQError):
            if self._life.closed:
                raise closed_here() from None
            if self._peer_dead:
                raise PeerDied(f"peer process {self._peer_pid} died") from None
            raise
        finally:
            self._waits.discard(fut)

    async def send_async(self, msg: Any, timeout: Optional[float] = None) -> None:
        with self._life:
            fut = self._async_sockets()[0].send(self._encode(msg), copy=False)
        await asyncio.wait_for(self._await(fut), timeout)

    async def recv_batch_async(self, max_messages: Optional[int] = None, timeout: Optional[float] = None) -> list:
        with self._life:
            fut = self._async_sockets()[1].recv()
        try:
            frame = await asyncio.wait_for(self._await(fut), timeout)
        except asyncio.TimeoutError:
            return []
        with self._life:
            return [self._codec.decode(frame)] + self._poll(None if max_messages is None else max_messages - 1)

    async def recv_async(self, timeout: Optional[float] = None) -> Any:
        with self._life:
            fut = self._async_sockets()[1].recv()
        try:
            frame = await asyncio.wait_for(self._await(fut), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("recv_async timed out") from None
        return self._codec.decode(frame)
