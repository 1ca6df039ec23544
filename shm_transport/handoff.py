"""Handing a channel's peer end to a process that is already running, over a Unix socket.

At launch a peer end travels through ``Popen(pass_fds=...)`` and its token on the command line.
A process that starts later (an API server restarted next to a running EngineCore) cannot be
given fds that way, so here the token and its fds go as one SCM_RIGHTS message over a
``socket.socketpair``: the receiver gets its own fd numbers, and the token is rewritten to
name them before ``Channel.attach`` reads it. ``meta`` is whatever the two sides need to say
about the end (who the peer is); the transport does not read it.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

from .peer_token import PeerToken, RingSpec

_MAX_MESSAGE = 1 << 16
_MAX_FDS = 8  # a channel's peer end is 6: two segments and four eventfds


def _fds(tok: PeerToken) -> list[int]:
    return [tok.tx.fd, tok.rx.fd, tok.tx.data_efd, tok.tx.space_efd, tok.rx.data_efd, tok.rx.space_efd]


def _with_fds(tok: PeerToken, fds: list[int]) -> PeerToken:
    txs, rxs, txd, txsp, rxd, rxsp = fds
    return PeerToken(
        tok.creator_pid,
        tok.max_message_size,
        RingSpec(txs, tok.tx.capacity, txd, txsp),
        RingSpec(rxs, tok.rx.capacity, rxd, rxsp),
    )


def send_peer_end(sock: socket.socket, channel: Any, meta: bytes = b"") -> None:
    """Send ``channel``'s peer end (the creating side's ``peer_token`` and ``peer_fds``) and
    ``meta``; the caller then closes its copies with ``channel.close_peer_fds()``."""
    send_token(sock, channel.peer_token(), meta)


def send_token(sock: socket.socket, token: str, meta: bytes = b"") -> None:
    """Forward a token received with ``recv_token`` (its fds are this process's), e.g. from a
    launcher to the process that attaches; the caller closes its copies afterwards."""
    tok = PeerToken.parse(token)
    body = len(meta).to_bytes(4, "little") + meta + tok.text().encode()
    socket.send_fds(sock, [body], _fds(tok))


def recv_token(sock: socket.socket, timeout: Optional[float] = None) -> tuple[str, bytes]:
    """The next peer end: its token (naming the fds now open in this process) and ``meta``.
    ``TimeoutError`` after ``timeout``; ``EOFError`` once the sender has closed its socket."""
    sock.settimeout(timeout)
    try:
        body, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _MAX_FDS)
    except socket.timeout:
        raise TimeoutError("no channel end arrived in time") from None
    finally:
        sock.settimeout(None)
    try:
        if not body and not fds:
            raise EOFError("the sender closed its socket")
        n = int.from_bytes(body[:4], "little")
        meta, text = body[4 : 4 + n], body[4 + n :].decode()
        tok = PeerToken.parse(text)
        if len(fds) != len(_fds(tok)):
            raise ValueError(f"a channel end carries 6 fds, got {len(fds)}")
        return _with_fds(tok, fds).text(), meta
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def close_token_fds(token: str) -> None:
    """Close the fds a received token names (after forwarding it, or when it is not used)."""
    for fd in _fds(PeerToken.parse(token)):
        try:
            os.close(fd)
        except OSError:
            pass
