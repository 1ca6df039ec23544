"""Grammars compile here, on a small thread pool in the EngineCore: never on the step loop.

One future per distinct spec (``StructuredOutputsParams.key()``), kept in a bounded LRU: the
same schema from many clients (or the n samples of one request) compiles once, and a spec that
failed fails again at once. Compiling releases the GIL (xgrammar and llguidance are native), so
the step loop keeps running while a pool thread compiles. The backends, and the vocabulary they
are built from, are made lazily by the first compile, on a pool thread too.

Under ``auto`` a JSON schema is also compiled by llguidance on a thread of its own
(``submit_quick``): ~1 ms where xgrammar takes tens, so a request can start generating at once
and move to xgrammar's cheaper masks when its compile is done (manager.py).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

from engine.structured_output.config import StructuredOutputsConfig
from engine.structured_output.errors import GrammarError
from engine.structured_output.params import StructuredOutputsParams
from engine.structured_output.vocab import Vocabulary

# A compiled 5-field JSON schema holds ~250 KB in xgrammar (its token-mask cache): 256 of them stay
# well under a hundred MB, larger schemas more.
MAX_CACHED_GRAMMARS = 256


class CompilePool:
    def __init__(self, config: StructuredOutputsConfig, load_vocab: Callable[[], Vocabulary],
                 workers: int = 1, max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self.config = config
        self._load_vocab = load_vocab
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")
        self._quick = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-quick")
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._max_cached = max_cached
        self._vocab_lock = threading.Lock()  # the lazily built vocabulary and backends (pool threads)
        self._locks = {"xgrammar": threading.Lock(), "guidance": threading.Lock()}
        self._vocab: Optional[Vocabulary] = None
        self._backends: dict[str, Any] = {}

    def submit(self, params: StructuredOutputsParams) -> Future:
        """The compiled grammar of ``params`` (a future; GrammarError when it cannot compile).
        Called from the step loop only: the cache needs no lock."""
        key = params.key()
        future = self._cache.get(key)
        if future is not None:
            self._cache.move_to_end(key)
            return future
        return self._remember(key, self._executor.submit(self._compile, params))

    def submit_quick(self, params: StructuredOutputsParams) -> Optional[Future]:
        """Under ``auto``, for a JSON schema: llguidance's compile of it (a future), or None."""
        if self.config.backend != "auto" or params.kind not in ("json", "json_object"):
            return None
        key = ("guidance-quick",) + params.key()
        future = self._cache.get(key)
        if future is not None:
            self._cache.move_to_end(key)
            return future
        return self._remember(key, self._quick.submit(lambda: self._backend("guidance").compile(params)))

    def _remember(self, key: tuple, future: Future) -> Future:
        self._cache[key] = future
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._quick.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- pool threads
    def _compile(self, params: StructuredOutputsParams) -> Any:
        backend = self.config.backend
        if backend != "auto":
            return self._backend(backend).compile(params)
        from engine.structured_output.backend_xgrammar import XgrammarBackend

        if params.kind == "structural_tag" or not XgrammarBackend.unsupported(params):
            try:
                return self._backend("xgrammar").compile(params)
            except GrammarError:
                if self.config.disable_fallback or params.kind == "structural_tag":
                    raise
        return self._backend("guidance").compile(params)

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
