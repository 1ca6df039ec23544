"""When a channel's shared memory may be unmapped: only once no thread can still touch it.

``close()`` may come from any thread while others are blocked in (or just returning from) a call
that touches the mapping: a wait in C, a decode straight from shared memory, a ``ring_kick``.
If whoever noticed the close first unmapped the segments, the others (the closing thread itself
included, still in its ``ring_close`` calls) would touch freed memory: a SIGSEGV. So every such
call runs inside a *use*, and the resources are released by whoever ends the last use after the
close, be it the closer or a thread that the close woke.

Uses are counted in a list: ``append`` and ``del uses[-1]`` are atomic under the GIL, and a use
written out (both, and the two reads of the flag) costs ~30-40 ns here (``pop()`` instead of
``del`` ~10 more), a lock several times that; the send and receive fast paths take one use per
call. A use is taken *before* the closed flag is read and the flag is set *before* the closer
counts the uses, so either the user sees the flag (and backs out) or the closer sees the use
(and leaves the release to it). Two threads may both see the count drop to zero; the release
runs once (``weakref.finalize``).
"""

from __future__ import annotations

from typing import Callable

from .errors import ChannelClosed

CLOSED_HERE = "channel is closed (by this process)"


def closed_here() -> ChannelClosed:
    """The error of any call on a channel that this process has closed."""
    return ChannelClosed(CLOSED_HERE)


class Lifetime:
    """The closed flag, the uses in progress, and the release once the last of them ends.

    ``with lifetime:`` (or ``enter()`` ... ``leave()``) brackets a call that touches the mapping;
    entering a closed channel raises ChannelClosed. Hot paths inline the same two steps.
    """

    __slots__ = ("closed", "uses", "_release")

    def __init__(self, release: Callable[[], object]) -> None:
        self.closed = False
        self.uses: list = []  # one entry per use in progress (see the module docstring)
        self._release = release

    def enter(self) -> None:
        self.uses.append(None)
        if self.closed:
            self.leave()
            raise closed_here()

    def try_enter(self) -> bool:
        """``enter()`` that answers False instead of raising on a closed channel."""
        self.uses.append(None)
        if self.closed:
            self.leave()
            return False
        return True

    def leave(self) -> None:
        uses = self.uses
        del uses[-1]
        if self.closed and not uses:
            self._release()

    def __enter__(self) -> "Lifetime":
        self.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()

    def close(self, notify: Callable[[], None]) -> bool:
        """Set the flag and run ``notify`` (mark the rings closed, wake every waiter) inside a
        use of our own, so the resources outlive it; False if the channel was already closed."""
        self.uses.append(None)
        try:
            if self.closed:
                return False
            self.closed = True
            notify()
            return True
        finally:
            self.leave()
