"""shm_transport: typed messages between two processes over shared-memory SPSC rings.

Knows nothing of LLMs. See channel.py for the contract and csrc/ring/ring.h for the shared layout.

    codec = MsgspecCodec({0: Ping, 1: Pong})
    ch = Channel.create(codec)
    proc = subprocess.Popen([sys.executable, "-m", "child", ch.peer_token()], pass_fds=ch.peer_fds())
    ch.set_peer(proc.pid); ch.close_peer_fds()
    ch.send(Ping(1)); reply = ch.recv(timeout=5)
"""

from .channel import DEFAULT_CAPACITY, DEFAULT_SPIN_US, Channel
from .codec import MsgspecCodec
from .errors import ChannelClosed, CorruptRing, MessageTooLarge, PeerDied, SegmentError, TransportError
from .ring import DEFAULT_MAX_MESSAGE_SIZE, MIN_CAPACITY
from .segment import SEGMENT_PREFIX
from .wakeup import set_child_subreaper, set_parent_death_signal

__all__ = [
    "Channel",
    "MsgspecCodec",
    "TransportError",
    "ChannelClosed",
    "PeerDied",
    "CorruptRing",
    "MessageTooLarge",
    "SegmentError",
    "set_parent_death_signal",
    "set_child_subreaper",
    "DEFAULT_CAPACITY",
    "DEFAULT_SPIN_US",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MIN_CAPACITY",
    "SEGMENT_PREFIX",
]
