"""close() from another thread while calls are blocked in, or looping over, the same channel.

Each scenario (tests/helpers/close_race_worker.py: sync recv, recv_batch, poll loops, send on a full
ring, the send/try_send fast paths, wakeup, asyncio recv and send on a loop in another thread)
runs thousands of times in a child process under CPU load, so that the closer and the waiter
it wakes interleave in every order. A segment unmapped under either of them is a SIGSEGV: it
kills the child, not pytest, and shows here as its exit status with faulthandler's stacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

WORKER = os.path.join(ROOT, "tests", "helpers", "close_race_worker.py")
SECONDS = 10  # per transport; at least the given rounds of every scenario in any case


def _cpu_hogs(n: int, seconds: float) -> list[subprocess.Popen]:
    """Busy-looping children (bounded: they exit by themselves after ``seconds``)."""
    code = f"import time\nt = time.monotonic() + {seconds}\nwhile time.monotonic() < t: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "transport, min_rounds",
    [
        ("ring", 150),  # x 8 scenarios: 1,200 closes
        ("zmq", 25),  # a zmq context takes milliseconds to set up and tear down
    ],
)
def test_close_from_another_thread_never_crashes_a_busy_call(transport, min_rounds):
    hogs = _cpu_hogs(2, 120)
    try:
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1")
        proc = subprocess.run(
            [sys.executable, WORKER, transport, str(SECONDS), str(min_rounds)],
            capture_output=True,
            text=True,
            timeout=140,
            env=env,
            cwd=ROOT,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert proc.returncode == 0, f"the worker died (status {proc.returncode}):\n{proc.stderr[-6000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], "\n".join(result["errors"])[:6000]
    assert result["rounds"] >= min_rounds
    assert all(n == result["rounds"] for n in result["counts"].values()), result["counts"]
