"""The baseline transport: ``Channel``'s interface over pyzmq ``ipc://`` sockets.

vLLM's frontend and EngineCore talk this way (PUSH/PULL, one msgspec message per zmq
message), so every benchmark runs it side by side with the ring. The same codec frames
the same messages, so the engine cannot tell the two apart. Later, ``tcp://`` addresses
give the route to a core on another host.

Addresses live in Linux's abstract socket namespace (``ipc://@name``): no socket file is
ever created, so nothing is left behind when either side is killed. Peer death is watched
with a pidfd polled next to the socket, so a blocked ``send``/``recv`` raises ``PeerDied``
at once rather than waiting forever on a peer that will never answer.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import time
from typing import Any, Optional

import zmq
import zmq.asyncio

from shm_transport.errors import ChannelClosed, MessageTooLarge, PeerDied

_TOKEN_PREFIX = "zmq:"


class ZmqChannel:
    """Two PUSH/PULL pairs; the creating side binds, the attaching side connects.

    Like ``Channel``, each end is used by one thread; the asyncio methods shadow the same
    sockets with ``zmq.asyncio`` (vLLM's AsyncMPClient does the same).
    """

    spin_us = 0  # zmq blocks in the kernel; there is no spin phase to tune

    def __init__(self, codec: Any, name: str, bind: bool, capacity: int,
                 max_message_size: Optional[int]) -> None:
        self._codec = codec
        self._name = name
        self._ctx = zmq.Context()
        self._tx = self._ctx.socket(zmq.PUSH)
        self._rx = self._ctx.socket(zmq.PULL)
        for sock in (self._tx, self._rx):
            sock.setsockopt(zmq.LINGER, 0)
        self._tx.setsockopt(zmq.SNDBUF, capacity)  # the kernel buffer plays the ring's role
        self._rx.setsockopt(zmq.RCVBUF, capacity)
        self._max_message_size = max_message_size
        a, b = f"ipc://@{name}-a", f"ipc://@{name}-b"
        if bind:
            self._tx.bind(a)
            self._rx.bind(b)
        else:
            self._rx.connect(a)
            self._tx.connect(b)
        self._pidfd: Optional[int] = None
        self._peer_pid: Optional[int] = None
        self._atx: Optional[zmq.asyncio.Socket] = None
        self._arx: Optional[zmq.asyncio.Socket] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # watching the pidfd
        self._waits: set[asyncio.Future] = set()
        self._peer_dead = False
        self._closed = False

    # -- lifetime (same surface as Channel) --------------------------------------------
    @classmethod
    def create(cls, codec: Any, capacity: int = 1 << 22, max_message_size: Optional[int] = None) -> "ZmqChannel":
        return cls(codec, f"ringllm-{os.getpid()}-{secrets.token_hex(8)}", True, capacity, max_message_size)

    @classmethod
    def attach(cls, codec: Any, token: str, peer_pid: Optional[int] = None,
               capacity: int = 1 << 22, max_message_size: Optional[int] = None) -> "ZmqChannel":
        if not token.startswith(_TOKEN_PREFIX):
            raise ValueError(f"not a ZmqChannel token: {token!r}")
        ch = cls(codec, token[len(_TOKEN_PREFIX):], False, capacity, max_message_size)
        if peer_pid is not None:
            ch.set_peer(peer_pid)
        return ch

    def peer_token(self) -> str:
        return _TOKEN_PREFIX + self._name

    def peer_fds(self) -> list[int]:
        return []  # the peer finds the sockets by name

    def close_peer_fds(self) -> None:
        pass  # nothing was handed over

    def set_peer(self, pid: int) -> None:
        self._peer_pid = pid
        self._pidfd = os.pidfd_open(pid)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed("channel is closed (by this process)")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and not self._peer_dead and not self._loop.is_closed():
            self._loop.remove_reader(self._pidfd)
        # The asyncio shadows first (closing one closes its socket and unhooks it from the
        # loop). Like the ring, what was sent still reaches a live peer: a short linger.
        for sock, linger in ((self._arx, 0), (self._rx, 0), (self._atx, 100), (self._tx, 100)):
            if sock is not None and not sock.closed:
                sock.close(linger=linger)
        self._ctx.term()
        if self._pidfd is not None:
            os.close(self._pidfd)

    # -- sync ------------------------------------------------------------------------
    def _wait(self, sock: zmq.Socket, event: int, timeout: Optional[float]) -> bool:
        """Wait for ``event`` on ``sock``; False on timeout, PeerDied when the peer exits."""
        self._check_open()
        poller = zmq.Poller()
        poller.register(sock, event)
        if self._pidfd is not None:
            poller.register(self._pidfd, zmq.POLLIN)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = dict(poller.poll(None if left is None else int(left * 1000)))
            if sock in ready:
                return True
            if self._pidfd is not None and self._pidfd in ready:
                raise PeerDied(f"peer process {self._peer_pid} died")
            if left is not None and time.monotonic() >= deadline:
                return False

    def _encode(self, msg: Any) -> bytes:
        self._check_open()
        frame = self._codec.encode(msg)
        if self._max_message_size and len(frame) > self._max_message_size:
            raise MessageTooLarge(f"message of {len(frame)} bytes exceeds max_message_size="
                                  f"{self._max_message_size}")
        return frame

    def try_send(self, msg: Any) -> bool:
        try:
            self._tx.send(self._encode(msg), zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def send(self, msg: Any, timeout: Optional[float] = None) -> None:
        frame = self._encode(msg)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self._tx.send(frame, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                left = None if deadline is None else deadline - time.monotonic()
                if not self._wait(self._tx, zmq.POLLOUT, left):
                    raise TimeoutError("send timed out: the peer is not reading")

    def poll(self, max_messages: Optional[int] = None) -> list:
        self._check_open()
        out: list = []
        while max_messages is None or len(out) < max_messages:
            try:
                out.append(self._codec.decode(self._rx.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
        return out

    def recv_batch(self, timeout: Optional[float] = None, max_messages: Optional[int] = None) -> list:
        batch = self.poll(max_messages)
        if batch or not self._wait(self._rx, zmq.POLLIN, timeout):
            return batch
        return self.poll(max_messages)

    def recv(self, timeout: Optional[float] = None) -> Any:
        batch = self.recv_batch(timeout, max_messages=1)
        if not batch:
            raise TimeoutError("recv timed out")
        return batch[0]

    # -- asyncio (zmq.asyncio shadows of the same sockets) ---------------------------
    def _async_sockets(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        self._check_open()
        if self._arx is None:
            self._atx = zmq.asyncio.Socket.from_socket(self._tx)
            self._arx = zmq.asyncio.Socket.from_socket(self._rx)
            if self._pidfd is not None:
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(self._pidfd, self._on_peer_exit)
        return self._atx, self._arx

    def _on_peer_exit(self) -> None:
        self._peer_dead = True
        self._loop.remove_reader(self._pidfd)  # readable from now on: stop polling it
        for fut in list(self._waits):
            fut.cancel()

    async def _await(self, fut: asyncio.Future) -> Any:
        """Await a zmq.asyncio send or recv; PeerDied if the peer exits meanwhile."""
        if self._peer_dead:
            fut.cancel()
            raise PeerDied(f"peer process {self._peer_pid} died")
        self._waits.add(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if self._peer_dead:
                raise PeerDied(f"peer process {self._peer_pid} died") from None
            raise
        finally:
            self._waits.discard(fut)

    async def send_async(self, msg: Any) -> None:
        await self._await(self._async_sockets()[0].send(self._encode(msg), copy=False))

    async def recv_batch_async(self, max_messages: Optional[int] = None) -> list:
        first = self._codec.decode(await self._await(self._async_sockets()[1].recv()))
        return [first] + self.poll(None if max_messages is None else max_messages - 1)

    async def recv_async(self) -> Any:
        return self._codec.decode(await self._await(self._async_sockets()[1].recv()))
