"""The other process in the transport tests: ``python tests/helpers/transport_peer.py MODE TOKEN [ARGS]``.

Also imported by the tests for the message types and the stress stream (sender and checker),
so both processes run exactly the same code.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib

import msgspec

if __name__ == "__main__":  # run as a script: this checkout's shm_transport, not the installed one
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from shm_transport import Channel, ChannelClosed, MsgspecCodec, PeerDied, set_parent_death_signal

HERE = os.path.abspath(__file__)


class Data(msgspec.Struct, array_like=True):
    seq: int
    crc: int
    payload: bytes


class Ctl(msgspec.Struct, array_like=True):
    op: str
    n: int = 0
    text: str = ""


def codec() -> MsgspecCodec:
    return MsgspecCodec({0: Data, 1: Ctl})


def spawn(ch: Channel, mode: str, *args: object, pdeathsig: bool = True) -> subprocess.Popen:
    """Launch this module as the channel's peer, the way the engine launches its core."""
    argv = [sys.executable, HERE, mode, ch.peer_token(), "1" if pdeathsig else "0", *map(str, args)]
    proc = subprocess.Popen(argv, pass_fds=ch.peer_fds(), stdout=subprocess.PIPE, text=True)
    ch.set_peer(proc.pid)
    ch.close_peer_fds()
    return proc


# ---------------------------------------------------------------- the stress stream
class Stream:
    """Numbered, checksummed messages with a skewed size mix: most under 256 B, some KiB, a few
    between capacity/2 and 4x capacity (fragmented). Sender and checker regenerate it alike."""

    def __init__(self, seed: int, capacity: int) -> None:
        rng = random.Random(seed)
        self.pool = rng.randbytes(4 * capacity + 4096)
        n = 1 << 16
        sizes = []
        for _ in range(n):
            r = rng.random()
            if r < 0.95:
                sizes.append(rng.randrange(0, 256))
            elif r < 0.9995:
                sizes.append(rng.randrange(256, 8192))
            else:
                sizes.append(rng.randrange(capacity // 2, 4 * capacity))
        self.sizes = sizes

    def message(self, seq: int) -> Data:
        size = self.sizes[seq & 0xFFFF]
        off = (seq * 7) & 4095
        payload = self.pool[off : off + size]
        return Data(seq, zlib.crc32(payload), payload)


class Checker:
    def __init__(self) -> None:
        self.next = 0
        self.errors: list[str] = []
        self.other: list = []  # control messages that arrived in the same batches

    def check(self, msgs: list) -> None:
        for m in msgs:
            if type(m) is not Data:
                self.other.append(m)
                continue
            if m.seq != self.next:
                self.errors.append(f"expected seq {self.next}, got {m.seq}")
            elif zlib.crc32(m.payload) != m.crc:
                self.errors.append(f"seq {m.seq}: checksum mismatch")
            self.next = m.seq + 1


def stress_sync(ch: Channel, n: int, seed_out: int, seed_in: int, capacity: int) -> dict:
    """Send n messages (one thread) while checking n incoming ones (another): futex reader."""
    out_stream, checker = Stream(seed_out, capacity), Checker()

    def receive() -> None:
        while checker.next < n:
            msgs = ch.recv_batch(timeout=30)
            if not msgs:
                checker.errors.append(f"stalled at {checker.next}")
                return
            checker.check(msgs)

    t = threading.Thread(target=receive)
    t.start()
    for seq in range(n):
        ch.send(out_stream.message(seq), timeout=30)
    t.join()
    return {"received": checker.next, "errors": checker.errors[:5], "other": checker.other}


async def stress_async(ch: Channel, n: int, seed_out: int, seed_in: int, capacity: int) -> dict:
    """The same with an asyncio reader (eventfd) and asyncio sends, on one event loop."""
    out_stream, checker = Stream(seed_out, capacity), Checker()

    async def receive() -> None:
        while checker.next < n:
            msgs = await ch.recv_batch_async(timeout=30)
            if not msgs:
                checker.errors.append(f"stalled at {checker.next}")
                return
            checker.check(msgs)

    async def send() -> None:
        for seq in range(n):
            msg = out_stream.message(seq)
            if not ch.try_send(msg):
                await ch.send_async(msg, timeout=30)
            if seq % 256 == 0:
                await asyncio.sleep(0)  # let the reader run on a ring that never fills

    await asyncio.gather(receive(), send())
    return {"received": checker.next, "errors": checker.errors[:5], "other": checker.other}


def jitter(rng: random.Random) -> None:
    """Busy-wait 0-40 us, sometimes yield the CPU: shifts the peer's timing around its sleep."""
    r = rng.random()
    if r < 0.05:
        time.sleep(0)
    else:
        end = time.perf_counter() + r * 40e-6
        while time.perf_counter() < end:
            pass


def jitter_hunt(ch: Channel, n: int, rng: random.Random, parent: bool) -> None:
    """The lost wake-up hunt, either side. Both sides jitter their timing around every step.

    1) n ping-pongs: each side sends only after the other's message arrived, so a lost data
       wake-up leaves both asleep (a stall), never recovered by a later message.
    2) n messages of 600 B into a 4 KiB ring with a slow reader: the writer keeps sleeping for
       space; a lost space wake-up leaves it asleep while the reader, having drained the
       ring, sleeps for data: again a stall."""
    for seq in range(n):
        if parent:
            jitter(rng)
            ch.send(Data(seq, 0, b"p" * (seq % 64)), timeout=30)
            got = ch.recv(timeout=30)
        else:
            got = ch.recv(timeout=30)
            jitter(rng)
            ch.send(got, timeout=30)
        assert got.seq == seq, (got.seq, seq)
    if parent:
        for seq in range(n):
            ch.send(Data(seq, 0, b"x" * 600), timeout=30)
    else:
        got = 0
        while got < n:
            jitter(rng)
            got += len(ch.recv_batch(timeout=30, max_messages=1))


# ---------------------------------------------------------------- modes
def main() -> None:
    mode, token, pdeathsig, *args = sys.argv[1:]
    if pdeathsig == "1":
        set_parent_death_signal(signal.SIGKILL, expected_parent=os.getppid())
    ch = Channel.attach(codec(), token, peer_pid=os.getppid())
    try:
        if mode == "echo":
            ch.spin_us = float(args[0]) if args else ch.spin_us
            while True:
                for m in ch.recv_batch():
                    ch.send(m)
        elif mode == "stress":
            n, seed_out, seed_in, capacity, reader = int(args[0]), int(args[1]), int(args[2]), int(args[3]), args[4]
            if reader == "async":
                res = asyncio.run(stress_async(ch, n, seed_out, seed_in, capacity))
            else:
                res = stress_sync(ch, n, seed_out, seed_in, capacity)
            res.pop("other")
            ch.send(Ctl("result", text=json.dumps(res)))
            ch.recv(timeout=30)  # wait for the parent's goodbye before closing
        elif mode == "jitter":
            n, seed = int(args[0]), int(args[1])
            ch.spin_us, ch.liveness_interval = 0, 2.0
            jitter_hunt(ch, n, random.Random(seed), parent=False)
            ch.send(Ctl("stats", text=json.dumps(ch.stats())))
            ch.recv(timeout=30)
        elif mode == "block":  # report readiness, then wait for a message that never comes
            ch.send(Ctl("ready", n=os.getpid()))
            try:
                ch.recv(timeout=60)
            except PeerDied as e:
                print(f"PeerDied: {e}", flush=True)
                sys.exit(3)
        elif mode == "sleep":  # report readiness, then never read
            ch.send(Ctl("ready", n=os.getpid()))
            time.sleep(60)
        elif mode == "middle":  # a parent of its own: start a grandchild in "block" mode
            grand = spawn_grandchild(args[0] == "1")
            ch.send(Ctl("grandchild", n=grand.pid))
            ch.recv(timeout=60)
        elif mode == "pace":  # n messages: one every interval_us from start_ns on (busy-waited)
            n, interval, start = int(args[0]), int(args[1]) * 1000, int(args[2])
            for i in range(n):
                while time.monotonic_ns() < start + i * interval:
                    pass
                ch.send(Data(i, time.monotonic_ns(), b""))  # crc: the publish stamp
            ch.recv(timeout=30)
        elif mode == "exit":  # send what we are told, then leave without closing
            for _ in range(int(args[0])):
                ch.send(Data(1, 0, b"bye"))
            os._exit(0)
        else:
            raise SystemExit(f"unknown mode {mode}")
    except ChannelClosed:
        pass
    finally:
        ch.close()


def spawn_grandchild(pdeathsig: bool) -> subprocess.Popen:
    gch = Channel.create(codec(), capacity=1 << 16)
    proc = subprocess.Popen(
        [sys.executable, HERE, "block", gch.peer_token(), "1" if pdeathsig else "0"], pass_fds=gch.peer_fds()
    )
    gch.set_peer(proc.pid)
    gch.close_peer_fds()
    gch.recv(timeout=30)  # "ready"
    spawn_grandchild.keep = gch  # type: ignore[attr-defined]  # keep the channel open
    return proc


if __name__ == "__main__":
    main()
