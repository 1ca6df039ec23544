"""Setting up a channel's two ring ends: segments, eventfds and the peer token, on either side.

Everything allocated is held by one ``Resources`` object, released exactly once (by
``Channel.close`` or, failing that, when the channel is garbage collected), and released at
once if set-up fails half-way, so a failed create or attach leaves no fd and no mapping.
"""

from __future__ import annotations

import errno
import os
from typing import Optional

from .errors import PeerDied, SegmentError
from .peer_token import PeerToken, RingSpec
from .ring import Consumer, Producer, attach_ring, check_capacity, new_ring
from .wakeup import PeerWatch, new_eventfd


class Resources:
    """Everything a channel holds outside Python objects."""

    def __init__(self) -> None:
        self.segments: list = []
        self.fds: list[int] = []
        self.peer: Optional[PeerWatch] = None
        self.ends: list = []  # Producer, Consumer: closed (peer notified) before unmapping

    def release(self) -> None:
        for end in self.ends:
            if end.segment.base is not None:
                end.close()
        for seg in self.segments:
            seg.unmap()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        if self.peer is not None:
            self.peer.close()


def create(
    capacity: int, recv_capacity: Optional[int], max_message_size: int
) -> tuple[Producer, Consumer, Resources, PeerToken]:
    """The creator's ends: two fresh rings and four eventfds, and the token for the peer."""
    check_capacity(capacity)
    recv_capacity = check_capacity(capacity if recv_capacity is None else recv_capacity, "recv_capacity")
    if isinstance(max_message_size, bool) or not isinstance(max_message_size, int) or max_message_size < 1:
        raise ValueError(f"max_message_size must be a positive int, got {max_message_size!r}")
    res = Resources()
    try:
        res.segments = [new_ring(capacity), new_ring(recv_capacity)]
        res.fds = [new_eventfd() for _ in range(4)]
    except BaseException:
        res.release()
        raise
    tx_seg, rx_seg = res.segments
    tx_data, tx_space, rx_data, rx_space = res.fds
    tx = Producer(tx_seg, capacity, tx_data, tx_space)
    rx = Consumer(rx_seg, recv_capacity, rx_data, rx_space, max_message_size)
    res.ends = [tx, rx]
    token = PeerToken(
        os.getpid(),
        max_message_size,
        tx=RingSpec(rx_seg.fd, recv_capacity, rx_data, rx_space),
        rx=RingSpec(tx_seg.fd, capacity, tx_data, tx_space),
    )
    return tx, rx, res, token


def attach(token: str, peer_pid: Optional[int]) -> tuple[Producer, Consumer, Resources, PeerToken]:
    """The peer's ends, from the token and the fds it inherited; watches ``peer_pid``."""
    tok = PeerToken.parse(token)
    res = Resources()
    try:
        if peer_pid is not None and peer_pid != tok.creator_pid:
            raise PeerDied(
                f"the channel's creator (pid {tok.creator_pid}) is not the expected "
                f"peer {peer_pid}: it has probably exited already"
            )
        res.peer = PeerWatch(tok.creator_pid if peer_pid is None else peer_pid)
        for spec in (tok.tx, tok.rx):
            res.segments.append(attach_ring(spec.fd, spec.capacity))
        for seg in res.segments:
            seg.close_fd()  # mapped: the fd is no longer needed
        for fd in (tok.tx.data_efd, tok.tx.space_efd, tok.rx.data_efd, tok.rx.space_efd):
            try:
                os.fstat(fd)
            except OSError:
                raise SegmentError(
                    errno.EBADF, f"eventfd {fd} from the peer token is not open (was it passed with pass_fds?)"
                ) from None
            res.fds.append(fd)
    except BaseException:
        res.release()
        raise
    tx = Producer(res.segments[0], tok.tx.capacity, tok.tx.data_efd, tok.tx.space_efd)
    rx = Consumer(res.segments[1], tok.rx.capacity, tok.rx.data_efd, tok.rx.space_efd, tok.max_message_size)
    res.ends = [tx, rx]
    return tx, rx, res, tok
