"""The asyncio half of Channel: eventfds and the peer's pidfd registered with ``loop.add_reader``.

An asyncio reader that finds the ring empty optionally spins ``async_spin_us`` (GIL released),
then *arms*: it sets ``consumer_waiting`` to "eventfd", fences, re-checks the ring and only then
awaits a future that the eventfd's reader callback resolves. The producer writes the eventfd
only when it sees the flag, so a busy stream costs no system call. Sending waits for space the
same way (the space eventfd), so the event loop is never blocked on a futex.

All three fds are registered once per loop (level-triggered); the callbacks clear the eventfd
and resolve whichever future is waiting. Only one task may await a receive at a time; concurrent
``send_async`` calls are serialised in call order by an ``asyncio.Lock``.

A receiver that knows when the next message is due (``expect``, from a ``Pace``) also arms a
timerfd to wake ahead of it and spins for the last stretch (anticipation.py says why); the
timerfd exists, registered with the loop, only while the channel is attached to one.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Optional

from ._ring import lib
from .anticipation import WakeLead
from .errors import ChannelClosed
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
        self._timer_fd: Optional[int] = None
        self._timer_fired = False
        self._wake_lead = WakeLead()
        self._anticipated = {"hits": 0, "late": 0, "misses": 0}
        self.max_anticipation_spin = 300e-6  # seconds: the most one expected message is spun for

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
        fds, self._loop_fds = self._loop_fds, []
        if loop is not None and not loop.is_closed():
            for fd in fds:
                try:
                    loop.remove_reader(fd)
                except Exception:  # the loop is shutting down; the fds are closed next anyway
                    pass
        _resolve(self._rx_fut)
        _resolve(self._tx_fut)
        timer, self._timer_fd = self._timer_fd, None
        if timer is not None:
            os.close(timer)

    def _async_attached(self) -> bool:
        return self._loop is not None

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

        def detach_and_release() -> None:
            self._detach_loop()
            self._maybe_release()
        try:
            loop.call_soon_threadsafe(detach_and_release)
        except RuntimeError:  # the loop closed meanwhile
            self._loop = None

    def _on_rx_event(self) -> None:
        clear_eventfd(self._rx.data_efd)
        _resolve(self._rx_fut)

    def _take_timer_expiry(self) -> bool:
        """Clear the timerfd; whether it had expired."""
        try:
            os.read(self._timer_fd, 8)
            return True
        except (OSError, TypeError):  # TypeError: the timer was closed meanwhile
            return False

    def _on_timer_event(self) -> None:
        if self._take_timer_expiry():  # else cleared when re-armed: a stale expiry, not ours
            self._timer_fired = True
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

    # ------------------------------------------------------------------ anticipated wake-ups
    def anticipation_stats(self) -> dict:
        """Spins for an expected message, after the ``expect`` timer or at once when it was
        due within a wake-up: ``hits`` (the spin caught it), ``late`` (the timer woke us after
        it came), ``misses`` (the spin ended empty); and the learned lead."""
        return {**self._anticipated, "lead_us": self._wake_lead.lead * 1e6}

    def _anticipate(self, out: list, room: int, expect: tuple[float, float]) -> Optional[float]:
        """Set the timer to wake ahead of the expected message and return its deadline; or, if
        the message is due within a wake-up, spin for it now and return None. A guess too
        vague to be caught within ``max_anticipation_spin`` is not worth a spin: None."""
        at, spread = expect
        if 2 * (spread + self._wake_lead.margin) > self.max_anticipation_spin:
            return None
        now = time.monotonic()
        wake = at - spread - self._wake_lead.lead  # early rather than late: a late wake-up gains nothing
        if wake <= now:  # due within a wake-up
            if self._spin_for(out, room, at + spread, now):
                self._anticipated["hits" if out else "misses"] += 1
            return None
        if self._timer_fd is None:
            fd = lib.ring_timer_new()
            if fd < 0:
                raise OSError(-fd, f"timerfd_create: {os.strerror(-fd)}")
            self._timer_fd = fd
            self._loop.add_reader(fd, self._on_timer_event)
            self._loop_fds.append(fd)
        else:
            self._take_timer_expiry()  # a stale expiry must not pass for this one
        self._timer_fired = False
        lib.ring_timer_set(self._timer_fd, int(wake * 1e9))
        return wake

    def _spin_for(self, out: list, room: int, until: float, now: float) -> bool:
        """Spin (GIL released, not announcing a sleep: the producer makes no system call) for
        a message until ``until`` plus the margin, at most ``max_anticipation_spin``. False if
        that time has already passed."""
        spin = min(until + self._wake_lead.margin - now, self.max_anticipation_spin)
        if spin <= 0:
            return False
        ns = int(spin * 1e9)
        self._drain_ring(out, room, ns, ns)
        return True

    def _after_timer(self, out: list, room: int, expect: tuple[float, float], wake: float) -> None:
        now = time.monotonic()
        self._wake_lead.woke(now - wake)
        if out:
            self._anticipated["late"] += 1
            return
        self._spin_for(out, room, expect[0] + expect[1], now)
        self._anticipated["hits" if out else "misses"] += 1

    # ------------------------------------------------------------------ receiving
    async def recv_batch_async(self, max_messages: Optional[int] = None, timeout: Optional[float] = None,
                               expect: Optional[tuple[float, float]] = None) -> list:
        """Await at least one message, then return all available (at most ``max_messages``);
        ``[]`` once ``timeout`` passes. ``expect``: ``(at, spread)`` from a ``Pace``, the next
        message is due at about ``time.monotonic()`` == ``at``: wake ahead of it on a timer
        and spin for it, rather than sleep until the producer wakes us."""
        if self._closed:
            raise ChannelClosed("channel is closed (by this process)")
        out: list = []
        self._drain(out, max_messages)
        room = BATCH_RECORDS if max_messages is None else min(max_messages, BATCH_RECORDS)
        if not out and self._async_spin_ns:
            self._drain_ring(out, room, self._async_spin_ns, self._async_spin_ns)
        if out:
            return out
        loop = self._loop_for_wait()
        if self._rx_fut is not None:
            raise RuntimeError("another task is already awaiting a receive on this channel")
        deadline = None if timeout is None else loop.time() + timeout
        wake = None if expect is None else self._anticipate(out, room, expect)
        if out:
            return out
        try:
            while True:
                if not lib.ring_arm_data(self._c):
                    try:
                        if not (self._peer_dead or (deadline is not None and loop.time() >= deadline)):
                            await self._sleep_on("_rx_fut", deadline)
                    finally:
                        if not self._closed:
                            lib.ring_disarm_data(self._c)
                if self._closed:
                    raise ChannelClosed("channel is closed (by this process)")
                self._drain(out, max_messages)
                if wake is not None and self._timer_fired:
                    self._after_timer(out, room, expect, wake)
                    wake = None
                if out:
                    return out
                if lib.ring_is_closed(self._rx.segment.base):
                    raise ChannelClosed("recv: the peer closed the channel")
                if not self._peer_alive():
                    raise self._peer_error()
                if deadline is not None and loop.time() >= deadline:
                    return out
        finally:
            if wake is not None and self._timer_fd is not None:
                lib.ring_timer_set(self._timer_fd, 0)  # woken before it fired: it must not fire

    async def recv_async(self, timeout: Optional[float] = None) -> Any:
        """The next message; TimeoutError if none came within ``timeout``."""
        msg = self._next_ready()
        if msg is not None:
            return msg
        ready = self._ready
        batch: list = []
        self._drain_ring(batch, BATCH_RECORDS, self._async_spin_ns, self._async_spin_ns)  # the fast path
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
        if self._closed:
            raise ChannelClosed("channel is closed (by this process)")
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
                    if self._closed:
                        raise ChannelClosed("channel is closed (by this process)")
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
                    if not lib.ring_arm_space(self._p):
                        try:
                            await self._sleep_on("_tx_fut", deadline)
                        finally:
                            if not self._closed:
                                lib.ring_disarm_space(self._p)
            except BaseException:
                pending = self._pending
                if pending is not None and pending[1] is body and pending[2] == 0:
                    self._pending = None  # ours never started: the send did not happen
                raise
