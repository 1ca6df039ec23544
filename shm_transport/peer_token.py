"""The peer token: one line of text telling the child which fds carry which ring.

Written from the receiving process's point of view (its ``tx`` is the creator's ``rx``), e.g.
``ringllm1:pid=123:max=268435456:tx=5,4194304,7,8:rx=6,4194304,9,10`` where each ring is
``segment_fd,capacity,data_eventfd,space_eventfd``.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "ringllm1"


@dataclass(frozen=True)
class RingSpec:
    fd: int
    capacity: int
    data_efd: int
    space_efd: int

    def text(self) -> str:
        return f"{self.fd},{self.capacity},{self.data_efd},{self.space_efd}"


@dataclass(frozen=True)
class PeerToken:
    creator_pid: int
    max_message_size: int
    tx: RingSpec  # the ring the token's reader writes
    rx: RingSpec  # the ring the token's reader reads

    def text(self) -> str:
        return f"{PREFIX}:pid={self.creator_pid}:max={self.max_message_size}:tx={self.tx.text()}:rx={self.rx.text()}"

    @classmethod
    def parse(cls, token: str) -> "PeerToken":
        if not isinstance(token, str):
            raise TypeError(f"peer token must be a str, got {type(token).__name__}")
        parts = token.split(":")
        if not parts or parts[0] != PREFIX:
            raise ValueError(f"not a ringllm ring channel token (expected prefix {PREFIX!r}): {token!r}")
        try:
            fields = dict(p.split("=", 1) for p in parts[1:])
            rings = {}
            for key in ("tx", "rx"):
                fd, cap, d, s = (int(x) for x in fields[key].split(","))
                rings[key] = RingSpec(fd, cap, d, s)
            return cls(int(fields["pid"]), int(fields["max"]), rings["tx"], rings["rx"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"malformed ringllm channel token {token!r}: {e}") from None
