"""The process in which tests/integration/test_channel_close_race.py closes channels under busy threads.

``python tests/helpers/close_race_worker.py TRANSPORT SECONDS MIN_ROUNDS [NAME,...]`` runs every scenario
(or the named ones) in turn,
round after round, until SECONDS have passed and at least MIN_ROUNDS rounds are done. In each,
one thread is blocked in (or looping over) a channel call while another closes that channel;
the call must end with ChannelClosed, nothing else. It prints one JSON line of counts and
unexpected errors. A crash (SIGSEGV, SIGBUS) kills only this process: faulthandler prints the
stacks and the test sees the signal in the exit status.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import random
import sys
import threading
import time
import traceback
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from shm_transport import Channel, ChannelClosed  # noqa: E402

from tests.helpers.transport_peer import Ctl, codec  # noqa: E402

MSG = Ctl("x", 1, "y" * 100)
_rng = random.Random(int(os.environ.get("CLOSE_RACE_SEED", "1")))
ERRORS: list[str] = []  # unexpected exceptions, from any thread or the loop


def _pair(transport: str) -> tuple[Any, Any]:
    if transport == "zmq":
        from shm_transport.zmq_channel import ZmqChannel

        a = ZmqChannel.create(codec(), capacity=4096)
        b = ZmqChannel.attach(codec(), a.peer_token())
        return a, b
    return Channel.pair(codec(), capacity=4096)


def _close_soon(ch: Any) -> threading.Thread:
    """Close ``ch`` from another thread after 0 to 2 ms (both sides of the waiter's sleep)."""
    delay = _rng.uniform(0, 0.002)

    def run() -> None:
        if delay > 0.0005:
            time.sleep(delay)
        ch.close()

    t = threading.Thread(target=run)
    t.start()
    return t


def _until_closed(call: Callable[[], Any]) -> None:
    """Call ``call`` until it raises ChannelClosed (the expected end of every scenario)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            call()
        except ChannelClosed:
            return
        except TimeoutError:
            continue
    raise AssertionError("the channel was closed but the call never raised ChannelClosed")


def _fill(ch: Any) -> None:
    deadline = time.monotonic() + 5
    while ch.try_send(MSG):
        if time.monotonic() > deadline:
            raise AssertionError("the ring never filled up")


def recv(a: Any, b: Any) -> threading.Thread:
    t = _close_soon(b)
    _until_closed(lambda: b.recv(timeout=20))
    return t


def recv_batch(a: Any, b: Any) -> threading.Thread:
    t = _close_soon(b)
    _until_closed(lambda: b.recv_batch(timeout=20))
    return t


def poll_loop(a: Any, b: Any) -> threading.Thread:
    a.send(MSG)
    t = _close_soon(b)
    _until_closed(b.poll)
    return t


def send_full(a: Any, b: Any) -> threading.Thread:
    _fill(a)
    t = _close_soon(a)
    _until_closed(lambda: a.send(MSG, timeout=20))
    return t


def send_loop(a: Any, b: Any) -> threading.Thread:
    """The fast paths: send and try_send while the peer drains."""
    t = _close_soon(a)
    _until_closed(lambda: (a.try_send(MSG), b.poll(), a.send(MSG, timeout=20), b.poll()))
    return t


def wakeup(a: Any, b: Any) -> threading.Thread:
    """A thread keeps waking a blocked recv_batch while the channel closes."""
    stop = threading.Event()

    def kick() -> None:
        while not stop.is_set():
            b.wakeup()

    kicker = threading.Thread(target=kick)
    kicker.start()
    try:
        t = _close_soon(b)
        _until_closed(lambda: b.recv_batch(timeout=20))
    finally:
        stop.set()
        kicker.join()
    return t


class _LoopThread:
    """An asyncio loop running in its own thread (the engine's frontend shape)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda loop, ctx: ERRORS.append(f"loop: {ctx}"))
        self.thread = threading.Thread(target=self.loop.run_forever)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


_loop: _LoopThread | None = None


async def _async_until_closed(call: Callable[[], Any]) -> None:
    while True:
        try:
            await call()
        except ChannelClosed:
            return
        except TimeoutError:
            continue


def async_recv(a: Any, b: Any) -> None:
    fut = _loop.run(_async_until_closed(lambda: b.recv_async(timeout=20)))
    time.sleep(_rng.uniform(0, 0.002))
    b.close()
    fut.result(timeout=20)


def async_send(a: Any, b: Any) -> None:
    _fill(a)
    fut = _loop.run(_async_until_closed(lambda: a.send_async(MSG, timeout=20)))
    time.sleep(_rng.uniform(0, 0.002))
    a.close()
    fut.result(timeout=20)


SCENARIOS = [recv, recv_batch, poll_loop, send_full, send_loop, wakeup, async_recv, async_send]


def main() -> None:
    global _loop
    faulthandler.enable(all_threads=True)
    threading.excepthook = lambda a: ERRORS.append(
        f"thread {a.thread.name}: {''.join(traceback.format_exception(a.exc_value))}"
    )
    transport, seconds, min_rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    scenarios = SCENARIOS
    if len(sys.argv) > 4:
        scenarios = [s for s in SCENARIOS if s.__name__ in sys.argv[4].split(",")]
    _loop = _LoopThread()
    counts: dict[str, int] = {s.__name__: 0 for s in scenarios}
    errors = ERRORS
    start = time.monotonic()
    rounds = 0
    try:
        while (rounds < min_rounds or time.monotonic() - start < seconds) and len(errors) < 5:
            for scenario in scenarios:
                a, b = _pair(transport)
                closer = None
                try:
                    closer = scenario(a, b)
                    counts[scenario.__name__] += 1
                except Exception:
                    errors.append(f"{scenario.__name__}: {traceback.format_exc()}")
                finally:
                    if closer is not None:
                        closer.join()
                    a.close()
                    b.close()
            rounds += 1
    finally:
        _loop.stop()
    print(json.dumps({"rounds": rounds, "counts": counts, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
