"""The channel finishes what it starts: a message larger than the ring's free space, once a send
call has accepted it, arrives whole although the sender never sends again (issue 22).

Each test sends one ~250 KB message into a 64 KiB ring and then does nothing more on the sending
end; a reader on the other end must receive it within a generous deadline. Both directions of a
pair (the creator's ring and the attached side's), in-band and out-of-band bodies (the two write
paths: one buffer, or a gather of parts), the sync and the asyncio ends, and the zmq baseline.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from shm_transport import Channel, PeerDied
from shm_transport.zmq_channel import ZmqChannel

from tests.helpers import transport_peer as peer
from tests.helpers.transport_peer import Ctl, Data

CAPACITY = 64 << 10
BIG = 250_000  # ~4x the ring: it can only go out as the reader frees space
DEADLINE_S = 60.0  # generous: a loaded machine is slow, a hang is forever


def big_messages() -> list:
    """One message of each body kind: msgpack in one buffer, and large bytes out of band."""
    return [Ctl("big", 1, "x" * BIG), Data(7, 3, os.urandom(BIG))]


@pytest.fixture(params=["creator sends", "attached side sends"])
def ends(request):
    """(sender, receiver): both directions of one shared-memory pair."""
    a, b = Channel.pair(peer.codec(), capacity=CAPACITY)
    yield (a, b) if request.param == "creator sends" else (b, a)
    a.close()
    b.close()


@pytest.fixture
def zmq_ends():
    a = ZmqChannel.create(peer.codec(), capacity=CAPACITY)
    b = ZmqChannel.attach(peer.codec(), a.peer_token(), capacity=CAPACITY)
    yield a, b
    b.close()
    a.close()


class Reader:
    """A thread blocked in ``recv`` on the receiving end, as LLM's thread or the core's loop is."""

    def __init__(self, ch) -> None:
        self.got: list = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(ch,), daemon=True)
        self._thread.start()

    def _run(self, ch) -> None:
        try:
            self.got.append(ch.recv(timeout=DEADLINE_S))
        except BaseException as e:  # reported by result()
            self.error = e

    def result(self):
        self._thread.join(DEADLINE_S + 10)
        if self.error is not None:
            raise AssertionError(f"the message never arrived: {self.error!r}")
        return self.got[0]


def _pushers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shm-transport-pusher"]


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("msg", big_messages(), ids=["in band", "out of band"])
def test_try_send_of_a_message_larger_than_the_ring_arrives_without_another_send(ends, msg):
    sender, receiver = ends
    reader = Reader(receiver)
    assert sender.try_send(msg)  # the ring is empty: accepted
    assert reader.result() == msg


@pytest.mark.parametrize("msg", big_messages(), ids=["in band", "out of band"])
def test_try_send_on_an_event_loop_arrives_while_the_loop_idles(ends, msg):
    """The async client's pattern (try_send first, on the loop); then the loop only waits."""
    sender, receiver = ends
    reader = Reader(receiver)

    async def main():
        assert sender.try_send(msg)
        await asyncio.get_running_loop().run_in_executor(None, reader.result)

    asyncio.run(main())
    assert reader.result() == msg


def test_try_send_reaches_an_asyncio_reader(ends):
    sender, receiver = ends
    msg = big_messages()[1]

    async def main():
        receiving = asyncio.ensure_future(receiver.recv_async(timeout=DEADLINE_S))
        await asyncio.sleep(0)  # the reader is armed on its eventfd
        assert sender.try_send(msg)
        return await receiving

    assert asyncio.run(main()) == msg


def test_a_later_send_waits_for_the_half_sent_message_and_keeps_the_order(ends):
    """While the channel finishes a message, a second try_send is refused (nothing of it is
    written) and a blocking send goes out after it: no loss, duplication or reordering."""
    sender, receiver = ends
    first, second = big_messages()
    got: list = []
    assert sender.try_send(first)
    assert not sender.try_send(Ctl("small"))  # nobody reads yet: the first is still going out
    t = threading.Thread(target=lambda: got.extend(receiver.recv(timeout=DEADLINE_S) for _ in range(3)))
    t.start()
    sender.send(second, timeout=DEADLINE_S)
    sender.send(Ctl("end"), timeout=DEADLINE_S)
    t.join(DEADLINE_S + 10)
    assert got == [first, second, Ctl("end")]


@pytest.mark.parametrize("msg", big_messages(), ids=["in band", "out of band"])
def test_zmq_delivers_an_accepted_message_larger_than_its_buffers_without_another_send(zmq_ends, msg):
    sender, receiver = zmq_ends
    reader = Reader(receiver)
    _until(lambda: sender.try_send(msg), "zmq never accepted the message")  # False until connected
    assert reader.result() == msg


def test_a_send_that_times_out_mid_message_still_delivers_it_whole(ends):
    """The ring cannot take half a message back: once its first fragments are in, it goes out
    whole even though the send raised, and nothing else needs to be sent for it to."""
    sender, receiver = ends
    msg = big_messages()[0]
    with pytest.raises(TimeoutError):
        sender.send(msg, timeout=0.05)  # nobody reads: only the first fragments fit
    assert Reader(receiver).result() == msg


def test_a_send_async_cancelled_mid_message_still_delivers_it_whole(ends):
    sender, receiver = ends
    msg = big_messages()[1]

    async def main():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sender.send_async(msg), 0.05)  # cancelled while awaiting space
        return await asyncio.get_running_loop().run_in_executor(None, Reader(receiver).result)

    assert asyncio.run(main()) == msg


def test_closing_the_channel_ends_a_pusher_that_waits_for_a_reader(ends):
    sender, receiver = ends
    assert sender.try_send(big_messages()[1])  # nobody will read the rest
    assert _pushers()
    sender.close()
    _until(lambda: not _pushers(), "the pusher outlived the channel's close")


def test_the_peers_death_ends_the_pusher_and_the_next_send_raises_peer_died():
    ch = Channel.create(peer.codec(), capacity=CAPACITY)
    proc = peer.spawn(ch, "sleep")  # reports readiness, then never reads
    try:
        assert ch.recv(timeout=DEADLINE_S) == Ctl("ready", n=proc.pid)
        assert ch.try_send(big_messages()[1])
        proc.kill()
        proc.wait(timeout=DEADLINE_S)
        _until(lambda: not _pushers(), "the pusher outlived the peer")
        with pytest.raises(PeerDied):
            ch.send(Ctl("after"), timeout=DEADLINE_S)
    finally:
        ch.close()
