"""The per-step thread count (engine/worker/thread_tuner.py) against simulated hosts: it runs the
faster count, follows a host that becomes busy or quiet, keeps step sizes apart, and does not
count the first step on a newly sized pool."""

from __future__ import annotations

import pytest

from engine.worker.thread_tuner import MAX_PERIOD, MAX_STRETCH, ThreadTuner


class Host:
    """Seconds per step by thread count; the first step after a resize pays ``resize_s`` more."""

    def __init__(self, times: dict[int, float], resize_s: float = 0.0) -> None:
        self.times, self.resize_s = times, resize_s
        self.pool, self.resized, self.resizes = 2, False, 0

    def set_threads(self, n: int) -> None:
        self.pool, self.resized = n, True
        self.resizes += 1

    def run(self, tuner: ThreadTuner, steps: int, tokens: int = 1) -> list[int]:
        used = []
        for _ in range(steps):
            threads = tuner.before_step(tokens)
            assert threads == self.pool
            seconds = self.times[threads] + (self.resize_s if self.resized else 0.0)
            self.resized = False
            tuner.after_step(seconds)
            used.append(threads)
        return used


QUIET = {1: 0.050, 2: 0.030}  # a 1.56B decode step, quiet host
BUSY = {1: 0.065, 2: 0.180}  # another process holds a core


def test_a_quiet_host_runs_on_both_threads_and_probes_rarely():
    host = Host(QUIET)
    tuner = ThreadTuner(2, host.set_threads)
    used = host.run(tuner, 2000)
    assert tuner.choices() == {1: 2}
    assert used.count(1) / len(used) < 0.03
    assert used[-MAX_PERIOD:].count(1) <= 3  # settled: one probe per MAX_PERIOD steps


def test_a_busy_host_falls_back_to_one_thread_within_a_probe():
    host = Host(BUSY)
    tuner = ThreadTuner(2, host.set_threads)
    used = host.run(tuner, 400)
    assert tuner.choices() == {1: 1}
    assert used.index(1) <= 16
    assert used[40:].count(2) / len(used[40:]) < 0.03


def test_the_tuner_follows_the_host_both_ways():
    host = Host(QUIET)
    tuner = ThreadTuner(2, host.set_threads)
    host.run(tuner, 3000)  # settled: probes every MAX_PERIOD steps
    host.times = BUSY
    used = host.run(tuner, 30)
    assert tuner.choices() == {1: 1} and used[2:18] == [1] * 16  # the choice's step time jumped: probed at once
    host.run(tuner, 3000)  # settled again
    host.times = QUIET
    used = host.run(tuner, 30)
    # one thread's step time fell by a quarter: probed at once, and the stale busy figure of 2
    # threads is not what decides
    assert tuner.choices() == {1: 2} and used[8:24] == [2] * 16


def test_a_settled_tuner_still_probes_when_its_own_step_time_does_not_move():
    # One thread keeps its core when another process takes the other one: its time stays put,
    # and only the periodic probe finds that two threads became faster again.
    host = Host({1: 0.050, 2: 0.150})
    tuner = ThreadTuner(2, host.set_threads)
    host.run(tuner, 3000)
    host.times = QUIET
    used = host.run(tuner, MAX_PERIOD * MAX_STRETCH + 20)
    assert used[-10:] == [2] * 10


def test_a_count_that_loses_badly_is_probed_less_often():
    # Beside a busy process two spinning threads can make a step 10x slower: each probe step
    # costs 10 steps' time, so the settled period stretches.
    host = Host({1: 0.05, 2: 0.5})
    tuner = ThreadTuner(2, host.set_threads)
    host.run(tuner, 3000)
    used = host.run(tuner, 5000)
    time_on_probes = used.count(2) * 0.5 / (used.count(1) * 0.05)
    assert time_on_probes < 0.05


def test_step_sizes_are_chosen_apart():
    host = Host(QUIET)
    tuner = ThreadTuner(2, host.set_threads)
    for _ in range(200):
        host.times = {1: 0.4, 2: 0.25}  # a 512-token prefill
        host.run(tuner, 1, tokens=512)
        host.times = BUSY  # decode steps that lose on two threads
        host.run(tuner, 1, tokens=8)
    assert tuner.choices() == {4: 1, 10: 2}


def test_the_first_step_on_a_resized_pool_does_not_count():
    # Waking (or parking) the pool makes one step slow; counted, it would make 1 thread look
    # slower than it is in every probe, and the tuner would stay on 2 threads on a busy host.
    host = Host(BUSY, resize_s=0.5)
    tuner = ThreadTuner(2, host.set_threads)
    host.run(tuner, 200)
    assert tuner.choices() == {1: 1}


def test_the_pool_is_resized_only_when_the_count_changes():
    host = Host(QUIET)
    tuner = ThreadTuner(2, host.set_threads)
    host.run(tuner, 1000)
    probes = host.resizes // 2
    assert 0 < probes < 12


def test_one_thread_has_nothing_to_tune():
    with pytest.raises(ValueError, match="at least 2"):
        ThreadTuner(1, lambda n: None)
