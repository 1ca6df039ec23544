"""Shared-memory segments: created exclusive and unguessable, preallocated, mapped, unlinked at once.

The creator makes the segment through posix_ipc (``O_CREAT | O_EXCL``, mode 0600, a random name),
reserves its pages with ``posix_fallocate`` (so a too-small /dev/shm is a clear error now, not a
SIGBUS later), maps it, and unlinks the name straight away. The peer receives the file
descriptor at launch (``subprocess.Popen(..., pass_fds=...)``) and maps that. No name outlives
the create call, so no crash of either side can leave anything in /dev/shm.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

import posix_ipc

from ._ring import ffi, lib
from .errors import CorruptRing, SegmentError

SEGMENT_PREFIX = "/ringllm-"  # the /dev/shm entries (briefly) named by this module start so
SHM_DIR = "/dev/shm"

_CHECK_ERRORS = {
    lib.RING_E_MAGIC: "bad magic: this file descriptor is not a ringllm ring",
    lib.RING_E_VERSION: f"ring layout version differs from this build's ({lib.RING_VERSION})",
    lib.RING_E_CAPACITY: "ring capacity does not match the token, or the segment is too small",
}


def _shm_free_bytes() -> str:
    try:
        st = os.statvfs(SHM_DIR)
        return f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB free of {st.f_blocks * st.f_frsize / 2**20:.0f} MiB"
    except OSError:
        return "free space unknown"


class Segment:
    """A mapped shared-memory segment (its name, if it ever had one, is already unlinked).

    ``base`` is the mapping's address (a cffi ``void *``); ``fd`` stays open until
    ``close_fd()`` so that it can be handed to a peer process.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.fd: int | None = fd
        err = ffi.new("int *")
        base = lib.ring_map(fd, size, err)
        if base == ffi.NULL:
            raise SegmentError(
                err[0], f"cannot map shared-memory segment fd {fd} ({size} bytes): {os.strerror(err[0])}"
            )
        self.base = base

    @classmethod
    def create(cls, size: int) -> "Segment":
        """A new segment of ``size`` bytes, zero-filled, with no name left behind."""
        name = SEGMENT_PREFIX + secrets.token_hex(16)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        except posix_ipc.Error as e:
            raise SegmentError(errno.EIO, f"cannot create shared-memory segment in {SHM_DIR}: {e}") from e
        try:
            fd = os.dup(shm.fd)  # ours (close-on-exec; pass_fds lifts that for the peer)
        finally:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(name)  # the name is gone before anything can fail
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise SegmentError(
                        e.errno,
                        f"{SHM_DIR} is too small for a {size / 2**20:.1f} MiB ring "
                        f"segment ({_shm_free_bytes()}); give the container more shared "
                        f"memory (e.g. docker run --shm-size=1g) or use a smaller capacity",
                    ) from e
                raise SegmentError(e.errno, f"cannot size shared-memory segment: {e}") from e
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def from_fd(cls, fd: int, size: int) -> "Segment":
        """Map a segment received from the peer; checks the fd is an open shared-memory file."""
        try:
            st = os.fstat(fd)
        except OSError as e:
            raise SegmentError(
                e.errno, f"segment fd {fd} from the peer token is not open (was it passed with pass_fds?)"
            ) from e
        if not stat.S_ISREG(st.st_mode):
            raise CorruptRing(f"fd {fd} is not a shared-memory segment (mode {stat.filemode(st.st_mode)})")
        if st.st_size < size:
            raise CorruptRing(
                f"segment fd {fd} holds {st.st_size} bytes, the token's capacity needs {size}: "
                "not this channel's segment"
            )
        return cls(fd, size)

    def check(self, capacity: int) -> None:
        """Raise CorruptRing unless the header says: our magic, our version, this capacity."""
        rc = lib.ring_check(self.base, self.size, capacity)
        if rc != 0:
            raise CorruptRing(_CHECK_ERRORS.get(rc, f"ring header check failed ({rc})"))

    def view(self) -> memoryview:
        """The whole mapping as a writable memoryview (for tests and diagnostics)."""
        return memoryview(ffi.buffer(self.base, self.size))

    def close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def unmap(self) -> None:
        """Unmap. Nothing may touch ``base`` (or a view of it) afterwards."""
        self.close_fd()
        if self.base is not None:
            base, self.base = self.base, None
            lib.ring_unmap(base, self.size)
