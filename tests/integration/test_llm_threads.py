"""One ``LLM`` called from several threads (unlike vLLM's, it may be): the calls that drive the
engine run one at a time, each thread gets exactly its own outputs, nothing hangs, Ctrl-C still
reaches a call waiting for its turn, and ``shutdown()`` from another thread ends a running
call at once with ``EngineShutdownError``. With the core in another process (the ring and zmq)
and in this one (``RINGLLM_ENABLE_MULTIPROCESSING=0``)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from engine import LLM, SamplingParams
from engine.client import InprocClient
from engine.exceptions import EngineShutdownError
from tests.helpers.engine_utils import EXIT_DEADLINE_S, TINY, nothing_left_behind, pid_gone, wait_until  # noqa: F401

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=240, ignore_eos=True)
THREADS, PER_THREAD = 4, 3
# Generous: a hang is what these joins catch, not a slow machine.
JOIN_S = 120.0


def make_llm(model: str, mode: str) -> LLM:
    if mode != "inproc":
        return LLM(model=model, transport=mode, **TINY)
    os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    try:
        llm = LLM(model=model, **TINY)
    finally:
        del os.environ["RINGLLM_ENABLE_MULTIPROCESSING"]
    assert isinstance(llm.llm_engine.engine_core, InprocClient)
    return llm


@pytest.fixture(scope="module", params=["shm", "zmq", "inproc"])
def llm(request, tiny_model_dir):
    llm = make_llm(tiny_model_dir, request.param)
    yield llm
    llm.shutdown()


def run_threads(targets: list) -> list:
    """Run each callable in its own thread, started together; their results (or exceptions).
    Fails if any is still running after JOIN_S."""
    results: list = [None] * len(targets)
    start = threading.Barrier(len(targets))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = targets[i]()
        except BaseException as e:  # handed to the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(targets))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"threads still running after {JOIN_S} s: a hang"
    return results


def test_four_threads_each_get_their_own_outputs(llm):
    # Used to end with KeyError: '0' in one thread and the other blocked for ever in the ring
    # drain (two threads); with four, all of them hung.
    prompts = [[f"thread {t} prompt {p}:" for p in range(PER_THREAD)] for t in range(THREADS)]
    alone = [llm.generate(batch, GREEDY, use_tqdm=False) for batch in prompts]

    def generate(batch: list[str]):
        return lambda: [llm.generate(batch, GREEDY, use_tqdm=False) for _ in range(3)]

    def utility_calls():  # a utility call between others' steps reads the same channel
        return [llm.reset_prefix_cache() for _ in range(5)]

    *together, resets = run_threads([generate(batch) for batch in prompts] + [utility_calls])
    assert all(isinstance(r, bool) for r in resets), resets
    ids = set()
    for batch, want, rounds in zip(prompts, alone, together):
        assert not isinstance(rounds, BaseException), repr(rounds)[:500]
        for got in rounds:
            assert [o.prompt for o in got] == batch
            assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
            assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]
            ids.update(o.request_id for o in got)
    assert len(ids) == THREADS * PER_THREAD * 3  # no request id given to two calls
    assert not llm.llm_engine.has_unfinished_requests()


def test_ctrl_c_while_waiting_for_another_threads_call_raises_promptly(llm):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as a script sees it
    outputs: list = []
    worker = threading.Thread(
        target=lambda: outputs.extend(llm.generate([f"long {i}" for i in range(24)], LONG, use_tqdm=False)), daemon=True
    )
    fired: list[float] = []

    def interrupt() -> None:
        fired.append(time.monotonic())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    try:
        worker.start()
        wait_until(llm.llm_engine.has_unfinished_requests, timeout=JOIN_S, interval=0.001)
        timer = threading.Timer(0.05, interrupt)  # main is waiting for the lock by then
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            llm.generate("my turn", GREEDY, use_tqdm=False)  # waits for the worker's call
        interrupted_at = time.monotonic()
        running = worker.is_alive()
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert running, "the worker's call ended before the interrupt: this test checked nothing"
    assert interrupted_at - fired[0] < 1.0
    worker.join(JOIN_S)
    assert not worker.is_alive()
    assert len(outputs) == 24 and all(len(o.outputs[0].token_ids) == 240 for o in outputs)
    assert len(llm.generate("still serving", GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


@pytest.mark.parametrize("mode", ["shm", "zmq", "inproc"])
def test_shutdown_from_another_thread_ends_the_running_call_at_once(tiny_model_dir, mode):
    # Used to fail with "EngineCore exited with code 1 (ChannelClosed: ...)", after sending
    # SHUTDOWN on a ring the running call was writing to.
    llm = make_llm(tiny_model_dir, mode)
    pid = None if mode == "inproc" else llm.llm_engine.engine_core.ready.pid

    def running():
        return llm.generate([f"long {i}" for i in range(100)], LONG, use_tqdm=False)

    def waiting():  # for the lock, or already shut down: it raises either way
        wait_until(llm.llm_engine.has_unfinished_requests, timeout=JOIN_S, interval=0.001)
        return llm.generate("waits for its turn", GREEDY, use_tqdm=False)

    def shut_down():
        wait_until(llm.llm_engine.has_unfinished_requests, timeout=JOIN_S, interval=0.001)
        time.sleep(0.05)  # the waiting call is most likely at the lock by now
        llm.shutdown()
        return "shut down"

    ran, waited, shut = run_threads([running, waiting, shut_down])
    assert isinstance(ran, EngineShutdownError), repr(ran)[:500]
    assert str(ran) == "the engine was shut down while the request was running"
    assert isinstance(waited, EngineShutdownError), repr(waited)[:500]
    assert shut == "shut down"
    with pytest.raises(EngineShutdownError, match="^the engine was shut down$"):
        llm.generate("after", GREEDY, use_tqdm=False)
    llm.shutdown()  # again: nothing to do
    if pid is not None:
        wait_until(lambda: pid_gone(pid), timeout=EXIT_DEADLINE_S)
