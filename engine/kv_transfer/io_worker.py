"""One thread that does the KV store's file work for the step loop, each batch waited for with a
deadline.

On local storage every store operation is bounded (store_dir.py), but on a network or FUSE mount
any system call can stall in the kernel for as long as the server is away, and no open flag
prevents it. So the connector never touches the store from the step loop itself: it hands this
thread one batch (the run of entries a request may load; the blocks a step saves) and waits up to
``deadline_s``. Past it, the batch counts as a miss or is skipped, and the store is *stalled*:
later batches are turned away at once (nothing piles up behind the stuck call, and the loop
never waits twice for it) until the stuck batch returns; then the store is used again. Each
stall is logged once. Whatever a batch needs from the KV cache is copied before it is handed
over, so a batch that finishes late never reads blocks the engine has reused meanwhile.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)


class _Batch:
    __slots__ = ("fn", "done", "result", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.done, self.result, self.error = fn, threading.Event(), None, None


class IOWorker:
    def __init__(self, name: str, deadline_s: float) -> None:
        self.name = name
        self.deadline_s = deadline_s
        self._batches: queue.SimpleQueue = queue.SimpleQueue()
        self._stuck: Optional[_Batch] = None
        # A daemon thread: a call stuck in the kernel must not hold up the process's exit.
        threading.Thread(target=_serve, args=(self._batches,), name=f"{name}-io", daemon=True).start()
        weakref.finalize(self, self._batches.put, None)

    def call(self, fn: Callable[[], Any], default: Any) -> Any:
        """``fn()`` run on the thread, or ``default`` if it did not finish within the deadline, if
        an earlier batch is still stuck, or if it raised (logged: the store never fails a step)."""
        if self._stuck is not None:
            if not self._stuck.done.is_set():
                return default
            logger.warning("KV store %s: the stalled file operation returned; using the store again", self.name)
            self._stuck = None
        batch = _Batch(fn)
        self._batches.put(batch)
        if not batch.done.wait(self.deadline_s):
            self._stuck = batch
            logger.warning(
                "KV store %s: a file operation took over %.1f s (a stalled network or FUSE mount?); "
                "going on without the store until it returns",
                self.name,
                self.deadline_s,
            )
            return default
        if batch.error is not None:
            logger.warning("KV store %s: %r; going on without it for this batch", self.name, batch.error)
            return default
        return batch.result


def _serve(batches: queue.SimpleQueue) -> None:
    while (batch := batches.get()) is not None:
        try:
            batch.result = batch.fn()
        except Exception as e:  # handed back to call(), which logs it
            batch.error = e
        batch.done.set()
