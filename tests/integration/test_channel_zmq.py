"""ZmqChannel (the --transport zmq baseline): its sockets are reachable by this user only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from shm_transport import ChannelClosed, ipc_dir
from shm_transport.zmq_channel import ZmqChannel

from tests.helpers import transport_peer as peer
from tests.helpers.transport_peer import Ctl

NOBODY = 65534


@pytest.fixture
def pair():
    a = ZmqChannel.create(peer.codec())
    b = ZmqChannel.attach(peer.codec(), a.peer_token())
    yield a, b
    b.close()
    a.close()


def _socket_dir(ch: ZmqChannel) -> str:
    return ch.peer_token().split(":", 1)[1]


def _my_unix_socket_names() -> list[str]:
    """The names (paths, or @abstract) of the unix sockets this process holds (/proc/net/unix
    lists every process's; other test runs may be using the machine)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [row[7] for row in rows if len(row) > 7 and row[6] in mine]


def test_sockets_live_in_a_private_directory_that_close_removes(pair):
    a, b = pair
    a.send(Ctl("hi"))
    assert b.recv(timeout=10) == Ctl("hi")
    d = _socket_dir(a)
    st = os.stat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    names = _my_unix_socket_names()
    assert not [n for n in names if n.startswith("@ringllm")], "abstract sockets: any local user may connect"
    assert {os.path.join(d, "a"), os.path.join(d, "b")} <= set(names)
    b.close()
    assert os.path.isdir(d), "the connecting side must not remove the creator's directory"
    a.close()
    assert not os.path.exists(d)


def _connect_as(uid: int, path: str) -> subprocess.CompletedProcess:
    """Connect to the unix socket ``path`` from a child running as ``uid`` (exit 13: EACCES)."""
    code = (
        "import os, socket, sys\n"
        f"if {uid} != os.getuid():\n"
        f"    os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({path!r})\n"
        "except PermissionError:\n"
        "    sys.exit(13)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a process as another user")
def test_another_local_user_cannot_connect(pair):
    a, _ = pair
    path = os.path.join(_socket_dir(a), "b")  # where the core would read requests from
    assert _connect_as(os.getuid(), path).returncode == 0  # the path is right: we may connect
    other = _connect_as(NOBODY, path)
    assert other.returncode == 13, other.stderr


def test_a_token_naming_a_shared_directory_is_refused(tmp_path):
    os.chmod(tmp_path, 0o777)
    with pytest.raises(PermissionError, match="not private"):
        ZmqChannel.attach(peer.codec(), f"zmq:{tmp_path}")


def _ipc_dirs() -> set[str]:
    return {n for n in os.listdir(ipc_dir.base_dir()) if n.startswith(ipc_dir.PREFIX)}


def test_failed_create_removes_its_directory():
    before = _ipc_dirs()
    with pytest.raises(TypeError):
        ZmqChannel.create(peer.codec(), capacity="big")  # setsockopt refuses it, after mkdtemp
    assert _ipc_dirs() == before


def test_close_from_another_thread_wakes_a_blocked_recv_and_wakeup_works(pair):
    a, b = pair
    b.wakeup()
    assert b.recv_batch(timeout=10) == []
    threading.Timer(0.1, b.close).start()
    with pytest.raises(ChannelClosed, match="this process"):
        b.recv(timeout=20)
