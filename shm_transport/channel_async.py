"""The asyncio half of Channel (its base class, like channel_sync.py's SyncSide): eventfds and
the peer's pidfd registered with ``loop.add_reader``.

An asyncio reader that finds the ring empty optionally spins ``async_spin_us`` (GIL released),
then *arms*: it sets ``consumer_waiting`` to "eventfd", fences, re-checks the ring and only then
awaits a future that the eventfd's reader callback resolves. The producer writes the eventfd
only when it sees the flag, so a busy stream costs no system call. Sending waits for space the
same way (the space eventfd), so the event loop is never blocked on a futex; while a Pusher
thread finishes a half-sent message (pusher.py), a send awaits its end, which it signals through
``call_soon_threadsafe``.

All three fds are registered once per loop (level-triggered); the callbacks clear the eventfd
and resolve whichever future is waiting. The registration holds a use of the channel
(lifetime.py) until it is undone on the loop, so no callback can run on a released fd; the
other uses are taken around each step that touches the mapping, never across an ``await``
(written out on the first step of each call, which is all a busy stream takes: see
channel_sync.py).

Only one task may await a receive at a time; concurrent ``send_async`` calls are serialised
in call order by an ``asyncio.Lock``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from ._ring import lib
from .errors import TransportError
from .lifetime import closed_here
from .ring import BATCH_RECORDS, raise_status
from .ring_ends import RingEnds
from .wakeup import clear_eventfd


def _resolve(fut: Optional[asyncio.Future]) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any) -> None:
    """From another thread; a loop closed meanwhile has nobody left to wake."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


class AsyncSide:
    """Awaitable send/receive over one channel's RingEnds (see the module docstring)."""

    def __init__(self, ends: RingEnds) -> None:
        self._ends = ends
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_fds: list[int] = []
        self._rx_fut: Optional[asyncio.Future] = None
        self._tx_fut: Optional[asyncio.Future] = None
        self._send_lock: Optional[asyncio.Lock] = None
        self._async_spin_ns = 10_000  # Channel.async_spin_us

    # ------------------------------------------------------------------ loop registration
    def _attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        e = self._ends
        if self._loop is not None:
            self._detach_loop()
        e.life.enter()  # the registration's use, ended by _detach_loop()
        self._loop = loop
        self._send_lock = asyncio.Lock()
        loop.add_reader(e.rx.data_efd, self._on_rx_event)
        loop.add_reader(e.tx.space_efd, self._on_tx_event)
        self._loop_fds = [e.rx.data_efd, e.tx.space_efd]
        peer = e.res.peer
        if peer is not None and peer.fd is not None and not e.peer_dead:
            loop.add_reader(peer.fd, self._on_peer_event)
            self._loop_fds.append(peer.fd)

    def _detach_loop(self) -> None:
        """Unregister from the loop (on the loop's thread, or with the loop stopped), wake the
        awaiting tasks, and end the registration's use. Re-registered by the next async call."""
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
            self._ends.life.leave()

    def _close_async(self) -> None:
        """Channel.close (any thread): detach now if we are on the loop or it is stopped,
        else on the loop, where the readers run."""
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
        clear_eventfd(self._ends.rx.data_efd)
        _resolve(self._rx_fut)

    def _on_tx_event(self) -> None:
        clear_eventfd(self._ends.tx.space_efd)
        _resolve(self._tx_fut)

    def _on_peer_event(self) -> None:
        e = self._ends
        e.peer_dead = True
        fd = e.res.peer.fd if e.res.peer else None
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
        assert loop is not None  # attached by _loop_for_wait before any wait
        fut = loop.create_future()
        setattr(self, slot, fut)
        timer = None if deadline is None else loop.call_at(deadline, _resolve, fut)
        try:
            await fut
        finally:
            setattr(self, slot, None)
            if timer is not None:
                timer.cancel()

    def _disarm(self, disarm: Any, handle: Any) -> None:
        """Undo an arm after the wait, unless the channel has been closed meanwhile."""
        life = self._ends.life
        if life.try_enter():
            try:
                disarm(handle)
            finally:
                life.leave()

    # ------------------------------------------------------------------ receiving
    async def recv_batch_async(self, max_messages: Optional[int] = None, timeout: Optional[float] = None) -> list:
        """Await at least one message, then return all available (at most ``max_messages``);
        ``[]`` once ``timeout`` passes."""
        e = self._ends
        out: list = []
        room = BATCH_RECORDS if max_messages is None else min(max_messages, BATCH_RECORDS)
        uses = e.uses  # the fast path, in a use written out (see channel_sync.py)
        uses.append(None)
        try:
            if e.life.closed:
                raise closed_here()
            e.drain(out, max_messages)
            if not out and self._async_spin_ns:
                e.drain_ring(out, room, self._async_spin_ns, self._async_spin_ns)
            if out:
                return out
            loop = self._loop_for_wait()
        finally:
            del uses[-1]
            if e.life.closed and not uses:
                e.release()
        if self._rx_fut is not None:
            raise RuntimeError("another task is already awaiting a receive on this channel")
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with e.life:
                armed = not lib.ring_arm_data(e.c)
            if armed:
                try:
                    if not (e.peer_dead or (deadline is not None and loop.time() >= deadline)):
                        await self._sleep_on("_rx_fut", deadline)
                finally:
                    self._disarm(lib.ring_disarm_data, e.c)
            with e.life:
                e.drain(out, max_messages)
                if out:
                    return out
                if e.rx_closed():
                    raise e.peer_closed_error("recv")
            if not e.peer_alive():
                raise e.peer_error()
            if deadline is not None and loop.time() >= deadline:
                return out

    async def recv_async(self, timeout: Optional[float] = None) -> Any:
        """The next message; TimeoutError if none came within ``timeout``."""
        e = self._ends
        batch: list = []
        uses = e.uses  # the fast path, in a use written out (see channel_sync.py)
        uses.append(None)
        try:
            if e.life.closed:
                raise closed_here()
            if e.ready:
                return e.ready.popleft()
            try:
                e.rx.drain(e.decoders, batch, BATCH_RECORDS, self._async_spin_ns, self._async_spin_ns)
            except TransportError:
                e.keep(batch)
                raise
        finally:
            del uses[-1]
            if e.life.closed and not uses:
                e.release()
        if not batch:
            batch = await self.recv_batch_async(timeout=timeout)
            if not batch:
                raise TimeoutError("recv_async timed out")
        if len(batch) > 1:
            e.ready.extend(batch[1:])
        return batch[0]

    # ------------------------------------------------------------------ sending
    async def send_async(self, msg: Any, timeout: Optional[float] = None) -> None:
        """Send, awaiting space without blocking the loop (TimeoutError after ``timeout``)."""
        e = self._ends
        uses = e.uses  # the fast path, in a use written out (see channel_sync.py)
        uses.append(None)
        try:
            if e.life.closed:
                raise closed_here()
            kind, body = e.encode(msg)
            mine: Optional[tuple] = (kind, body, 0)
            lock = self._send_lock
            if e.pending is None and (lock is None or not lock.locked()):
                done = e.write(kind, body, 0)
                if done == len(body) + 1:
                    return
                if done < 0:
                    raise_status(done, "send")
                if done:
                    e.pending, mine = (kind, body, done), None  # finished below, or by a Pusher
            loop = self._loop_for_wait()
        finally:
            del uses[-1]
            if e.life.closed and not uses:
                e.release()
        deadline = None if timeout is None else loop.time() + timeout
        assert self._send_lock is not None  # made with the loop, by _loop_for_wait above
        async with self._send_lock:
            try:
                while True:
                    pusher = e.pusher
                    if pusher is not None:  # an earlier message is being finished in a thread
                        await self._await_pusher(pusher, deadline, timeout)
                        continue
                    with e.life:
                        if mine is None and (e.pending is None or e.pending[1] is not body):
                            return  # ours is out (a try_send on the loop may have pushed it on)
                        if e.pending is None:
                            e.pending, mine = mine, None
                        if e.flush_pending():
                            continue
                        if not e.peer_alive():
                            raise e.peer_error()
                        if deadline is not None and loop.time() >= deadline:
                            raise TimeoutError(f"send_async timed out after {timeout} s: the peer is not reading")
                        armed = not lib.ring_arm_space(e.p)
                    if armed:
                        try:
                            await self._sleep_on("_tx_fut", deadline)
                        finally:
                            self._disarm(lib.ring_disarm_space, e.p)
            except BaseException:
                e.forget_unsent(body)  # and what is half-sent goes out whole all the same
                raise

    async def _await_pusher(self, pusher: Any, deadline: Optional[float], timeout: Optional[float]) -> None:
        """Await the end of the Pusher thread (pusher.py) without blocking the loop: it wakes us
        through call_soon_threadsafe; a close or the peer's death wake us as for space."""
        loop = self._loop
        assert loop is not None  # attached by _loop_for_wait before any wait
        if deadline is not None and loop.time() >= deadline:
            raise TimeoutError(f"send_async timed out after {timeout} s: the peer is not reading")
        if pusher.add_done_callback(lambda: _call_soon(loop, self._on_pusher_done)):
            await self._sleep_on("_tx_fut", deadline)
        if self._ends.life.closed:
            raise closed_here()

    def _on_pusher_done(self) -> None:
        _resolve(self._tx_fut)
