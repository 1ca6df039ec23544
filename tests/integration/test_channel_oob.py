"""Large bytes fields out of band (codec.py): the sender gathers them straight into the ring, the
receiver copies each once into an owned ``bytes``. Exact round trips (single records, wrap-around,
fragments, several fields, frozen and optional ones), the in-band fallbacks, corrupt frames, and
the receive batch's byte budget."""

from __future__ import annotations

import asyncio
import os
import random
import struct
import threading
import time
from typing import Annotated, Optional

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shm_transport import Channel, CorruptRing, MessageTooLarge, MsgspecCodec
from shm_transport.channel import BATCH_BYTES
from shm_transport.codec import OOB_KIND, OOB_MIN
from shm_transport.ring import HEADER_SIZE

from tests.helpers import transport_peer as peer
from tests.helpers.transport_peer import Ctl, Data

pytestmark = pytest.mark.timeout(120)


class Multi(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    first: bytes = b""
    second: Optional[bytes] = None
    small: bytes = b""
    ids: list[int] = []


class Guarded(msgspec.Struct):
    data: bytes

    def __post_init__(self):
        if not self.data:
            raise ValueError("empty")


class Limited(msgspec.Struct):
    data: Annotated[bytes, msgspec.Meta(min_length=1)]
    buf: bytearray = bytearray()
    text: str = ""


def codec() -> MsgspecCodec:
    return MsgspecCodec({0: Data, 1: Ctl, 2: Multi, 3: Guarded, 4: Limited})


def make_pair(capacity: int):
    return Channel.pair(codec(), capacity=capacity)


def first_payload_byte(ch: Channel) -> int:
    """The kind byte of the next unread message in the ring ``ch`` sends on (head at 0)."""
    return ch._ends.tx.segment.view()[HEADER_SIZE + 8]


@pytest.fixture
def big_pair():
    a, b = make_pair(1 << 20)
    yield a, b
    a.close()
    b.close()


# ---------------------------------------------------------------- which fields
def test_eligible_fields_are_plain_or_optional_bytes_of_types_without_post_init():
    c = codec()
    assert c.oob_fields[:6] == (("payload",), (), ("first", "second", "small"), (), (), ())
    assert c.send_info[Ctl] == (1, None)


# ---------------------------------------------------------------- round trips
def test_large_bytes_field_goes_out_of_band_and_round_trips_exactly(big_pair):
    a, b = big_pair
    payload = os.urandom(OOB_MIN + 12345)
    a.send(Data(7, 99, payload))
    assert first_payload_byte(a) == OOB_KIND
    got = b.recv(timeout=5)
    assert got == Data(7, 99, payload) and type(got.payload) is bytes


def test_small_bytes_and_other_values_stay_in_band(big_pair):
    a, b = big_pair
    a.send(Data(1, 2, b"s" * (OOB_MIN - 1)))
    assert first_payload_byte(a) == 0  # Data's own kind: plain msgpack
    assert b.recv(timeout=5).payload == b"s" * (OOB_MIN - 1)
    for m in (Data(3, 4, bytearray(b"b" * OOB_MIN)), Data(5, 6, memoryview(b"m" * OOB_MIN))):
        a.send(m)  # not bytes: encoded by msgspec, and decoded as bytes as always
        assert b.recv(timeout=5) == Data(m.seq, m.crc, bytes(m.payload))


def test_oob_min_setting_turns_it_off(big_pair):
    a, b = big_pair
    a.oob_min = 1 << 62
    payload = os.urandom(OOB_MIN * 2)
    a.send(Data(1, 0, payload))
    assert first_payload_byte(a) == 0
    assert b.recv(timeout=5).payload == payload


def test_several_fields_frozen_optional_and_defaults(big_pair):
    a, b = big_pair
    one, two = os.urandom(OOB_MIN), os.urandom(3 * OOB_MIN + 5)
    sent = [
        Multi("both", one, two, b"tiny", [1, 2]),
        Multi("second only", second=two),
        Multi("first only", first=one, second=None),
        Multi("none big", b"x", b"y", b"z"),
    ]
    for m in sent:
        a.send(m)
    got = [b.recv(timeout=5) for _ in sent]
    assert got == sent
    assert all(type(g.first) is bytes for g in got)


def test_types_with_validation_never_see_a_placeholder(big_pair):
    a, b = big_pair
    g, lim = Guarded(os.urandom(OOB_MIN * 2)), Limited(os.urandom(OOB_MIN * 2), bytearray(b"q" * OOB_MIN))
    a.send(g)
    a.send(lim)
    assert b.recv(timeout=5) == g
    assert b.recv(timeout=5) == lim


def test_receiver_owns_what_it_got_after_the_ring_is_overwritten():
    a, b = make_pair(1 << 18)  # 256 KiB: the next messages reuse the same bytes
    try:
        payload = os.urandom(100_000)
        a.send(Data(0, 0, payload))
        kept = b.recv(timeout=5)
        for i in range(20):
            a.send(Data(i + 1, 0, bytes([i]) * 100_000))
            assert b.recv(timeout=5).payload == bytes([i]) * 100_000
        assert kept.payload == payload
    finally:
        a.close()
        b.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 300_000), st.integers(0, 2 * OOB_MIN), st.booleans(), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([1 << 16, 1 << 17, 1 << 18]),
    st.integers(0, 2**32),
)
def test_random_sizes_round_trip_across_wrap_and_fragments(sizes, capacity, seed):
    """Payload sizes around the threshold and up to several times the ring (fragments), in
    rings of 64-256 KiB so records wrap with PADs; sent with send and with try_send (a
    half-sent fragmented message is finished before the next), read by another thread."""
    rng = random.Random(seed)
    a, b = make_pair(capacity)
    got: list = []

    def reader():
        while not got or got[-1] != Ctl("end"):
            got.extend(b.recv_batch(timeout=10))

    t = threading.Thread(target=reader)
    t.start()
    try:
        sent = []
        for i, (big, small, frozen, nonblocking) in enumerate(sizes):
            m = (
                Multi(str(i), rng.randbytes(big), rng.randbytes(small) if i % 2 else None, b"k" * (i % 5))
                if frozen
                else Data(i, small, rng.randbytes(big))
            )
            sent.append(m)
            if nonblocking:
                while not a.try_send(m):
                    time.sleep(0.0001)
            else:
                a.send(m, timeout=10)
        a.send(Ctl("end"), timeout=10)  # also finishes a half-sent try_send
    finally:
        t.join(timeout=30)
        a.close()
        b.close()
    assert got == sent + [Ctl("end")]


def test_out_of_band_through_a_child_process():
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    proc = peer.spawn(ch, "echo")
    try:
        sent = [Data(i, i, os.urandom(s)) for i, s in enumerate([OOB_MIN, 200_000, 70_000, 5, 1 << 20])]
        for m in sent:
            ch.send(m)
            assert ch.recv(timeout=10) == m
    finally:
        ch.close()
        proc.wait(timeout=10)


def test_send_async_goes_out_of_band():
    a, b = make_pair(1 << 16)
    try:
        payload = os.urandom(300_000)  # larger than the ring: fragments, while the reader reads

        async def main():
            reader = asyncio.get_running_loop().run_in_executor(None, lambda: b.recv(timeout=10))
            await a.send_async(Data(1, 2, payload), timeout=10)
            return await reader

        assert asyncio.run(main()) == Data(1, 2, payload)
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- corrupt frames
HEAD, FIELD = struct.Struct("<BBI"), struct.Struct("<BQ")


def oob_frame(kind: int, fields: list[tuple[int, int]], body: bytes, payload: bytes) -> bytes:
    return HEAD.pack(kind, len(fields), len(body)) + b"".join(FIELD.pack(*f) for f in fields) + body + payload


BODY = msgspec.msgpack.encode(Data(1, 2, b""))


@pytest.mark.parametrize(
    "frame, why",
    [
        (oob_frame(0, [(0, 4)], BODY, b"abcd")[:-1], "overruns"),
        (oob_frame(0, [(0, 4)], BODY, b"abcde"), "stray"),
        (oob_frame(0, [(1, 4)], BODY, b"abcd"), "slot"),
        (oob_frame(0, [], BODY, b""), "0 fields"),
        (oob_frame(1, [(0, 4)], msgspec.msgpack.encode(Ctl("x")), b"abcd"), "eligible"),
        (oob_frame(9, [(0, 4)], BODY, b"abcd"), "eligible"),
        (oob_frame(0, [(0, 4)], BODY + b"\xc1", b"abcd"), "decode"),
        (oob_frame(2, [(0, 1), (0, 1)], msgspec.msgpack.encode(Multi("m")), b"ab"), "repeats"),
        (HEAD.pack(0, 1, 3)[:4], "decode"),
    ],
)
def test_corrupt_out_of_band_frames_are_errors_and_the_stream_goes_on(big_pair, frame, why):
    a, b = big_pair
    a.send(Data(1, 0, b"before"))
    a._ends.tx.write(frame, prefix=OOB_KIND)
    a.send(Data(2, 0, b"after"))
    with pytest.raises(CorruptRing, match=why):
        b.poll()
    assert [m.seq for m in b.poll()] == [1, 2]


def test_a_well_formed_hand_made_frame_decodes(big_pair):
    a, b = big_pair
    a._ends.tx.write(oob_frame(0, [(0, 4)], BODY, b"abcd"), prefix=OOB_KIND)
    assert b.recv(timeout=5) == Data(1, 2, b"abcd")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzzed_out_of_band_frames_never_escape_as_other_errors(garbage):
    a, b = make_pair(1 << 16)
    try:
        a._ends.tx.write(garbage, prefix=OOB_KIND)
        a.send(Ctl("next"))
        try:
            got = b.poll()
        except CorruptRing:
            got = b.poll()
        assert got[-1] == Ctl("next") and all(isinstance(m, (Data, Ctl, Multi, Guarded, Limited)) for m in got)
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- batch byte budget
def test_receive_batches_stop_at_the_byte_budget(big_pair):
    a, b = big_pair
    assert b.batch_bytes == BATCH_BYTES == 256 << 10
    sent = [Data(i, 0, bytes([i]) * 200_000) for i in range(4)] + [Data(9, 0, b"small")]
    for m in sent:
        a.send(m)
    # 200 KB records: the second one takes a batch past 256 KiB, so it ends there
    assert [m.seq for m in b.recv_batch(timeout=5)] == [0, 1]
    assert [m.seq for m in b.poll()] == [2, 3]
    assert [m.seq for m in b.poll()] == [9]
    b.batch_bytes = 0  # no budget: everything available at once
    for m in sent:
        a.send(m)
    assert b.recv_batch(timeout=5) == sent
    with pytest.raises(ValueError):
        b.batch_bytes = -1


def test_max_message_size_holds_for_out_of_band_frames():
    a, b = Channel.pair(codec(), capacity=1 << 16, max_message_size=200_000)
    try:
        with pytest.raises(MessageTooLarge, match="max_message_size"):
            a.send(Data(1, 0, b"x" * 200_000))
        got: list = []
        t = threading.Thread(target=lambda: got.append(b.recv(timeout=10)))
        t.start()
        a.send(Data(2, 0, b"y" * 150_000), timeout=10)  # fragments, out of band
        t.join(timeout=20)
        assert got == [Data(2, 0, b"y" * 150_000)]
    finally:
        a.close()
        b.close()
