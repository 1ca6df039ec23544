"""One SPSC ring over one segment: the producer end and the consumer end (Python side of csrc/).

``Producer`` writes whole messages (``write``; large ones as fragments) or claims space to fill
in place (``claim`` + ``commit``). ``Consumer`` reads a batch of records (``read``), hands each
message to a decode function while its bytes are still in shared memory, and only then releases
the space (``release``). Fragments are reassembled here, up to ``max_message_size``.

Each end belongs to one thread. Neither end blocks: waiting (spin, futex, eventfd) is
``wait_*``/``arm_*`` here and policy (timeouts, liveness) lives in channel.py.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ._ring import ffi, lib
from .errors import ChannelClosed, CorruptRing, MessageTooLarge, TransportError
from .segment import Segment

HEADER_SIZE = lib.RING_HEADER_SIZE
MIN_CAPACITY = lib.RING_MIN_CAPACITY
MAX_CAPACITY = 1 << 32
DEFAULT_MAX_MESSAGE_SIZE = 256 << 20
BATCH_RECORDS = 1024
_ring_next = lib.ring_next
_ring_writev = lib.ring_writev

READY, WOKEN, TIMEOUT = lib.RING_READY, lib.RING_WOKEN, lib.RING_TIMEOUT
FULL, CLOSED, CORRUPT = lib.RING_FULL, lib.RING_CLOSED, lib.RING_E_CORRUPT
_MSG, _FIRST, _MORE, _LAST = (lib.RING_REC_MSG, lib.RING_REC_FRAG_FIRST, lib.RING_REC_FRAG_MORE, lib.RING_REC_FRAG_LAST)


def _empty_frame():
    raise CorruptRing("an empty message: no kind byte")


def _decode_error(e: Exception) -> CorruptRing:
    if isinstance(e, IndexError):
        return CorruptRing(f"a message of unknown kind (not in this codec): {e}")
    return CorruptRing(f"a message failed to decode: {e}")


def check_capacity(capacity: Any, what: str = "capacity") -> int:
    """Validate a ring capacity: an int, a power of two, within [4 KiB, 4 GiB]."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"{what} must be an int, got {type(capacity).__name__}")
    if capacity < MIN_CAPACITY or capacity > MAX_CAPACITY:
        raise ValueError(f"{what} must be between {MIN_CAPACITY} and {MAX_CAPACITY} bytes, got {capacity}")
    if capacity & (capacity - 1):
        raise ValueError(f"{what} must be a power of two, got {capacity}")
    return capacity


def raise_status(rc: int, where: str) -> None:
    """Turn a negative C status into the matching exception."""
    if rc == CLOSED:
        raise ChannelClosed(f"{where}: the peer closed the channel")
    if rc == CORRUPT:
        raise CorruptRing(f"{where}: the ring holds an impossible record or counter; it is unusable")
    raise TransportError(f"{where}: ring error {rc}")


class _End:
    """What both ends share: the segment, the two eventfds, the C handle, counters and close."""

    _STATS: tuple = ()  # names of the four counters ring_*_stats fills in

    def __init__(
        self, segment: Segment, capacity: int, data_efd: int, space_efd: int, new: Any, free: Any, stats: Any
    ) -> None:
        self.segment = segment
        self.capacity = capacity
        self.data_efd, self.space_efd = data_efd, space_efd
        self.handle = ffi.gc(new(segment.base, data_efd, space_efd), free)
        self._stats = stats

    def stats(self) -> dict:
        out = ffi.new("uint64_t[4]")
        self._stats(self.handle, out)
        return dict(zip(self._STATS, out))

    def close(self) -> None:
        """Mark the ring closed and wake both sides."""
        lib.ring_close(self.segment.base, self.data_efd, self.space_efd)


class Producer(_End):
    """The writing end of a ring. ``data_efd`` is the consumer's eventfd (written to wake an
    asyncio consumer), ``space_efd`` ours (written by the consumer when we wait for space)."""

    _STATS = ("sleeps", "timeouts", "wakes", "full")

    def __init__(self, segment: Segment, capacity: int, data_efd: int = -1, space_efd: int = -1) -> None:
        super().__init__(
            segment,
            capacity,
            data_efd,
            space_efd,
            lib.ring_producer_new,
            lib.ring_producer_free,
            lib.ring_producer_stats,
        )

    def write(self, data: bytes, prefix: int = -1, done: int = 0) -> int:
        """Write ``prefix`` (a byte, or -1 for none) + ``data`` from byte ``done`` on; return the
        new progress. A message that fits one record is all or nothing (progress 0 when full);
        a larger one goes out as fragments as far as space allows."""
        rc = lib.ring_write(self.handle, prefix, data, len(data), done)
        if rc < 0:
            raise_status(rc, "write")
        return rc

    def claim(self, length: int) -> memoryview:
        """Reserve one record of ``length`` payload bytes and return it to fill in place.
        Raises BufferError when the ring is full; nothing is visible until ``commit()``."""
        out = ffi.new("char **")
        rc = lib.ring_claim(self.handle, length, out)
        if rc == FULL:
            raise BufferError(f"ring full: no room for a {length}-byte record now")
        if rc == lib.RING_E_TOO_BIG:
            raise ValueError(f"a single record holds at most {self.capacity // 2 - 8} bytes, asked {length}")
        if rc < 0:
            raise_status(rc, "claim")
        return memoryview(ffi.buffer(out[0], length))

    def commit(self) -> None:
        """Publish every claimed record (and wake the consumer if it sleeps)."""
        lib.ring_commit(self.handle)

    def free_bytes(self) -> int:
        return lib.ring_free_bytes(self.handle)


class Gather:
    """A message in parts (e.g. an out-of-band frame: a header, then large payloads), written
    with ``ring_writev``: gathered straight into the ring, one copy of each part. Holds the parts
    (and the pointers to them) until the message has been written completely."""

    __slots__ = ("parts", "_bufs", "_ptrs", "_lens", "_size")

    def __init__(self, parts: list) -> None:
        self.parts = parts
        self._bufs = [ffi.from_buffer(x) for x in parts]
        self._ptrs = ffi.new("const char *[]", self._bufs)
        self._lens = ffi.new("uint64_t[]", [len(b) for b in self._bufs])
        self._size = sum(len(b) for b in self._bufs)

    def __len__(self) -> int:
        return self._size

    def write(self, handle: Any, prefix: int = -1, done: int = 0) -> int:
        """As ``Producer.write`` (``handle``: the producer's), for prefix||parts[0]||parts[1]||..."""
        return _ring_writev(handle, prefix, self._ptrs, self._lens, len(self.parts), done)


class Consumer(_End):
    """The reading end of a ring. ``data_efd`` is ours (the producer writes it to wake an
    asyncio reader), ``space_efd`` the producer's (written when it waits for space)."""

    _STATS = ("sleeps", "timeouts", "wakes", "late")

    def __init__(
        self,
        segment: Segment,
        capacity: int,
        data_efd: int = -1,
        space_efd: int = -1,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        super().__init__(
            segment,
            capacity,
            data_efd,
            space_efd,
            lib.ring_consumer_new,
            lib.ring_consumer_free,
            lib.ring_consumer_stats,
        )
        self.max_message_size = max_message_size
        self.batch_bytes = 0  # see set_batch_bytes
        self._records = ffi.new("uint64_t[]", 2 * BATCH_RECORDS)
        self._recs = memoryview(ffi.buffer(self._records)).cast("Q")  # cheap indexing from Python
        self._release_now = capacity // 16  # a record this big is released at once, not lazily
        self._data = memoryview(ffi.buffer(segment.base + HEADER_SIZE, capacity))
        self._frag: Optional[bytearray] = None  # message being reassembled
        self._frag_pos = 0
        self._frag_skip = 0  # > 0: dropping an oversize message of this many bytes

    def drain(
        self,
        decoders: Optional[tuple],
        out: list,
        max_messages: int = BATCH_RECORDS,
        spin_ns: int = 0,
        timeout_ns: int = 0,
    ) -> int:
        """Read the messages available (at most ``max_messages``; if there are none, wait up to
        ``timeout_ns``, spinning the first ``spin_ns``) and decode them into ``out`` straight
        from shared memory. Returns the number of records consumed, or CLOSED once the ring is
        closed and empty.

        ``decoders[kind]`` decodes a message whose first byte is ``kind`` (MsgspecCodec's
        framing); with ``decoders=None`` each message is copied out as ``bytes``. The space is
        released once decoded: at the start of the next call (one C call per batch in the steady
        state), or at once for a large batch. A message that fails to decode does not stop the
        others: they are appended, and then the first error is raised."""
        records = self._records
        n = _ring_next(
            self.handle, records, max_messages if max_messages < BATCH_RECORDS else BATCH_RECORDS, spin_ns, timeout_ns
        )
        if n <= 0:
            if n < 0 and n != CLOSED:
                raise_status(n, "read")
            return n
        data = self._data
        if n == 1 and self._frag is None and not self._frag_skip:
            recs = self._recs
            off, word = recs[0], recs[1]
            length = word & 0xFFFFFFFF
            if word >> 32 == _MSG:
                try:
                    if decoders is None:
                        out.append(bytes(data[off : off + length]))
                    else:
                        out.append(
                            decoders[data[off]].decode(data[off + 1 : off + length]) if length else _empty_frame()
                        )
                except Exception as e:
                    raise _decode_error(e) from None
                finally:
                    if length > self._release_now:
                        lib.ring_release(self.handle)
                return 1
        vals = ffi.unpack(records, 2 * n)
        error: Optional[TransportError] = None
        plain = self._frag is None and not self._frag_skip
        try:
            for i in range(0, 2 * n, 2):
                off = vals[i]
                word = vals[i + 1]
                length = word & 0xFFFFFFFF
                if plain and word >> 32 == _MSG:
                    try:
                        if decoders is None:
                            out.append(bytes(data[off : off + length]))
                        else:
                            out.append(
                                decoders[data[off]].decode(data[off + 1 : off + length]) if length else _empty_frame()
                            )
                    except Exception as e:  # a bad message; keep going, report it after release
                        error = error or _decode_error(e)
                    continue
                try:
                    whole = self._fragment(word >> 32, off, length)
                    if whole is not None:
                        out.append(
                            bytes(whole)
                            if decoders is None
                            else decoders[whole[0]].decode(whole[1:])
                            if len(whole)
                            else _empty_frame()
                        )
                except TransportError as e:
                    error = error or e
                except Exception as e:
                    error = error or _decode_error(e)
                plain = self._frag is None and not self._frag_skip
        finally:
            lib.ring_release(self.handle)
        if error is not None:
            raise error
        return n

    def set_batch_bytes(self, nbytes: int) -> None:
        """End each batch once it holds ``nbytes`` of records (0: no limit, the default)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"batch_bytes must be an int >= 0, got {nbytes!r}")
        lib.ring_set_batch_bytes(self.handle, nbytes)
        self.batch_bytes = nbytes

    def release(self) -> None:
        """Give back the space of everything read so far (``drain`` does it lazily)."""
        lib.ring_release(self.handle)

    def _fragment(self, rtype: int, off: int, length: int) -> Optional[memoryview]:
        """Feed one record of a fragmented message; return the whole message when complete."""
        data = self._data
        if rtype == _FIRST:
            if self._frag is not None or self._frag_skip:
                self._frag, self._frag_skip = None, 0
                raise CorruptRing("a new fragmented message began before the previous one ended")
            if length < 8:
                raise CorruptRing(f"first fragment of {length} bytes has no total length")
            total = int.from_bytes(data[off : off + 8], "little")
            chunk = length - 8
            if total > self.max_message_size:
                self._frag_skip = max(total - chunk, 1)
                raise MessageTooLarge(
                    f"received a {total}-byte message; max_message_size is {self.max_message_size}: dropped"
                )
            if chunk >= total:
                raise CorruptRing(f"fragmented message of {total} bytes starts with {chunk} bytes")
            self._frag = bytearray(total)
            self._frag[0:chunk] = data[off + 8 : off + length]
            self._frag_pos = chunk
            return None
        if rtype not in (_MORE, _LAST, _MSG):
            raise CorruptRing(f"unknown record type {rtype}")
        if rtype == _MSG:
            self._frag, self._frag_skip = None, 0
            raise CorruptRing("a whole message arrived in the middle of a fragmented one")
        last = rtype == _LAST
        if self._frag_skip:
            if last:
                self._frag_skip = 0
            return None
        frag = self._frag
        if frag is None:
            raise CorruptRing("a fragment arrived without a first fragment")
        pos = self._frag_pos
        end = pos + length
        if end > len(frag) or (last and end != len(frag)) or (not last and end == len(frag)):
            self._frag = None
            raise CorruptRing(f"fragments add up to {end} bytes, the message declared {len(frag)}")
        frag[pos:end] = data[off : off + length]
        self._frag_pos = end
        if not last:
            return None
        self._frag = None
        return memoryview(frag)

    def read_raw(self, max_messages: int = BATCH_RECORDS) -> list[bytes]:
        """Drain as owned ``bytes`` (no codec): for tests and tools."""
        out: list = []
        try:
            self.drain(None, out, max_messages)
        finally:
            self.release()
        return out


def new_ring(capacity: int) -> Segment:
    """Create, size and initialise a segment holding an empty ring of ``capacity`` bytes."""
    check_capacity(capacity)
    seg = Segment.create(lib.ring_segment_size(capacity))
    lib.ring_init(seg.base, capacity, os.getpid())
    return seg


def attach_ring(fd: int, capacity: int) -> Segment:
    """Map a ring segment received from the peer and check its header."""
    check_capacity(capacity)
    seg = Segment.from_fd(fd, lib.ring_segment_size(capacity))
    try:
        seg.check(capacity)
    except BaseException:
        seg.fd = None  # the caller's fd: not ours to close
        seg.unmap()
        raise
    return seg
