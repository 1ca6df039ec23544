"""The ring itself, in one process: exact record sequences, a property test against a pure-Python
reference model, corrupt-segment fuzzing, header checks, and a warning-free C build."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shm_transport import CorruptRing, MessageTooLarge, SegmentError, TransportError
from shm_transport import segment as segment_mod
from shm_transport.ring import HEADER_SIZE, Consumer, Gather, Producer, attach_ring, check_capacity, new_ring
from tests.helpers import ROOT

CAP = 4096
PAD, MSG, FIRST, MORE, LAST = 2, 1, 3, 4, 5


def align8(n: int) -> int:
    return (n + 7) & ~7


@pytest.fixture
def ring():
    seg = new_ring(CAP)
    p, c = Producer(seg, CAP), Consumer(seg, CAP, max_message_size=1 << 20)
    yield seg, p, c
    seg.unmap()


def header_at(seg, index: int) -> tuple[int, int]:
    return struct.unpack_from("<II", seg.view(), HEADER_SIZE + index)


def tail_of(seg) -> int:
    return struct.unpack_from("<Q", seg.view(), 128)[0]


def msg(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


# ---------------------------------------------------------------- exact sequences
def test_pads_record_at_wrap(ring):
    seg, p, c = ring
    assert p.write(b"a" * 2000) == 2000  # record 2008 bytes
    assert p.write(b"a" * 1000) == 1000  # record 1008 bytes: index 3016 next
    assert c.read_raw() == [b"a" * 2000, b"a" * 1000]
    assert p.write(b"b" * 1500) == 1500  # 1512 bytes do not fit in the last 1080
    assert header_at(seg, 3016) == (CAP - 3016 - 8, PAD)
    assert header_at(seg, 0) == (1500, MSG)
    assert tail_of(seg) == 3016 + (CAP - 3016) + 1512
    assert c.read_raw() == [b"b" * 1500]
    assert p.free_bytes() == CAP


def test_exact_fit_record_ends_at_ring_end_without_pad(ring):
    seg, p, c = ring
    assert p.write(b"x" * 2040) == 2040  # 2048 bytes
    c.read_raw()
    assert p.write(b"y" * 2040) == 2040  # ends exactly at 4096
    assert p.write(b"z" * 10) == 10  # starts at index 0: no PAD needed
    assert header_at(seg, 2048) == (2040, MSG)
    assert header_at(seg, 0) == (10, MSG)
    assert tail_of(seg) == 4096 + 24
    assert c.read_raw() == [b"y" * 2040, b"z" * 10]


def test_record_that_fills_free_space_exactly_fits_and_next_is_refused(ring):
    seg, p, c = ring
    assert p.write(b"1" * 2040) == 2040
    assert p.write(b"2" * 2032) == 2032  # 2040 bytes: free space is now 8
    assert p.free_bytes() == 8
    assert p.write(b"") == 0  # complete (total 0): an 8-byte zero-length record fits exactly
    assert p.free_bytes() == 0
    assert p.write(b"3") == 0  # full: nothing written, all or nothing
    assert c.read_raw() == [b"1" * 2040, b"2" * 2032, b""]
    assert p.free_bytes() == CAP


def test_zero_length_messages_take_one_header(ring):
    seg, p, c = ring
    for _ in range(3):
        assert p.write(b"") == 0  # progress 0 == total 0: complete
    assert tail_of(seg) == 24
    assert c.read_raw() == [b"", b"", b""]


def test_prefix_byte_travels_in_front_of_the_payload(ring):
    seg, p, c = ring
    assert p.write(b"body", prefix=7) == 5
    assert c.read_raw() == [b"\x07body"]


def test_full_ring_write_is_all_or_nothing(ring):
    seg, p, c = ring
    while p.write(b"q" * 100):
        pass
    before = tail_of(seg)
    assert p.write(b"r" * 100) == 0
    assert tail_of(seg) == before
    assert p.stats()["full"] >= 1


def test_claim_commit_writes_in_place_and_publishes_on_commit(ring):
    seg, p, c = ring
    view = p.claim(5)
    view[:] = b"hello"
    assert c.read_raw() == []  # claimed but not committed: invisible
    p.claim(3)[:] = b"abc"
    p.commit()
    assert c.read_raw() == [b"hello", b"abc"]
    with pytest.raises(ValueError, match="single record"):
        p.claim(CAP)


def test_fragments_reassemble_in_order_between_small_messages(ring):
    seg, p, c = ring
    big = os.urandom(3 * CAP + 123)
    assert p.write(b"before") == 6
    got, done = [], 0
    while done < len(big):  # the producer writes what fits, the consumer drains, repeat
        done = p.write(big, done=done)
        got += c.read_raw()
    assert p.write(b"after") == 5
    got += c.read_raw()
    assert got == [b"before", big, b"after"]


def test_fragment_records_are_first_more_last(ring):
    seg, p, c = ring
    big = b"F" * (CAP // 2 + 100)  # larger than capacity/2: fragments of capacity/4
    done = p.write(big)
    types = []
    pos = 0
    while pos < tail_of(seg):
        length, rtype = header_at(seg, pos % CAP)
        types.append(rtype)
        pos += align8(8 + length)
    assert types[0] == FIRST and types[-1] in (MORE, LAST) and set(types[1:-1]) <= {MORE}
    while done < len(big):
        c.read_raw()
        done = p.write(big, done=done)
    assert c.read_raw()[-1] == big


def test_oversize_message_is_dropped_with_error_and_the_stream_goes_on():
    seg = new_ring(CAP)
    try:
        p, c = Producer(seg, CAP), Consumer(seg, CAP, max_message_size=CAP)
        big, done = b"B" * (2 * CAP), 0
        p.write(b"one")
        with pytest.raises(MessageTooLarge, match="max_message_size"):
            while done < len(big):
                done = p.write(big, done=done)
                c.read_raw()
        while done < len(big):
            done = p.write(big, done=done)
            assert c.read_raw() == []  # the rest of the oversize message is skipped
        p.write(b"two")
        assert c.read_raw() == [b"two"]
    finally:
        seg.unmap()


def test_gather_write_is_one_record_of_the_parts(ring):
    seg, p, c = ring
    g = Gather([b"ab", b"", bytearray(b"cde"), memoryview(b"fgh")[1:]])
    assert len(g) == 7 and g.write(p.handle, 9) == 8
    assert header_at(seg, 0) == (8, MSG)
    assert g.write(p.handle) == 7  # no prefix
    assert c.read_raw() == [b"\x09abcdegh", b"abcdegh"]
    assert Gather([]).write(p.handle) == 0 and c.read_raw() == [b""]


def test_gather_write_fragments_across_part_boundaries(ring):
    seg, p, c = ring
    parts = [msg(1, 700), msg(2, 1), msg(3, 2500), b"", msg(4, 900)]  # 4101 bytes > CAP / 2
    g, done, got = Gather(parts), 0, []
    while done < len(g) + 1:
        done = g.write(p.handle, 5, done)
        got += c.read_raw()
    assert got == [b"\x05" + b"".join(parts)]


def test_batch_budget_ends_a_batch_once_it_holds_enough_bytes(ring):
    seg, p, c = ring
    c.set_batch_bytes(1000)
    for n in (600, 300, 200, 50, 900):  # records of 608, 312, 208, 64, 912 bytes
        assert p.write(b"x" * n) == n
    assert [len(m) for m in c.read_raw()] == [600, 300, 200]  # 1128 >= 1000: ends there
    assert [len(m) for m in c.read_raw()] == [50, 900]  # 976: all that is left
    p.write(b"y" * 1500)  # one record over the budget still comes, alone
    p.write(b"z")
    assert c.read_raw() == [b"y" * 1500]
    c.set_batch_bytes(0)
    for n in (600, 300, 200, 50):
        p.write(b"w" * n)
    assert [len(m) for m in c.read_raw()] == [1, 600, 300, 200, 50]
    with pytest.raises(ValueError):
        c.set_batch_bytes(-1)


# ---------------------------------------------------------------- property test vs a model
class RefRing:
    """Pure-Python model of the byte accounting: PAD at wrap, fragments of capacity/4."""

    def __init__(self, cap: int) -> None:
        self.cap, self.head, self.tail = cap, 0, 0
        self.completed: list[bytes] = []

    def _place(self, rec: int) -> bool:
        to_end = self.cap - self.tail % self.cap
        need = rec if rec <= to_end else to_end + rec
        if self.tail + need - self.head > self.cap:
            return False
        self.tail += need
        return True

    def write(self, data: bytes, done: int) -> int:
        total = len(data)
        if done == 0 and align8(8 + total) <= self.cap // 2:
            if not self._place(align8(8 + total)):
                return 0
            self.completed.append(data)
            return total
        frag_max = self.cap // 4 - 8
        while done < total:
            lead = 8 if done == 0 else 0
            chunk = min(total - done, frag_max - lead)
            if not self._place(align8(8 + lead + chunk)):
                return done
            done += chunk
        self.completed.append(data)
        return done

    def read(self) -> list[bytes]:
        self.head = self.tail
        out, self.completed = self.completed, []
        return out


sizes = st.one_of(st.integers(0, 64), st.integers(0, CAP // 2), st.integers(0, 3 * CAP))
ops = st.lists(st.one_of(st.tuples(st.sampled_from(["w", "g"]), sizes), st.just(("r", 0))), min_size=1, max_size=60)


def split(data: bytes, count: int) -> list[bytes]:
    """``data`` in parts at points that depend on ``count`` (some parts empty)."""
    cuts = sorted({0, len(data)} | {(len(data) * k // 4 + count * 37) % (len(data) + 1) for k in range(1, 4)})
    return [data[a:b] for a, b in zip(cuts, cuts[1:])] + [b""] * (count % 2)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_ring_matches_reference_model(operations):
    seg = new_ring(CAP)
    try:
        p, c, model = Producer(seg, CAP), Consumer(seg, CAP, max_message_size=1 << 20), RefRing(CAP)
        pending, count = None, 0
        for op, size in operations:
            if op in ("w", "g"):
                if pending is None:
                    count += 1
                    data = msg(count, size if op == "w" else max(size, 1))
                    # "g": the same bytes gathered from parts behind a prefix byte (ring_writev)
                    pending = (data, 0, None) if op == "w" else (data, 0, Gather(split(data[1:], count)))
                data, done, gather = pending
                got = p.write(data, done=done) if gather is None else gather.write(p.handle, data[0], done)
                assert got == model.write(data, done)
                pending = None if got == len(data) else (data, got, gather)
                assert p.free_bytes() == CAP - (model.tail - model.head)
            else:
                assert c.read_raw() == model.read()
        assert c.read_raw() == model.read()
    finally:
        seg.unmap()


# ---------------------------------------------------------------- trust nothing
def poke(seg, offset: int, data: bytes) -> None:
    seg.view()[offset : offset + len(data)] = data


def set_tail(seg, value: int) -> None:
    poke(seg, 128, struct.pack("<Q", value))


@pytest.mark.parametrize(
    "header, tail, why",
    [
        ((100, 9), 112, "unknown record type"),
        ((CAP, MSG), 16, "length beyond capacity"),
        ((CAP // 2, MSG), CAP, "record larger than capacity/2"),
        ((200, MSG), 64, "record beyond the published tail"),
        ((100, PAD), 112, "PAD at index 0 / wrong PAD length"),
        ((8, MSG), CAP + 8, "tail more than capacity ahead"),
        ((8, MSG), 13, "unaligned tail"),
    ],
)
def test_reader_rejects_corrupt_records(ring, header, tail, why):
    seg, p, c = ring
    poke(seg, HEADER_SIZE, struct.pack("<II", *header))
    set_tail(seg, tail)
    with pytest.raises(CorruptRing):
        c.read_raw()
    with pytest.raises(CorruptRing):  # and stays unusable
        c.read_raw()


def test_writer_rejects_impossible_head(ring):
    seg, p, c = ring
    while p.write(b"x" * 100):
        pass
    poke(seg, 256, struct.pack("<Q", 10**9))  # head ahead of tail
    with pytest.raises(CorruptRing):
        p.write(b"y" * 100)


@settings(max_examples=200, deadline=None)
@given(
    st.binary(min_size=0, max_size=512),
    st.integers(0, CAP // 8),
    st.one_of(st.integers(0, CAP + 16), st.integers(0, 2**64 - 1)),
)
def test_fuzzed_segment_never_reads_out_of_bounds(garbage, where, tail):
    seg = new_ring(CAP)
    try:
        c = Consumer(seg, CAP, max_message_size=1 << 16)
        poke(seg, HEADER_SIZE + 8 * where, garbage[: CAP - 8 * where])
        set_tail(seg, tail)
        try:
            for _ in range(3):
                for m in c.read_raw():
                    assert len(m) <= CAP
        except TransportError:
            pass
    finally:
        seg.unmap()


# ---------------------------------------------------------------- header and segment
def attach_copy(seg, cap: int) -> None:
    fd = os.dup(seg.fd)  # attach_ring owns the fd it maps; a failed attach leaves it to us
    try:
        attach_ring(fd, cap).unmap()
    except BaseException:
        os.close(fd)
        raise


def test_attach_checks_magic_version_and_capacity():
    seg = new_ring(CAP)
    try:
        attach_copy(seg, CAP)
        with pytest.raises(CorruptRing, match="capacity"):
            attach_copy(seg, 2 * CAP)
        poke(seg, 8, struct.pack("<I", 99))
        with pytest.raises(CorruptRing, match="version"):
            attach_copy(seg, CAP)
        poke(seg, 0, b"NOTARING")
        with pytest.raises(CorruptRing, match="magic"):
            attach_copy(seg, CAP)
    finally:
        seg.unmap()


def test_attach_to_missing_fd_names_the_problem():
    r, w = os.pipe()
    os.close(r), os.close(w)
    with pytest.raises(SegmentError, match="not open"):
        attach_ring(r, CAP)


def test_attach_to_foreign_file_names_the_problem(tmp_path):
    path = tmp_path / "foreign"
    path.write_bytes(b"\x00" * (HEADER_SIZE + CAP))
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(CorruptRing, match="magic"):
            attach_ring(fd, CAP)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "cap, err, match",
    [
        (6144, ValueError, "power of two"),
        (1024, ValueError, "between"),
        (1 << 40, ValueError, "between"),
        ("4096", TypeError, "int"),
        (4096.0, TypeError, "int"),
    ],
)
def test_bad_capacity_is_refused(cap, err, match):
    with pytest.raises(err, match=match):
        check_capacity(cap)


def test_segment_is_unlinked_and_private(ring):
    seg, p, c = ring
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("ringllm-")]
    assert os.fstat(seg.fd).st_mode & 0o777 == 0o600


def test_too_small_dev_shm_is_a_clear_error(monkeypatch):
    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_mod.os, "posix_fallocate", no_space)
    with pytest.raises(SegmentError, match="/dev/shm is too small.*shm-size"):
        new_ring(CAP)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_c_sources_compile_without_warnings():
    srcs = [os.path.join(ROOT, "csrc", "ring", n) for n in ("ring.c", "producer.c", "consumer.c", "wake.c")]
    res = subprocess.run(
        ["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *srcs],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
