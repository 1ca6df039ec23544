"""A private directory for ``ipc://`` socket files, so that no other local user can connect.

Linux's abstract socket namespace (``ipc://@name``) has no permission check at all: any local
user can list the names (/proc/net/unix) and connect, read the requests and forge replies. A
socket file in a directory of mode 0700 owned by us can be reached by our user only (connect
needs search permission on every directory of the path). ``tempfile.mkdtemp`` creates exactly
that, under ``$XDG_RUNTIME_DIR`` (itself private, on tmpfs) when there is one, else the temp dir.

The side that creates the directory removes it (``remove``), on close, after a failed set-up,
and at interpreter exit at the latest; the peer that only connects never does.
"""

from __future__ import annotations

import os
import shutil
import tempfile

PREFIX = "ringllm-"  # the directories made here start so (the tests' leak check looks for them)
_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the NUL included


def base_dir() -> str:
    """Where the private directories are made: $XDG_RUNTIME_DIR if usable, else the temp dir."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        return runtime
    return tempfile.gettempdir()


def make() -> str:
    """A new, empty directory of mode 0700 owned by this process's user (see the docstring)."""
    path = tempfile.mkdtemp(prefix=PREFIX, dir=base_dir())
    if len(os.path.join(path, "x")) > _SOCKET_PATH_MAX - 8:
        os.rmdir(path)
        raise OSError(
            f"ipc socket directory {path!r} is too long for a unix socket path; "
            "set XDG_RUNTIME_DIR or TMPDIR to a shorter directory"
        )
    return path


def check(path: str) -> str:
    """Refuse a directory that others could enter or that is not ours (the connecting side)."""
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"ipc socket directory {path!r} is not private to this user "
            f"(owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)})"
        )
    return path


def remove(path: str) -> None:
    """Remove the directory and the socket files in it (idempotent)."""
    shutil.rmtree(path, ignore_errors=True)
