"""The CPU cost of Channel's calls in one thread: the Python path of a send and a receive.

A round trip between two processes on two shared cores moves by microseconds from run to run,
so it cannot show a change of 100 ns in the call path; this can. Both ends live in this
process (``Channel.pair``), nothing ever waits, and each figure is thread CPU time (not wall
time: being descheduled does not count), the best of ``--repeats``.

To compare two trees, run this file from one with ``PYTHONPATH`` set to each in turn:
``PYTHONPATH=/work/before python benchmarks/channel_calls.py`` (the script imports only
``shm_transport``; an older tree's ``MsgspecCodec`` takes a list of types instead of a dict).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import msgspec

from shm_transport.channel import Channel
from shm_transport.codec import MsgspecCodec

BATCH = 64


class Ping(msgspec.Struct, array_like=True):
    seq: int


def _codec() -> MsgspecCodec:
    try:
        return MsgspecCodec({1: Ping})
    except TypeError:  # a tree from before explicit kind tags
        return MsgspecCodec([Ping])


def _cpu_ns_per_call(a: Channel, b: Channel, loops: int, mode: str) -> float:
    """Send one message and receive it, ``loops`` times (``send+recv``, ``send+recv_async``),
    or send BATCH and take them with one ``poll`` not counted (``send``)."""
    send, recv, recv_async, poll = a.send, b.recv, b.recv_async, b.poll
    msg = Ping(1)

    async def pairs_async() -> None:
        for _ in range(loops):
            send(msg)
            await recv_async()

    t0 = time.thread_time()
    if mode == "send+recv":
        for _ in range(loops):
            send(msg)
            recv()
    elif mode == "send+recv_async":
        asyncio.run(pairs_async())  # a loop's start and end: a few 100 us, spread over loops
    else:
        untimed = 0.0
        for _ in range(loops // BATCH):
            for _ in range(BATCH):
                send(msg)
            t = time.thread_time()
            poll()
            untimed += time.thread_time() - t
        t0 += untimed
    return (time.thread_time() - t0) / loops * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=60)
    args = ap.parse_args()
    a, b = Channel.pair(_codec())
    b.async_spin_us = 0  # a message is always there: the asyncio fast path never spins anyway
    try:
        best = {
            mode: min(_cpu_ns_per_call(a, b, args.loops, mode) for _ in range(args.repeats))
            for mode in ("send", "send+recv", "send+recv_async")
        }
    finally:
        a.close()
        b.close()
    print(" ".join(f"{mode}={ns:.0f}ns" for mode, ns in best.items()))


if __name__ == "__main__":
    main()
