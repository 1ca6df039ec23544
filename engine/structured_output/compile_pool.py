"""Grammars compile here, on a small thread pool in the EngineCore: never on the step loop.

One future per distinct spec (``StructuredOutputsParams.key()``), kept in a bounded LRU: the
same schema from many clients (or the n samples of one request) compiles once, and a spec that
failed fails again at once. Compiling releases the GIL (xgrammar and llguidance are native), so
the step loop keeps running while a pool thread compiles. The backends, and the vocabulary they
are built from (~0.1-0.4 s), are made lazily by the first compile, on a pool thread too.
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

MAX_CACHED_GRAMMARS = 1024


class CompilePool:
    def __init__(self, config: StructuredOutputsConfig, load_vocab: Callable[[], Vocabulary],
                 workers: int = 1, max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self.config = config
        self._load_vocab = load_vocab
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._max_cached = max_cached
        self._lock = threading.Lock()  # the lazily built backends (pool threads)
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
        future = self._executor.submit(self._compile, params)
        self._cache[key] = future
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

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
        with self._lock:
            backend = self._backends.get(name)
            if backend is None:
                if self._vocab is None:
                    self._vocab = self._load_vocab()
                if name == "xgrammar":
                    from engine.structured_output.backend_xgrammar import XgrammarBackend as cls
                else:
                    from engine.structured_output.backend_guidance import GuidanceBackend as cls
                backend = self._backends[name] = cls(self._vocab)
            return backend
