"""Anticipated wake-ups (shm_transport/anticipation.py): the pace arithmetic, the C timer, and
an asyncio reader that wakes ahead of a steady producer in another process without losing or
delaying anything when the guess is wrong."""
from __future__ import annotations

import asyncio
import os
import select
import time

import pytest

from shm_transport import Channel, Pace
from shm_transport._ring import lib
from shm_transport.anticipation import WakeLead

import transport_peer as peer


# ---------------------------------------------------------------- arithmetic
def test_pace_predicts_the_next_publish_of_a_steady_producer():
    pace = Pace()
    for i in range(10):
        assert pace.expect() is None or i >= pace.min_samples
        pace.published(1.0 + i * 0.001)
    at, spread = pace.expect()
    assert at == pytest.approx(1.010, abs=1e-6)
    assert spread < 1e-4


def test_pace_gives_up_on_irregular_or_slow_producers_and_relearns_after_a_pause():
    irregular = Pace()
    for t in (0.0, 0.001, 0.0012, 0.004, 0.0045, 0.009, 0.0091, 0.012):
        irregular.published(t)
    assert irregular.expect() is None

    pace = Pace()
    for i in range(10):
        pace.published(i * 0.001)
    pace.published(1.0)  # a pause: the producer went idle
    assert pace.expect() is None
    for i in range(1, pace.min_samples + 1):
        pace.published(1.0 + i * 0.002)
    at, _ = pace.expect()
    assert at == pytest.approx(1.0 + (pace.min_samples + 1) * 0.002, abs=1e-6)


def test_pace_ignores_an_odd_step_but_follows_a_changed_pace():
    pace = Pace()
    t = 0.0
    for _ in range(20):
        t += 0.001
        pace.published(t)
    t += 0.004  # one long step (a prefill): the next is expected at the usual interval again
    pace.published(t)
    at, spread = pace.expect()
    assert at == pytest.approx(t + 0.001, abs=1e-6) and spread < 1e-4
    for _ in range(3):  # the pace really changed: relearned from the new intervals
        t += 0.002
        pace.published(t)
    assert pace.expect() is None
    for _ in range(pace.min_samples):
        t += 0.002
        pace.published(t)
    at, _ = pace.expect()
    assert at == pytest.approx(t + 0.002, abs=1e-6)


def test_wake_lead_learns_the_timer_latency_but_discounts_a_busy_loop():
    lead = WakeLead(initial=80e-6, margin=10e-6)
    for _ in range(100):
        lead.woke(40e-6)
    assert lead.latency == pytest.approx(40e-6, rel=0.01)
    assert lead.lead == pytest.approx(50e-6, rel=0.01)
    lead.woke(0.5)  # the loop was busy for half a second: counts as twice the estimate
    assert lead.latency == pytest.approx(45e-6, rel=0.01)


# ---------------------------------------------------------------- the C timer
def test_timer_fires_at_its_absolute_deadline_and_zero_disarms_it():
    fd = lib.ring_timer_new()
    assert fd >= 0
    try:
        start = time.monotonic_ns()
        assert lib.ring_timer_set(fd, start + 20_000_000) == 0
        assert select.select([fd], [], [], 5)[0] == [fd]
        assert time.monotonic_ns() - start >= 20_000_000
        assert int.from_bytes(os.read(fd, 8), "little") == 1
        lib.ring_timer_set(fd, time.monotonic_ns() + 20_000_000)
        lib.ring_timer_set(fd, 0)
        assert select.select([fd], [], [], 0.1)[0] == []
        lib.ring_timer_set(fd, 1)  # long past: fires at once
        assert select.select([fd], [], [], 5)[0] == [fd]
    finally:
        os.close(fd)
    assert lib.ring_timer_set(fd, 1) < 0  # a closed fd is an error, not a crash


# ---------------------------------------------------------------- an asyncio reader
def paced_child(n: int, interval_us: int, start_ns: int = 0):
    """A child that sends message i at ``start_ns + i * interval_us`` (monotonic clock, shared
    by the processes), stamped with its publish time in ``crc``."""
    ch = Channel.create(peer.codec(), capacity=1 << 16)
    return ch, peer.spawn(ch, "pace", n, interval_us, start_ns)


async def read_paced(ch: Channel, n: int, expect) -> list[tuple]:
    """(message, how long after its publish stamp it was received), n of them."""
    got = []
    while len(got) < n:
        batch = await ch.recv_batch_async(timeout=10, expect=expect())
        now = time.monotonic_ns()
        got += [(msg, (now - msg.crc) / 1e9) for msg in batch]
    return got


async def test_reader_wakes_ahead_of_a_steady_producer_and_gets_everything():
    n, interval = 60, 0.01
    start = time.monotonic() + 0.3
    ch, proc = paced_child(n, int(interval * 1e6), int(start * 1e9))
    # The schedule is known, and each window is wide (+-5 ms), so that a busy machine's
    # scheduling delays do not decide the outcome; the engine's windows (Pace) are tight.
    ch.max_anticipation_spin = 0.05
    try:
        got = []
        while len(got) < n:
            got += await ch.recv_batch_async(timeout=10, expect=(start + len(got) * interval, 0.005))
        assert [m.seq for m in got] == list(range(n))
        stats = ch.anticipation_stats()
        # Wake-ups on the timer caught their message in the spin (the reader was awake and
        # disarmed: the producer made no wake-up call), rather than being late or early.
        assert stats["hits"] >= n // 2 and stats["hits"] >= stats["late"] + stats["misses"], stats
        assert 0 < stats["lead_us"] < 10_000
    finally:
        ch.close()
        proc.wait(timeout=10)


async def test_wrong_guesses_lose_and_delay_nothing():
    n = 40
    ch, proc = paced_child(n, 5000, time.monotonic_ns())
    before = set(os.listdir("/proc/self/fd"))
    try:
        # Expect the next message 1 ms from now, but it comes every 5 ms: the timer fires,
        # the spin finds nothing, the reader goes back to its eventfd. Then guesses already
        # in the past: a bounded spin, then the eventfd.
        got = await read_paced(ch, n // 2, lambda: (time.monotonic() + 0.001, 0.0))
        assert ch.anticipation_stats()["misses"] > 0
        got += await read_paced(ch, n - len(got), lambda: (time.monotonic() - 1.0, 0.0))
        assert [msg.seq for msg, _ in got] == list(range(n))
        assert max(delay for _, delay in got) < 0.5  # every one woke its reader, none waited out a timeout
    finally:
        ch.close()
        proc.wait(timeout=10)
    assert set(os.listdir("/proc/self/fd")) <= before  # the timerfd went with the channel


async def test_a_guess_too_vague_to_catch_in_one_spin_is_not_acted_on():
    ch, proc = paced_child(5, 5000, time.monotonic_ns())
    try:
        got = await read_paced(ch, 5, lambda: (time.monotonic() + 0.001, 10 * ch.max_anticipation_spin))
        assert [msg.seq for msg, _ in got] == list(range(5))
        stats = ch.anticipation_stats()
        assert stats["hits"] + stats["late"] + stats["misses"] == 0, stats
    finally:
        ch.close()
        proc.wait(timeout=10)
