"""Channel: typed messages between processes, backpressure, timeouts, close, peer death, bad input."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import msgspec
import pytest
import uvloop

from shm_transport import Channel, ChannelClosed, CorruptRing, MessageTooLarge, MsgspecCodec, PeerDied, TransportError

from tests.helpers import ROOT, transport_peer as peer
from tests.helpers.transport_peer import Ctl, Data


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


@pytest.fixture
def pair():
    a, b = Channel.pair(peer.codec(), capacity=4096)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def child():
    """A channel to an echoing child process (the engine's launch path: pass_fds + token)."""
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    proc = peer.spawn(ch, "echo")
    yield ch, proc
    ch.close()
    proc.wait(timeout=10)


# ---------------------------------------------------------------- basics
def test_messages_round_trip_through_a_child_process(child):
    ch, proc = child
    sent = [Data(i, i * 7, os.urandom(s)) for i, s in enumerate([0, 1, 100, 5000, 40000, 200000, 3])]
    sent.append(Ctl("x", 1, "héllo"))
    for m in sent:
        ch.send(m)
    got = []
    while len(got) < len(sent):
        got += ch.recv_batch(timeout=10)
    assert got == sent


def test_recv_batch_drains_everything_available(pair):
    a, b = pair
    for i in range(50):
        a.send(Data(i, 0, b""))
    assert [m.seq for m in b.recv_batch()] == list(range(50))
    assert b.poll() == []


def test_max_messages_bounds_a_batch_and_keeps_the_rest(pair):
    a, b = pair
    for i in range(10):
        a.send(Data(i, 0, b""))
    assert [m.seq for m in b.recv_batch(max_messages=3)] == [0, 1, 2]
    assert b.recv().seq == 3
    assert [m.seq for m in b.poll()] == list(range(4, 10))


def test_both_directions_work_at_once(pair):
    a, b = pair
    a.send(Ctl("ping"))
    b.send(Ctl("pong"))
    assert b.recv(timeout=1).op == "ping"
    assert a.recv(timeout=1).op == "pong"


def test_recv_timeout_raises_and_recv_batch_returns_empty(pair):
    a, b = pair
    with pytest.raises(TimeoutError):
        b.recv(timeout=0.05)
    assert b.recv_batch(timeout=0.05) == []


def test_decoded_messages_own_their_bytes(pair):
    a, b = pair
    a.send(Data(1, 0, b"first"))
    m = b.recv()
    a.send(Data(2, 0, b"XXXXX"))  # reuses the same ring bytes
    b.recv()
    assert type(m.payload) is bytes and m.payload == b"first"


# ---------------------------------------------------------------- backpressure
def test_send_blocks_on_a_full_ring_and_resumes_for_a_slow_consumer(pair):
    a, b = pair
    n, got = 400, []

    def slow_reader():
        while len(got) < n:
            got.extend(b.recv_batch(timeout=10, max_messages=5))
            time.sleep(0.001)

    t = threading.Thread(target=slow_reader)
    t.start()
    for i in range(n):
        a.send(Data(i, 0, b"p" * 100), timeout=10)
    t.join()
    assert [m.seq for m in got] == list(range(n))  # nothing dropped, duplicated or reordered
    assert a.stats()["tx"]["full"] > 0 and a.stats()["tx"]["sleeps"] > 0


def test_try_send_returns_false_on_a_full_ring_and_sends_nothing(pair):
    a, b = pair
    sent = 0
    while a.try_send(Data(sent, 0, b"q" * 200)):
        sent += 1
    assert not a.try_send(Data(sent, 0, b"q" * 200))  # still full: refused again, nothing written
    assert [m.seq for m in b.poll()] == list(range(sent))


def test_try_send_of_a_message_bigger_than_the_ring_is_finished_before_the_next(pair):
    a, b = pair
    big = Data(1, 0, os.urandom(3 * 4096))
    assert a.try_send(big)  # accepted: its first fragments went out, the rest follows by itself
    assert not a.try_send(Data(2, 0, b""))  # refused until the big one is out
    got, small_sent = [], False
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += b.recv_batch(timeout=0.1)
        small_sent = small_sent or a.try_send(Data(2, 0, b""))
    assert got[0] == big and got[1].seq == 2


def test_send_timeout_raises_when_the_peer_does_not_read(pair):
    a, b = pair
    while a.try_send(Data(0, 0, b"z" * 200)):
        pass
    with pytest.raises(TimeoutError):
        a.send(Data(1, 0, b"z" * 200), timeout=0.05)


# ---------------------------------------------------------------- waits: GIL, signals, wakeup
def test_blocking_recv_releases_the_gil(pair):
    a, b = pair
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        b.spin_us = 0
        b.recv_batch(timeout=0.3)
    finally:
        stop.set()
        t.join()
    assert count[0] > 10000


def test_recv_returns_on_a_signal_so_its_handler_runs(pair):
    a, b = pair

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    old = signal.signal(signal.SIGALRM, handler)
    b.liveness_interval = 30.0  # only EINTR can end the wait early
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Interrupted):
            b.recv(timeout=20)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_wakeup_returns_a_blocked_recv_batch_early(pair):
    a, b = pair
    b.liveness_interval = 30.0
    result = []
    t = threading.Thread(target=lambda: result.append(b.recv_batch(timeout=20)))
    t.start()
    time.sleep(0.1)
    b.wakeup()
    t.join(timeout=5)
    assert not t.is_alive() and result == [[]]


# ---------------------------------------------------------------- close
def test_peer_reads_what_was_sent_then_sees_channel_closed(pair):
    a, b = pair
    a.send(Ctl("last words"))
    a.close()
    a.close()  # idempotent
    assert b.recv(timeout=1).op == "last words"
    with pytest.raises(ChannelClosed, match="peer closed"):
        b.recv(timeout=1)
    with pytest.raises(ChannelClosed, match="peer closed"):
        b.send(Ctl("anyone?"))


def test_every_call_on_a_closed_channel_raises_channel_closed(pair):
    a, b = pair
    a.close()
    for call in (lambda: a.send(Ctl("x")), lambda: a.try_send(Ctl("x")), a.recv, a.recv_batch, a.poll):
        with pytest.raises(ChannelClosed, match="this process"):
            call()


def test_close_from_another_thread_wakes_a_blocked_recv(pair):
    a, b = pair
    b.liveness_interval = 30.0
    threading.Timer(0.1, b.close).start()
    with pytest.raises(ChannelClosed):
        b.recv(timeout=20)


def test_close_releases_every_fd():
    before = open_fds()
    a, b = Channel.pair(peer.codec(), capacity=4096)
    a.send(Ctl("x"))
    b.recv()
    a.close()
    b.close()
    assert open_fds() == before


def test_peer_exiting_without_close_is_peer_died():
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    proc = peer.spawn(ch, "exit", 0)
    proc.wait(timeout=10)  # exits without closing: PeerDied, not a hang
    with pytest.raises(PeerDied):
        ch.recv(timeout=5)
    ch.close()


def test_messages_sent_before_the_peer_exited_are_still_delivered():
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    proc = peer.spawn(ch, "exit", 3)
    proc.wait(timeout=10)
    got = []
    with pytest.raises(PeerDied):
        while True:
            got += ch.recv_batch(timeout=5)
    assert len(got) == 3
    ch.close()


# ---------------------------------------------------------------- peer death (kill -9)
def spawn_blocked(mode: str = "block"):
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    proc = peer.spawn(ch, mode)
    assert ch.recv(timeout=30).op == "ready"
    return ch, proc


def test_reader_sees_peer_death_within_1s():
    ch, proc = spawn_blocked()
    threading.Timer(0.1, proc.kill).start()
    with pytest.raises(PeerDied, match="SIGKILL"):
        ch.recv(timeout=1.1)  # a TimeoutError here would mean the death went unnoticed for 1 s
    proc.wait()
    ch.close()


def test_blocked_writer_sees_peer_death_within_1s():
    ch, proc = spawn_blocked("sleep")
    while ch.try_send(Data(0, 0, b"w" * 1000)):
        pass
    threading.Timer(0.1, proc.kill).start()
    with pytest.raises(PeerDied):
        ch.send(Data(1, 0, b"w" * 1000), timeout=1.1)
    proc.wait()
    ch.close()


async def test_async_reader_sees_peer_death_within_1s():
    ch, proc = spawn_blocked()
    asyncio.get_running_loop().call_later(0.1, proc.kill)
    with pytest.raises(PeerDied):
        await ch.recv_async(timeout=1.1)
    proc.wait()
    ch.close()


@pytest.mark.parametrize("pdeathsig", [True, False])
def test_child_notices_its_parent_killed(pdeathsig):
    """kill -9 of the creating side: its child dies with it (PR_SET_PDEATHSIG), or, without
    that, gets PeerDied from its blocked recv within a second (it watches its parent's pidfd)."""
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    middle = peer.spawn(ch, "middle", "1" if pdeathsig else "0")
    grand_pid = ch.recv(timeout=30).n
    middle.kill()
    middle.wait()
    # The grandchild is re-parented to this process (the test session is a child subreaper).
    deadline = time.monotonic() + 1.5
    while True:
        pid, status = os.waitpid(grand_pid, os.WNOHANG)
        if pid or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert pid == grand_pid, "the child outlived its parent"
    if pdeathsig:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    else:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3
        assert "PeerDied" in middle.stdout.read()
    middle.stdout.close()
    ch.close()


# ---------------------------------------------------------------- asyncio
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_async_round_trip_with_a_child(child, loop_kind):
    ch, proc = child

    async def main():
        for i in range(200):
            await ch.send_async(Data(i, 0, b"a" * (i % 50)))
            m = await ch.recv_async(timeout=10)
            assert m.seq == i
        await ch.send_async(Data(-1, 0, os.urandom(300000)))  # fragmented both ways
        assert (await ch.recv_async(timeout=10)).seq == -1
        assert await ch.recv_batch_async(timeout=0.05) == []

    (uvloop.run if loop_kind == "uvloop" else asyncio.run)(main())


async def test_send_async_waits_for_space_without_blocking_the_loop(pair):
    a, b = pair
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.001)

    def slow_reader():
        got = 0
        while got < 300:
            got += len(b.recv_batch(timeout=10, max_messages=4))
            time.sleep(0.002)

    t = threading.Thread(target=slow_reader)
    t.start()
    tick = asyncio.ensure_future(ticker())
    for i in range(300):
        await a.send_async(Data(i, 0, b"s" * 200), timeout=10)
    tick.cancel()
    await asyncio.to_thread(t.join)
    assert a.stats()["tx"]["sleeps"] > 0 and len(ticks) > 20


async def test_async_recv_timeout_and_close_wakes_it(pair):
    a, b = pair
    with pytest.raises(TimeoutError):
        await b.recv_async(timeout=0.05)
    asyncio.get_running_loop().call_later(0.05, b.close)
    with pytest.raises(ChannelClosed):
        await b.recv_async(timeout=10)


async def test_async_peer_close_ends_recv(pair):
    a, b = pair
    asyncio.get_running_loop().call_later(0.05, a.close)
    with pytest.raises(ChannelClosed, match="peer closed"):
        await b.recv_batch_async(timeout=10)


# ---------------------------------------------------------------- bad input
class NotInCodec(msgspec.Struct):
    x: int


def test_sending_a_type_outside_the_codec_is_a_type_error(pair):
    a, b = pair
    with pytest.raises(TypeError, match="NotInCodec.*Data, Ctl"):
        a.send(NotInCodec(1))
    with pytest.raises(TypeError):
        a.send({"seq": 1})


def test_codec_refuses_bad_types():
    with pytest.raises(TypeError, match="msgspec.Struct"):
        MsgspecCodec({0: dict})
    with pytest.raises(ValueError, match="at least one"):
        MsgspecCodec({})

    class Aliasing(msgspec.Struct):
        raw: msgspec.Raw

    with pytest.raises(TypeError, match="alias"):
        MsgspecCodec({0: Aliasing})


def test_codec_kinds_are_explicit_never_positions():
    with pytest.raises(TypeError, match="never a position"):
        MsgspecCodec([Data, Ctl])
    with pytest.raises(ValueError, match="kind 3 given twice"):
        MsgspecCodec([(3, Data), (3, Ctl)])
    with pytest.raises(ValueError, match="distinct"):
        MsgspecCodec({0: Data, 1: Data})
    for bad in (-1, 255, 1.0, True):
        with pytest.raises(ValueError, match="kinds are ints"):
            MsgspecCodec({bad: Data})
    # The byte is the declared kind, whatever the order; a kind not declared is refused by name.
    sparse = MsgspecCodec({200: Ctl, 7: Data})
    assert sparse.encode(Data(1, 2, b"x"))[0] == 7 and sparse.encode(Ctl("x"))[0] == 200
    assert MsgspecCodec({7: Data, 200: Ctl}).decode(sparse.encode(Ctl("x"))) == Ctl("x")
    with pytest.raises(msgspec.DecodeError, match="unknown message kind 8"):
        sparse.decode(b"\x08\x90")


def test_engine_protocol_kinds_are_pinned():
    from engine.wire_messages import MESSAGE_TYPES, MessageKind, EngineCoreRequest, EngineDead

    assert MESSAGE_TYPES[MessageKind.ENGINE_CORE_REQUEST] is EngineCoreRequest and MessageKind.ENGINE_CORE_REQUEST == 0
    assert MESSAGE_TYPES[MessageKind.ENGINE_DEAD] is EngineDead and MessageKind.ENGINE_DEAD == 7
    assert set(MESSAGE_TYPES) == set(MessageKind)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"capacity": 5000}, ValueError, "power of two"),
        ({"capacity": 64}, ValueError, "between"),
        ({"capacity": "big"}, TypeError, "int"),
        ({"recv_capacity": 3}, ValueError, "recv_capacity"),
        ({"max_message_size": 0}, ValueError, "max_message_size"),
    ],
)
def test_bad_channel_arguments_are_named(kwargs, err, match):
    with pytest.raises(err, match=match):
        Channel.create(peer.codec(), **kwargs)


def test_message_over_max_message_size_is_refused_at_send():
    a, b = Channel.pair(peer.codec(), capacity=4096, max_message_size=1000)
    try:
        with pytest.raises(MessageTooLarge, match="max_message_size"):
            a.send(Data(0, 0, b"m" * 2000))
        a.send(Data(1, 0, b"ok"))
        assert b.recv().seq == 1
    finally:
        a.close(), b.close()


@pytest.mark.parametrize(
    "token, err, match",
    [
        ("zmq:abc", ValueError, "not a ringllm"),
        ("ringllm1:pid=1", ValueError, "malformed"),
        (42, TypeError, "str"),
    ],
)
def test_bad_tokens_are_refused(token, err, match):
    with pytest.raises(err, match=match):
        Channel.attach(peer.codec(), token)


def test_attach_with_fds_that_were_not_passed_names_the_problem():
    ch = Channel.create(peer.codec(), capacity=4096)
    token = ch.peer_token()
    try:
        res = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, transport_peer as p\n"
                "from shm_transport import Channel\n"
                "try:\n Channel.attach(p.codec(), sys.argv[1])\n"
                "except Exception as e: print(type(e).__name__, e)",
                token,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=os.path.dirname(peer.HERE),  # no pass_fds
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        assert "SegmentError" in res.stdout and "pass_fds" in res.stdout, res.stdout + res.stderr
    finally:
        ch.close()


def test_corrupt_message_is_reported_and_the_others_still_arrive(pair):
    a, b = pair
    a.send(Data(1, 0, b""))
    a._ends.tx.write(b"\x00\xc1garbage", prefix=-1)  # kind 0 (Data) with a body msgpack refuses
    a.send(Data(2, 0, b""))
    with pytest.raises(CorruptRing, match="decode"):
        b.poll()
    assert [m.seq for m in b.poll()] == [1, 2]


def test_transport_errors_share_one_base():
    for err in (ChannelClosed, PeerDied, CorruptRing, MessageTooLarge):
        assert issubclass(err, TransportError)
