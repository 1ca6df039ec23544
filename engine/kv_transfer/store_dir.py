"""The KV store's directory: private to one user or refused, and opened so that nothing planted
in it can block an engine or pass for an entry.

Who may share a store: the processes of one user, and no one else. A directory that is missing
is created mode 0700. One that exists is used only if this process's user owns it and neither
its group nor others can write to it; otherwise ``StoreDirError`` names the path, its owner and
its mode. The directory is opened once (``O_DIRECTORY``) and every later operation is relative
to that descriptor, so a path renamed or replaced afterwards changes nothing for a running engine.

Files in it:
- Opened ``O_NOFOLLOW | O_NONBLOCK`` and ``fstat``-ed before any read: a symlink, a FIFO, a
  device, a directory, a file of another user or of the wrong size is a miss (``read_file``
  returns None). ``O_NONBLOCK`` is what keeps a FIFO from blocking the open itself (a FIFO opened
  for reading waits for a writer); the fstat then turns it away before any read.
- Created ``O_CREAT | O_EXCL | O_NOFOLLOW`` mode 0600 under a fresh random temporary name, written,
  then renamed into place (``publish``): a reader sees no file or a whole one, and a planted
  name is never written through.
- The secret (``SECRET_NAME``): 32 random bytes, mode 0600, made at first use by writing a
  temporary file and hard-linking it to its name. A link never replaces, so engines starting
  together agree on one secret. It keys the entries' MAC and their names (entry.py, store.py).
  A secret that is not a regular 0600 file of ours of exactly that size is refused, never
  replaced: replacing it would silently orphan every entry.

Bounded: every call is one system call on this directory or on a regular file of ours of a
known size, none waits for another process. This holds on a local filesystem (tmpfs such as
/dev/shm, a local disk); on a network or FUSE mount a call can stall in the kernel, which no
flag prevents, so the connector makes these calls on a thread of their own, with a deadline
(io_worker.py).
"""

from __future__ import annotations

import os
import pwd
import secrets
import stat
import weakref
from typing import Iterable, Iterator, Optional

SECRET_NAME = "store.secret"
SECRET_SIZE = 32
TMP_PREFIX = ".tmp-"
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class StoreDirError(ValueError):
    """The directory or its secret cannot be trusted or used; ``__cause__`` is an OSError."""


def describe_owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


class StoreDir:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = _open_private_dir(path)
        self._finalizer = weakref.finalize(self, os.close, self.fd)
        try:
            self.secret = self._load_or_create_secret()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._finalizer()

    # ------------------------------------------------------------------ entries
    def read_file(self, name: str, size: int) -> Optional[bytearray]:
        """The ``size`` bytes of ``name`` if it is a regular file of ours of exactly that size;
        else None (missing, planted, another user's, truncated or grown)."""
        try:
            fd = os.open(name, _OPEN_READ, dir_fd=self.fd)
        except OSError:
            return None  # missing, or a symlink (ELOOP)
        try:
            st = os.fstat(fd)
            if not _is_our_file(st) or st.st_size != size:
                return None
            data = bytearray(size + 1)  # one byte more: a file that grew since is no entry
            got = _read_into(fd, memoryview(data))
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if got == size else None

    def is_file(self, name: str) -> bool:
        """``name`` is a regular file of ours (no symlink is followed)."""
        try:
            return _is_our_file(os.stat(name, dir_fd=self.fd, follow_symlinks=False))
        except OSError:
            return False

    def publish(self, name: str, chunks: Iterable[memoryview | bytes], fsync: bool = False) -> None:
        """Write ``chunks`` to a new private temporary file and rename it to ``name`` (replacing
        whatever had that name); raises OSError (a full disk), leaving no temporary file."""
        tmp, fd = self._new_temp()
        try:
            try:
                for chunk in chunks:
                    _write_all(fd, chunk)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self.unlink(tmp)
            raise

    def touch(self, name: str) -> None:
        """Mark as recently used; a hint only (a consumer's read-only store, or evicted meanwhile)."""
        try:
            os.utime(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            pass

    def unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass

    def scan(self, suffix: str) -> Iterator[tuple[str, os.stat_result]]:
        """(name, lstat) of each regular file of ours whose name ends with ``suffix``; raises
        OSError if the directory cannot be listed."""
        with os.scandir(self.fd) as it:
            for e in it:
                if not e.name.endswith(suffix):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # deleted meanwhile by another engine
                if _is_our_file(st):
                    yield e.name, st

    def _new_temp(self) -> tuple[str, int]:
        while True:
            name = f"{TMP_PREFIX}{secrets.token_hex(8)}.kv"
            try:
                return name, os.open(name, _OPEN_NEW, 0o600, dir_fd=self.fd)
            except FileExistsError:
                continue

    # ------------------------------------------------------------------ the secret
    def _load_or_create_secret(self) -> bytes:
        try:
            return self._read_secret()
        except FileNotFoundError:
            pass
        try:
            self._publish_once(SECRET_NAME, secrets.token_bytes(SECRET_SIZE))
        except OSError as e:
            raise StoreDirError(f"cannot create the store secret {self._secret_path!r}: {e.strerror}") from e
        return self._read_secret()

    def _publish_once(self, name: str, data: bytes) -> None:
        """Give ``name`` the content ``data`` unless it exists already (then keep what is there)."""
        tmp, fd = self._new_temp()
        try:
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
        except FileExistsError:
            pass  # another engine made it first: use theirs
        finally:
            self.unlink(tmp)

    def _read_secret(self) -> bytes:
        """The secret; FileNotFoundError if there is none yet, StoreDirError if it is not trusted."""
        path = self._secret_path
        try:
            fd = os.open(SECRET_NAME, _OPEN_READ, dir_fd=self.fd)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StoreDirError(
                f"the store secret {path!r} cannot be opened ({e.strerror}); it must be a regular file"
            ) from e
        try:
            st = os.fstat(fd)
            if not _is_our_file(st) or st.st_mode & 0o077 or st.st_size != SECRET_SIZE:
                cause = PermissionError(
                    f"{path}: owner {describe_owner(st.st_uid)}, mode {_mode(st)}, {st.st_size} bytes"
                )
                raise StoreDirError(
                    f"the store secret {path!r} (owner {describe_owner(st.st_uid)}, mode {_mode(st)}, "
                    f"{st.st_size} bytes) is not a regular {SECRET_SIZE}-byte file of this server's user "
                    f"{describe_owner(os.geteuid())} with mode 0600; remove the store directory's "
                    "entries and the secret to start the store afresh"
                ) from cause
            data = bytearray(SECRET_SIZE + 1)
            got = _read_into(fd, memoryview(data))
        finally:
            os.close(fd)
        if got != SECRET_SIZE:
            raise StoreDirError(f"the store secret {path!r} changed while being read") from OSError(path)
        return bytes(data[:SECRET_SIZE])

    @property
    def _secret_path(self) -> str:
        return os.path.join(self.path, SECRET_NAME)


def _open_private_dir(path: str) -> int:
    """A descriptor of ``path``, created 0700 if missing; StoreDirError unless it is a directory
    owned by this process's user that neither group nor others may write."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise StoreDirError(f"cannot create directory {path!r}: {e.strerror}") from e
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise StoreDirError(f"cannot open directory {path!r}: {e.strerror}") from e
    st = os.fstat(fd)
    me, owner = os.geteuid(), describe_owner(st.st_uid)
    problem = None
    if st.st_uid != me:
        problem = (
            f"directory {path!r} is owned by {owner}, not by this server's user {describe_owner(me)}: "
            "a KV store may be shared only by processes of one user"
        )
    elif st.st_mode & 0o022:
        problem = (
            f"directory {path!r} (owner {owner}) has mode {_mode(st)}: its group or others can write "
            f"to it and plant entries; make it private (chmod 0700) or use a new path"
        )
    if problem is not None:
        os.close(fd)
        raise StoreDirError(problem) from PermissionError(f"{path}: owner {owner}, mode {_mode(st)}")
    return fd


def _read_into(fd: int, view: memoryview) -> int:
    """Read until ``view`` is full or the file ends; returns the bytes read."""
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if not n:
            break
        got += n
    return got


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def _is_our_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"
