"""Wake-up plumbing outside the ring itself: eventfds, peer liveness (pidfd), parent-death signal.

The futex half of waking lives in C (csrc/ring/wake.c); this module owns the file descriptors.
"""

from __future__ import annotations

import os
import select
import signal
from typing import Optional

from ._ring import lib
from .errors import PeerDied


def new_eventfd() -> int:
    """A non-blocking, close-on-exec eventfd (pass_fds makes it inheritable for the peer)."""
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def clear_eventfd(fd: int) -> None:
    """Reset an eventfd's counter (the asyncio readers call this when it fires)."""
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, OSError):
        pass


class PeerWatch:
    """Watch one process through a pidfd: readable (and ``alive()`` False) once it has exited."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd: Optional[int] = os.pidfd_open(pid)
        except ProcessLookupError:
            raise PeerDied(f"peer process {pid} does not exist (it has already exited)") from None

    def alive(self) -> bool:
        """Safe from any thread (a poll object per call: they may not be shared)."""
        fd = self.fd
        if fd is None:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return not poller.poll(0)

    def describe(self) -> str:
        """How the peer ended, as far as we can tell without reaping it."""
        what = f"peer process {self.pid} died"
        if self.fd is None:
            return what
        try:
            info = os.waitid(os.P_PIDFD, self.fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, OSError, AttributeError):
            return what
        if info is None:
            return what
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            try:
                name = signal.Signals(info.si_status).name
            except ValueError:
                name = str(info.si_status)
            return f"{what} (killed by {name})"
        return f"{what} (exit status {info.si_status})"

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def set_parent_death_signal(sig: int = signal.SIGKILL, expected_parent: Optional[int] = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (PR_SET_PDEATHSIG).

    Call it first thing in a child. If ``expected_parent`` is given and the parent has already
    changed (it died before the call), the signal is raised at once, closing the race.
    """
    rc = lib.ring_set_pdeathsig(int(sig))
    if rc != 0:
        raise OSError(-rc, f"prctl(PR_SET_PDEATHSIG): {os.strerror(-rc)}")
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


def set_child_subreaper(on: bool = True) -> None:
    """Adopt orphaned descendants (PR_SET_CHILD_SUBREAPER), so tests can see and reap them."""
    rc = lib.ring_set_child_subreaper(1 if on else 0)
    if rc != 0:
        raise OSError(-rc, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(-rc)}")
