"""The asyncio half of Channel: eventfds and the peer's pidfd registered with ``loop.add_reader``.

An asyncio reader that finds the ring empty optionally spins ``async_spin_us`` (GIL released),
then *arms*: it sets ``consumer_waiting`` to "eventfd", fences, re-checks the ring and only then
awaits a future that the eventfd's reader callback resolves. The producer writes the eventfd
only when it sees the flag, so a busy stream costs no system call. Sending waits for space the
same way (the space eventfd), so the event loop is never blocked on a futex.

All three fds are registered once per loop (level-triggered); the callbacks clear the eventfd
and resolve whichever future is waiting. The registration holds a use of the channel
(lifetime.py) until it is undone on the loop, so no callback can run on a released fd; the
other uses are taken around each step that touches the mapping, never across an ``await``. Only one task may await a receive at a time; concurrent
``send_async`` calls are serialised in call order by an ``asyncio.Lock``.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from ._ring import lib
from .errors import ChannelClosed
from .lifetime import closed_here
from .ring import BATCH_RECORDS, raise_status
from .wakeup import clear_eventfd


def _resolve(fut: Optional[asyncio.Future]) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class AsyncChannelMixin:
    """Mixed into Channel; uses its ``_c``, ``_p``, ``_rx``, ``_tx``, ``_drain`` and flags."""

    def _init_async(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_fds: list[int] = []
        self._rx_fut: Optional[asyncio.Future] = None
        self._tx_fut: Optional[asyncio.Future] = None
        self._send_lock: Optional[asyncio.Lock] = None
        self._async_spin_ns = 10_000

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

    # ------------------------------------------------------------------ loop registration
    def _attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not None:
            self._detach_loop()
        self._life.enter()  # the registration's use, ended by _detach_loop
        self._loop = loop
        self._send_lock = asyncio.Lock()
        loop.add_reader(self._rx.data_efd, self._on_rx_event)
        loop.add_reader(self._tx.space_efd, self._on_tx_event)
        self._loop_fds = [self._rx.data_efd, self._tx.space_efd]
        peer = self._res.peer
        if peer is not None and peer.fd is not None and not self._peer_dead:
            loop.add_reader(peer.fd, self._on_peer_event)
            self._loop_fds.append(peer.fd)

    def _detach_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        fds, self._loop_fds = self._loop_fds, []
        try:
            if not loop.is_closed():
                for fd in fds:
                    try:
                        loop.remove_reader(fd)
                    except Exception:  # the loop is shutting down; the fds are closed next anyway
                        pass
            _resolve(self._rx_fut)
            _resolve(self._tx_fut)
        finally:
            self._life.leave()

    def _async_peer_changed(self) -> None:
        if self._loop is not None:
            self._detach_loop()  # re-registered, with the new pidfd, by the next async call

    def _async_close(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or not loop.is_running():
            self._detach_loop()
            return
        try:
            loop.call_soon_threadsafe(self._detach_from, loop)
        except RuntimeError:  # the loop closed meanwhile: nothing can call back any more
            self._detach_from(loop)

    def _detach_from(self, loop: asyncio.AbstractEventLoop) -> None:
        """Detach, unless the channel has meanwhile moved on to another loop."""
        if self._loop is loop:
            self._detach_loop()

    def _on_rx_event(self) -> None:
        clear_eventfd(self._rx.data_efd)
        _resolve(self._rx_fut)

    def _on_tx_event(self) -> None:
        clear_eventfd(self._tx.space_efd)
        _resolve(self._tx_fut)

    def _on_peer_event(self) -> None:
        self._peer_dead = True
        fd = self._res.peer.fd if self._res and self._res.peer else None
        if self._loop is not None and fd in self._loop_fds:
            self._loop.remove_reader(fd)  # stays readable forever: stop polling it
            self._loop_fds.remove(fd)
        _resolve(self._rx_fut)
        _resolve(self._tx_fut)

    def _loop_for_wait(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._attach_loop(loop)
        return loop

    async def _sleep_on(self, slot: str, deadline: Optional[float]) -> None:
        loop = self._loop
        fut = loop.create_future()
        setattr(self, slot, fut)
        timer = None if deadline is None else loop.call_at(deadline, _resolve, fut)
        try:
            await fut
        finally:
            setattr(self, slot, None)
            if timer is not None:
                timer.cancel()

    # ------------------------------------------------------------------ receiving
    async def recv_batch_async(self, max_messages: Optional[int] = None, timeout: Optional[float] = None) -> list:
        """Await at least one message, then return all available (at most ``max_messages``);
        ``[]`` once ``timeout`` passes."""
        out: list = []
        room = BATCH_RECORDS if max_messages is None else min(max_messages, BATCH_RECORDS)
        with self._life:
            self._drain(out, max_messages)
            if not out and self._async_spin_ns:
                self._drain_ring(out, room, self._async_spin_ns, self._async_spin_ns)
            if out:
                return out
            loop = self._loop_for_wait()
        if self._rx_fut is not None:
            raise RuntimeError("another task is already awaiting a receive on this channel")
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self._life:
                armed = not lib.ring_arm_data(self._c)
            if armed:
                try:
                    if not (self._peer_dead or (deadline is not None and loop.time() >= deadline)):
                        await self._sleep_on("_rx_fut", deadline)
                finally:
                    if self._life.try_enter():
                        try:
                            lib.ring_disarm_data(self._c)
                        finally:
                            self._life.leave()
            with self._life:
                self._drain(out, max_messages)
                if out:
                    return out
                if lib.ring_is_closed(self._rx.segment.base):
                    raise ChannelClosed("recv: the peer closed the channel")
            if not self._peer_alive():
                raise self._peer_error()
            if deadline is not None and loop.time() >= deadline:
                return out

    async def recv_async(self, timeout: Optional[float] = None) -> Any:
        """The next message; TimeoutError if none came within ``timeout``."""
        msg = self._next_ready()
        if msg is not None:
            return msg
        ready = self._ready
        batch: list = []
        with self._life:  # the fast path
            self._drain_ring(batch, BATCH_RECORDS, self._async_spin_ns, self._async_spin_ns)
        if not batch:
            batch = await self.recv_batch_async(timeout=timeout)
            if not batch:
                raise TimeoutError("recv_async timed out")
        if len(batch) > 1:
            ready.extend(batch[1:])
        return batch[0]

    # ------------------------------------------------------------------ sending
    async def send_async(self, msg: Any, timeout: Optional[float] = None) -> None:
        """Send, awaiting space without blocking the loop (TimeoutError after ``timeout``)."""
        with self._life:
            kind, body = self._encode(msg)
            mine: Optional[tuple] = (kind, body, 0)
            lock = self._send_lock
            if self._pending is None and (lock is None or not lock.locked()):
                done = self._write(kind, body, 0)
                if done == len(body) + 1:
                    return
                if done < 0:
                    raise_status(done, "send")
                if done:
                    self._pending, mine = (kind, body, done), None
            loop = self._loop_for_wait()
        deadline = None if timeout is None else loop.time() + timeout
        async with self._send_lock:
            try:
                while True:
                    with self._life:
                        if self._pending is None:
                            if mine is None:
                                return
                            self._pending, mine = mine, None
                        if self._flush_pending():
                            continue
                        if not self._peer_alive():
                            raise self._peer_error()
                        if deadline is not None and loop.time() >= deadline:
                            raise TimeoutError(f"send_async timed out after {timeout} s: the peer is not reading")
                        armed = not lib.ring_arm_space(self._p)
                    if armed:
                        try:
                            await self._sleep_on("_tx_fut", deadline)
                        finally:
                            if self._life.try_enter():
                                try:
                                    lib.ring_disarm_space(self._p)
                                finally:
                                    self._life.leave()
            except BaseException:
                pending = self._pending
                if pending is not None and pending[1] is body and pending[2] == 0:
                    self._pending = None  # ours never started: the send did not happen
                raise
