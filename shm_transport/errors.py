"""Transport errors. Every failure of the ring raises one of these (or ValueError/TypeError for
bad arguments), each with a message that names the problem."""


class TransportError(Exception):
    """Base class of every transport failure."""


class ChannelClosed(TransportError):
    """The channel was closed, by this process or by the peer (an orderly end)."""


class PeerDied(TransportError):
    """The peer process exited without closing the channel."""


class CorruptRing(TransportError):
    """The shared segment holds something this code never writes: a bad record, a bad header
    (magic, version, capacity), or counters that cannot be. The ring is unusable afterwards."""


class MessageTooLarge(TransportError, ValueError):
    """A message is larger than the channel's ``max_message_size``."""


class SegmentError(TransportError, OSError):
    """A shared-memory segment could not be created, sized or mapped (e.g. /dev/shm too small)."""
