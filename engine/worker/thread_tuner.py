"""``ThreadTuner``: the model's thread count chosen per step from the steps' measured times.

Why: on these 2-core hosts the best thread count for a large model depends on what else runs.
On a quiet host a 1.56B decode step on two threads takes ~0.6x the time of one; when another
process keeps a core busy, the second thread is descheduled for whole time slices and the step
takes ~2-3x longer than on one thread, because every kernel call ends at a barrier waiting for it
(benchmarks/RESULTS.md, "1.56B Llama"). No static count is right for both, so when the count is the
engine's own default (``EngineConfig.adapt_threads``) the runner asks this tuner before each step
and tells it how long the step took.

How: steps are grouped by size (the power of two of their scheduled tokens: a decode step of 8
sequences and a 512-token prefill differ in kind). Within a group the tuner keeps an exponential
moving average of the seconds per step of the count it runs, and every ``period`` steps probes the
other counts for ``PROBE_STEPS`` steps each, the first of which is not counted (it pays for waking
or parking the pool's threads), nor is the first step back on the choice. A probed count's figure is
its probe's mean alone (an older figure describes a host that may have changed); the faster count
becomes the choice. A probe that confirms the choice doubles the period (up to ``MAX_PERIOD``: a
settled host spends ~1% of its steps probing, and up to ``MAX_STRETCH`` times that period when the
probed count lost by that factor: a count that makes steps 10x slower beside a busy process is not
retried as often as one that lost by 10%); one that changes it resets the period. When the choice's
own step time moves by more than ``DRIFT`` from what it was at the last probe (another process took
or left a core), the next step probes at once: a change of host is followed within a few steps, and
at the latest within ``MAX_PERIOD * MAX_STRETCH`` steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

logger = logging.getLogger(__name__)

MIN_PERIOD = 16
MAX_PERIOD = 256
MAX_STRETCH = 4  # a probe that lost by a factor f lets the period grow to MAX_PERIOD * min(f, MAX_STRETCH)
DRIFT = 0.2  # the choice's step time moved this much since the last probe: probe now
PROBE_STEPS = 3  # the first one is a warm-up and is not counted
EMA_WEIGHT = 0.3


@dataclass
class _Group:
    """The tuner's state for steps of one size."""

    key: int  # steps of 2**(key-1) to 2**key - 1 scheduled tokens
    choice: int
    ema: dict[int, float] = field(default_factory=dict)
    period: int = MIN_PERIOD
    since_probe: int = 0
    probing: list[int] = field(default_factory=list)  # thread counts of the probe's remaining steps
    samples: dict[int, list[float]] = field(default_factory=dict)  # the probe's counted steps
    skip: bool = False  # the next step is the first on a newly sized pool: not counted
    settled: float = 0.0  # the choice's step time at the last probe (0: not yet known)


class ThreadTuner:
    """Chooses among 1..``max_threads`` threads per step; ``set_threads`` applies a count (torch's
    ``set_num_threads``, which sizes the OpenMP pool the C kernels share)."""

    def __init__(self, max_threads: int, set_threads: Callable[[int], None]) -> None:
        if max_threads < 2:
            raise ValueError("ThreadTuner needs at least 2 threads to choose from")
        self.max_threads = max_threads
        self._set_threads = set_threads
        self._groups: dict[int, _Group] = {}
        self._current = max_threads  # what the pool is sized to now
        self._group: _Group | None = None  # the group of the step in flight
        self._threads = max_threads  # the count of the step in flight

    @property
    def current(self) -> int:
        """The thread count the last step ran with."""
        return self._current

    def choices(self) -> dict[int, int]:
        """Per step-size group (log2 of scheduled tokens), the thread count chosen now."""
        return {key: g.choice for key, g in sorted(self._groups.items())}

    def before_step(self, num_tokens: int) -> int:
        """Size the pool for a step of ``num_tokens`` scheduled tokens; returns the count."""
        key = max(num_tokens, 1).bit_length()
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key, choice=self.max_threads)
        if not group.probing and (group.since_probe >= group.period or self._drifted(group)):
            group.probing = [t for t in range(1, self.max_threads + 1) if t != group.choice for _ in range(PROBE_STEPS)]
            group.samples = {}
        threads = group.probing[0] if group.probing else group.choice
        if threads != self._current:
            self._set_threads(threads)
            self._current = threads
            group.skip = True
        self._group, self._threads = group, threads
        return threads

    def after_step(self, seconds: float) -> None:
        """Record the step ``before_step`` sized."""
        group, threads = self._group, self._threads
        if group is None:
            return
        self._group = None
        counted = not group.skip
        group.skip = False
        if group.probing:
            group.probing.pop(0)
            if counted:
                group.samples.setdefault(threads, []).append(seconds)
            if not group.probing:
                self._decide(group)
            return
        if counted:
            old = group.ema.get(threads)
            group.ema[threads] = seconds if old is None else old + EMA_WEIGHT * (seconds - old)
        group.since_probe += 1
        if not group.settled and group.since_probe >= PROBE_STEPS:  # a first figure, until a probe sets it
            group.settled = group.ema.get(group.choice, 0.0)

    @staticmethod
    def _drifted(group: _Group) -> bool:
        now = group.ema.get(group.choice)
        if now is None or not group.settled or group.since_probe < PROBE_STEPS:
            return False
        return abs(now - group.settled) > DRIFT * group.settled

    @staticmethod
    def _decide(group: _Group) -> None:
        figures = {t: sum(v) / len(v) for t, v in group.samples.items()}
        if group.choice in group.ema:
            figures[group.choice] = group.ema[group.choice]
        best = min(figures, key=lambda t: figures[t]) if figures else group.choice
        if best == group.choice:
            runner_up = min((v for t, v in figures.items() if t != best), default=figures.get(best, 0.0))
            loss = runner_up / figures[best] if figures.get(best) else 1.0
            group.period = min(2 * group.period, int(MAX_PERIOD * min(max(loss, 1.0), MAX_STRETCH)))
        else:
            logger.info(
                "steps of %d-%d tokens now run on %d thread(s): %s",
                1 << (group.key - 1),
                (1 << group.key) - 1,
                best,
                ", ".join(f"{t}: {v * 1e3:.1f} ms" for t, v in sorted(figures.items())),
            )
            group.choice, group.period = best, MIN_PERIOD
            group.ema = {best: figures[best]}
        group.since_probe = 0
        group.settled = figures.get(group.choice, 0.0)
