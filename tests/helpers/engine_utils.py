"""A tiny engine for the process tests, and the checks that its processes are gone: the
shared part of the engine modules (test_engine_proc.py, test_llm_mp.py, test_async_llm.py, ...).
Starting a core imports torch, so those modules build their engines once per module, and
``nothing_left_behind`` checks for leaks again once the module's engines are gone (conftest.py
checks after each test, before module fixtures are torn down)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from engine.config import EngineArgs
from engine.sampling_params import SamplingParams
from engine.wire_messages import EngineCoreRequest
from tests.helpers.process_utils import live_children

# Dummy weights on a tiny Llama: a step costs about a millisecond, so these tests measure
# the process and transport machinery, not the model. Rings at their smallest by default.
TINY = dict(
    load_format="dummy",
    dtype="float32",
    max_model_len=256,
    kv_cache_memory=16 << 20,
    num_threads=1,
    ring_capacity=4096,
    seed=0,
)


def tiny_config(model: str, **overrides):
    return EngineArgs(model=model, **{**TINY, **overrides}).create_engine_config()


def pid_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: it no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_until(cond, timeout: float, interval: float = 0.01) -> float:
    """Seconds until ``cond()`` held; fails the test after ``timeout``."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - start


# Deadlines for a process to go away: generous, because a loaded machine (CI with both cores
# busy) may take seconds to schedule an exiting process; a test waits for the condition and
# is as fast as the machine allows.
EXIT_DEADLINE_S = 60.0


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind():
    """Set up before, and torn down after, every engine of the module: then no child
    process and no new /dev/shm entry may remain."""
    shm_before = ringllm_shm_entries()
    children_before = set(live_children())
    yield
    deadline = time.monotonic() + EXIT_DEADLINE_S
    while (
        left := {p: c for p, c in live_children().items() if p not in children_before}
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # named below; killed so that later modules start clean
        os.kill(pid, signal.SIGKILL)
    assert not left, f"child processes still running {EXIT_DEADLINE_S} s after the module's engines: {left}"
    assert ringllm_shm_entries() <= shm_before


def ringllm_shm_entries() -> set[str]:
    """Our segments in /dev/shm (other programs on the machine may come and go meanwhile)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("ringllm-")}


def request(request_id: str, max_tokens: int = 8, prompt=(1, 2, 3, 4)) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineCoreRequest(request_id, list(prompt), params, eos_token_id=2)
