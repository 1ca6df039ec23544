"""Anticipated wake-ups: the arithmetic that lets a reader be awake when a steady producer's
next message lands, instead of being woken by it.

Why: a reader asleep on its eventfd pays, after the message is there, for the producer's
eventfd write (a system call on the producer's critical path, ~27 us on this VM) and for its
own vCPU coming out of idle (~95 us): most of what one EngineCore step's output waits for at
low load (benchmarks/RESULTS.md, "Engine overhead"). A stepping EngineCore publishes at a
steady pace and stamps each message with its publish time, so the reader can set a timer to
wake one wake-up latency before the next one is due and spin (GIL released) for the last
stretch; while it spins it is not "waiting", so the producer makes no system call.

``Pace`` predicts from the producer's own publish stamps, not from when the reader noticed a
message: a reader that woke late once must not aim late the next time. ``WakeLead`` learns
how long the timer takes to get the reader running. Both are plain arithmetic (no clock, no
fds), on seconds of ``time.monotonic``; ``Channel.recv_batch_async(expect=...)`` uses them.
The eventfd stays armed while the timer is pending, so a wrong guess costs at most one
bounded spin (which, like ``async_spin_us``, holds up the event loop: ``max_anticipation_spin``,
300 us), never a lost or late message.
"""
from __future__ import annotations

from typing import Optional

_WEIGHT = 1 / 8  # moving averages weigh each new sample 1/8


class Pace:
    """When a producer that publishes at a steady pace will publish next."""

    def __init__(self, max_interval: float = 0.02, min_samples: int = 4) -> None:
        self.max_interval = max_interval  # a slower producer is not worth a timer
        self.min_samples = min_samples
        self._last: Optional[float] = None
        self._samples = 0
        self._interval = 0.0
        self._dev = 0.0  # mean absolute deviation of the interval
        self._outliers = 0  # odd intervals in a row

    def published(self, stamp: float) -> None:
        """The producer published a message at ``stamp`` (its own clock reading)."""
        last, self._last = self._last, stamp
        if last is None or stamp <= last:
            return
        interval = stamp - last
        if interval > self.max_interval:  # a pause, not a step: learn the pace afresh
            self._samples, self._outliers = 0, 0
            return
        if self._samples == 0:
            self._interval, self._dev = interval, interval / 8
            self._samples = 1
            return
        error = interval - self._interval
        if self._samples >= self.min_samples and abs(error) > 4 * self._dev:
            # An odd step (a prefill, a pause for new requests) says nothing of the next one;
            # several in a row mean the pace changed: learn it afresh.
            self._outliers += 1
            if self._outliers >= 3:
                self._samples, self._outliers = 0, 0
            return
        self._outliers = 0
        weight = max(_WEIGHT, 1 / (self._samples + 1))  # plain averages over the first samples
        self._interval += error * weight
        self._dev += (abs(error) - self._dev) * weight
        self._samples += 1

    def expect(self) -> Optional[tuple[float, float]]:
        """``(at, spread)``: the next publish is due at about ``at``, give or take ``spread``;
        None while the pace is unknown, slow or irregular (spread above half of it)."""
        if self._samples < self.min_samples or 4 * self._dev > self._interval:
            return None
        return self._last + self._interval, 2 * self._dev


class WakeLead:
    """How long before an expected message a reader's timer must fire: the timer's own
    latency (learned from each wake-up: firing to the reader running) plus ``margin``."""

    def __init__(self, initial: float = 80e-6, margin: float = 15e-6) -> None:
        self.latency = initial
        self.margin = margin

    @property
    def lead(self) -> float:
        return self.latency + self.margin

    def woke(self, late_by: float) -> None:
        """The timer got the reader running ``late_by`` seconds after its deadline. One
        sample counts for at most twice the estimate: a busy event loop delays a wake-up too,
        and that is not the timer's latency."""
        self.latency += (min(max(late_by, 0.0), 2 * self.latency) - self.latency) * _WEIGHT
