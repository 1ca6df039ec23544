"""A channel's peer end handed to a running process (shm_transport/handoff.py) and one reader
waiting on several channels (channel_set.py): what ``--api-server-count`` builds on."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from shm_transport import Channel, ChannelClosed
from shm_transport.channel_set import wait_any
from shm_transport.handoff import close_token_fds, recv_token, send_peer_end, send_token

from tests.helpers import transport_peer as peer
from tests.helpers.transport_peer import Data


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def _handed_over(capacity: int = 1 << 17) -> tuple[Channel, Channel]:
    """Create a channel, pass its peer end over a socket pair (forwarded once, as the launcher
    does), attach the received end: both ends in this process, by way of SCM_RIGHTS."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b, c, d:
        created = Channel.create(peer.codec(), capacity=capacity)
        send_peer_end(a, created, b"meta")
        created.close_peer_fds()
        token, meta = recv_token(b, timeout=5)
        send_token(c, token, meta)
        close_token_fds(token)
        token, meta = recv_token(d, timeout=5)
    assert meta == b"meta"
    return created, Channel.attach(peer.codec(), token)


def test_a_handed_over_end_carries_messages_both_ways_and_leaks_no_fd():
    before = open_fds()
    created, attached = _handed_over()
    sent = [Data(i, i, os.urandom(n)) for i, n in enumerate([0, 10, 9000, 50000])]
    for msg in sent:
        created.send(msg, timeout=5)
    got = []
    while len(got) < len(sent):
        got += attached.recv_batch(timeout=5)
    assert got == sent
    attached.send(Data(99, 1, b"back"), timeout=5)
    assert created.recv(timeout=5) == Data(99, 1, b"back")
    attached.close()
    with pytest.raises(ChannelClosed):
        created.recv(timeout=5)
    created.close()
    assert open_fds() == before


def test_recv_token_times_out_and_reports_a_closed_sender():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with b:
        with pytest.raises(TimeoutError):
            recv_token(b, timeout=0.05)
        a.close()
        with pytest.raises(EOFError):
            recv_token(b, timeout=5)


def test_wait_any_wakes_for_whichever_channel_gets_a_message():
    ends = [Channel.pair(peer.codec(), capacity=4096) for _ in range(3)]
    try:
        readers = [b for _, b in ends]
        wait_any(readers, timeout=0.01)  # nothing there: returns after the timeout
        assert all(r.poll() == [] for r in readers)
        threading.Timer(0.05, lambda: ends[2][0].send(Data(7, 7, b"x"))).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            wait_any(readers, timeout=None)
            got = readers[2].poll()
            if got:
                break
        assert got == [Data(7, 7, b"x")] and readers[0].poll() == [] and readers[1].poll() == []
    finally:
        for a, b in ends:
            a.close()
            b.close()


def test_wait_any_returns_for_an_extra_fd():
    a, b = Channel.pair(peer.codec(), capacity=4096)
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        threading.Timer(0.05, os.eventfd_write, (efd, 1)).start()
        wait_any([b], timeout=30, extra_fds=[efd])
        assert os.eventfd_read(efd) == 1
    finally:
        os.close(efd)
        a.close()
        b.close()
