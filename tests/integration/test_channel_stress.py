"""Two-process stress of the channel under a hard timeout: a million numbered, checksummed
messages with a skewed size mix, both directions at once, for the futex reader and the asyncio
reader; and a lost-wake-up hunt with jittered timing on both sides of every sleep."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from shm_transport import Channel

from tests.helpers import transport_peer as peer
from tests.helpers.transport_peer import Ctl

CAPACITY = 1 << 16  # small, so the ring wraps, fills and fragments all the time
PER_DIRECTION = 500_000  # x 2 directions = 1,000,000 messages per test


def finish(ch: Channel, proc, mine: dict) -> None:
    early = mine.pop("other")
    result = early[0] if early else next(m for m in ch.recv_batch(timeout=60) if isinstance(m, Ctl))
    ch.send(Ctl("bye"))
    theirs = json.loads(result.text)
    proc.wait(timeout=30)
    ch.close()
    assert mine == {"received": PER_DIRECTION, "errors": []}
    assert theirs == {"received": PER_DIRECTION, "errors": []}
    assert proc.returncode == 0


@pytest.mark.timeout(120)
def test_million_messages_both_ways_with_futex_readers():
    ch = Channel.create(peer.codec(), capacity=CAPACITY)
    proc = peer.spawn(ch, "stress", PER_DIRECTION, 2, 1, CAPACITY, "sync")
    mine = peer.stress_sync(ch, PER_DIRECTION, 1, 2, CAPACITY)
    finish(ch, proc, mine)


@pytest.mark.timeout(120)
def test_million_messages_both_ways_with_asyncio_readers():
    ch = Channel.create(peer.codec(), capacity=CAPACITY)
    proc = peer.spawn(ch, "stress", PER_DIRECTION, 2, 1, CAPACITY, "async")
    mine = asyncio.run(peer.stress_async(ch, PER_DIRECTION, 1, 2, CAPACITY))
    finish(ch, proc, mine)


@pytest.mark.timeout(120)
def test_no_lost_wakeups_under_jittered_timing():
    """Thousands of futex sleeps on each side, the peer's timing jittered around each one, in
    exchanges where a lost wake-up cannot be rescued by a later message (see jitter_hunt).
    Every wait slice is 2 s, so one lost wake-up would show as a timed-out sleep."""
    n = 8000
    ch = Channel.create(peer.codec(), capacity=4096)
    ch.spin_us, ch.liveness_interval = 0, 2.0
    proc = peer.spawn(ch, "jitter", n, 7)
    peer.jitter_hunt(ch, n, random.Random(8), parent=True)
    theirs = json.loads(ch.recv(timeout=30).text)
    ch.send(Ctl("bye"))
    mine = ch.stats()
    proc.wait(timeout=30)
    ch.close()
    assert proc.returncode == 0
    data_sleeps = mine["rx"]["sleeps"] + theirs["rx"]["sleeps"]
    assert data_sleeps > 4000 and mine["tx"]["sleeps"] > 200, (mine, theirs)  # really slept, many times
    for side in (mine, theirs):
        assert side["tx"]["timeouts"] == 0 and side["rx"]["timeouts"] == 0, (mine, theirs)
