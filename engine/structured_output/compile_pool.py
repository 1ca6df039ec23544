"""Grammars compile here, in the EngineCore, never on the step loop; compiles are bounded and
fair, so a few large specs cannot hold up everyone else's.

Lanes: a compile runs on one of three, each one thread with at most MAX_QUEUED_COMPILES jobs
waiting (config.py, where the measured compile times are):
- ``quick``: llguidance's compile of a spec up to LARGE_SPEC_BYTES (about a millisecond, bounded
  by its parser limits). Under ``auto`` every request but a structural tag starts on it;
- ``small``: xgrammar's compile of a spec up to LARGE_SPEC_BYTES. Under ``auto`` it is only an
  optimisation: the request moves to its cheaper masks once it is done (manager.py), and it is
  skipped when its lane is full;
- ``large``: any compile of a larger spec, so a small spec never waits behind a large one. Under
  ``auto`` a large spec goes to llguidance alone (xgrammar takes seconds to minutes on it, and
  hundreds of MB).

A job is shared by spec and backend (a digest of ``StructuredOutputsParams.key()``): the same
schema from many clients compiles once, and a spec that failed fails again at once. A job counts
the requests that want it; when the last one ends (finished, aborted, timed out) a job still
waiting in its lane is cancelled. A running one cannot be stopped (the compile is native code):
it finishes on its lane's one thread and its result is cached. A compile that ran, or that a
request waited on, longer than ``compile_timeout_s`` is remembered and never started again:
under ``auto`` its request stays on llguidance, otherwise it is refused at once.

Finished compiles stay in an LRU bounded by bytes (MAX_CACHED_GRAMMAR_BYTES): each grammar's
``nbytes`` (xgrammar's own memory figure; for llguidance an estimate from its grammar's text; a
failure: its message). Compiles in flight are kept apart, bounded by the lanes (one running and
at most eight waiting each). Both backends release the GIL while compiling (the step loop was
never held more than ~40 ms by a 30k-string enum's compile), so the step loop runs meanwhile.
The backends, and the vocabulary they are built from, are made lazily by the first compile, on
a lane thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

from engine.structured_output.byte_lru import ByteLRU
from engine.structured_output.config import (
    LARGE_SPEC_BYTES,
    MAX_CACHED_GRAMMAR_BYTES,
    MAX_KNOWN_SLOW,
    MAX_QUEUED_COMPILES,
    StructuredOutputsConfig,
)
from engine.structured_output.errors import GrammarError
from engine.structured_output.params import StructuredOutputsParams, key_bytes, key_digest, oversize
from engine.structured_output.vocab import Vocabulary

LANES = ("quick", "small", "large")
_FAILURE_BYTES = 1024  # what a failed compile costs in the cache: its error message


class Job:
    """One compile of one spec by one backend, shared by every request that wants it."""

    __slots__ = ("key", "future", "wanted", "seconds")

    def __init__(self, key: tuple) -> None:
        self.key = key  # (backend, digest of the spec)
        self.future: Future = Future()  # the lane's, once submitted
        self.wanted = 0  # requests holding it
        self.seconds = 0.0  # how long the compile ran, once it has (set on the lane thread)


class CompilePool:
    def __init__(
        self,
        config: StructuredOutputsConfig,
        load_vocab: Callable[[], Vocabulary],
        max_cached_bytes: int = MAX_CACHED_GRAMMAR_BYTES,
    ) -> None:
        self.config = config
        self._load_vocab = load_vocab
        self._lanes = {name: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"grammar-{name}") for name in LANES}
        self._waiting: dict[str, list[Future]] = {name: [] for name in LANES}
        self.cache = ByteLRU(max_cached_bytes)  # job key -> finished Job (step loop only: no lock)
        self._in_flight: dict[tuple, Job] = {}  # job key -> Job not yet moved into the cache
        self._slow: OrderedDict[tuple, None] = OrderedDict()  # job keys never to be compiled again
        self._vocab_lock = threading.Lock()  # the lazily built vocabulary and backends (lane threads)
        self._locks = {"xgrammar": threading.Lock(), "guidance": threading.Lock()}
        self._vocab: Optional[Vocabulary] = None
        self._backends: dict[str, Any] = {}

    def submit(self, params: StructuredOutputsParams) -> tuple[Job, Optional[Job]]:
        """The jobs whose grammar a request with ``params`` may use: the one it wants, and under
        ``auto`` llguidance's to start on at once (or None). Each is held until ``release``.
        GrammarError when the spec is too large, known to be slow, or its lane is full.
        Called from the step loop only."""
        self._settle()
        key = params.key()
        reason = oversize(key)
        if reason:
            raise GrammarError(reason)
        digest, size = key_digest(key), key_bytes(key)
        large = size > LARGE_SPEC_BYTES
        backend = self.config.backend
        if backend != "auto":
            return self._job(backend, params, digest, large), None
        from engine.structured_output.backend_xgrammar import XgrammarBackend

        unsupported = XgrammarBackend.unsupported(params)
        if params.kind == "structural_tag" or (self.config.disable_fallback and not unsupported):
            return self._job("xgrammar", params, digest, large), None  # no fallback: the request is xgrammar's
        guidance = self._job("guidance", params, digest, large)
        if large or unsupported or ("xgrammar", digest) in self._slow:
            return guidance, None
        try:
            return self._job("xgrammar", params, digest, large), guidance
        except GrammarError:  # its lane is full: llguidance serves this request alone
            return guidance, None

    def release(self, jobs: tuple) -> None:
        """A request that held ``jobs`` has ended: a job nobody wants any more that has not
        started is cancelled and forgotten."""
        for job in jobs:
            job.wanted -= 1
            if job.wanted <= 0 and job.future.cancel():
                self._in_flight.pop(job.key, None)
        self._settle()

    def gave_up(self, jobs: tuple) -> None:
        """A request waited longer than compile_timeout_s on ``jobs``: those not done are slow."""
        for job in jobs:
            if not job.future.done():
                self._mark_slow(job.key)

    def shutdown(self) -> None:
        for lane in self._lanes.values():
            lane.shutdown(wait=False, cancel_futures=True)

    def _job(self, backend: str, params: StructuredOutputsParams, digest: bytes, large: bool) -> Job:
        key = (backend, digest)
        job = self.cache.get(key) or self._in_flight.get(key)
        if job is None:
            if key in self._slow:
                raise GrammarError(
                    f"structured_outputs.{params.kind}: this spec took longer than "
                    f"compile_timeout_s ({self.config.compile_timeout_s:g} s) to compile before "
                    "and is not compiled again; simplify it"
                )
            lane = "large" if large else ("small" if backend == "xgrammar" else "quick")
            waiting = self._waiting[lane] = [f for f in self._waiting[lane] if not (f.running() or f.done())]
            if len(waiting) >= MAX_QUEUED_COMPILES:
                raise GrammarError(
                    f"structured_outputs: {MAX_QUEUED_COMPILES} grammars are already waiting to "
                    f"compile on the server's {lane} lane (max_queued_compiles); try again later"
                )
            job = Job(key)
            job.future = self._lanes[lane].submit(self._compile, job, backend, params)
            waiting.append(job.future)
            self._in_flight[key] = job
        job.wanted += 1
        return job

    def _settle(self) -> None:
        """Finished compiles move into the cache at their size; the slow ones are remembered."""
        for key, job in list(self._in_flight.items()):
            if not job.future.done():
                continue
            del self._in_flight[key]
            if job.future.cancelled():  # by shutdown
                continue
            if job.seconds > self.config.compile_timeout_s:
                self._mark_slow(key)
            error = job.future.exception()  # a failure is kept too: the same spec fails again at once
            self.cache.put(key, job, job.future.result().nbytes if error is None else _FAILURE_BYTES)

    def _mark_slow(self, key: tuple) -> None:
        self._slow[key] = None
        self._slow.move_to_end(key)
        while len(self._slow) > MAX_KNOWN_SLOW:
            self._slow.popitem(last=False)

    # ---------------------------------------------------------------- lane threads
    def _compile(self, job: Job, backend: str, params: StructuredOutputsParams) -> Any:
        compiler = self._backend(backend)
        start = time.monotonic()
        try:
            return compiler.compile(params)
        finally:
            job.seconds = time.monotonic() - start

    def _backend(self, name: str) -> Any:
        with self._vocab_lock:
            if self._vocab is None:
                self._vocab = self._load_vocab()
        with self._locks[name]:  # one backend being built never holds up the other
            backend = self._backends.get(name)
            if backend is None:
                if name == "xgrammar":
                    from engine.structured_output.backend_xgrammar import XgrammarBackend as cls
                else:
                    from engine.structured_output.backend_guidance import GuidanceBackend as cls
                backend = self._backends[name] = cls(self._vocab)
            return backend
