"""The frontend's CPU work that grows with its input, kept off the event loop.

Tokenizing a prompt, rendering a chat template and detokenizing a token list cost time in
proportion to their input: a 4 MB prompt takes seconds to tokenize. On the event loop that
would freeze every stream and /health for as long, so ``Renderer`` runs such work on a
small thread pool. The pool is bounded twice: in threads (``workers``) and in the work
admitted to it (jobs and bytes, running or queued); past either bound ``run`` refuses at once
with ``RendererBusyError`` (the server answers 503 + Retry-After) instead of queueing without
end. Inputs under ``INLINE_MAX_BYTES`` run inline: they cost less than a hop to a thread;
chat templates never do, whatever their input (a short message can meet a long template).

The tokenizer calls here go through the Rust ``tokenizers`` batch entry points, which
release the GIL while they work (the single-text ``Tokenizer.encode`` and ``decode`` hold it
for their whole length, so a thread would not help the loop). They give the same ids as
``transformers``' ``tokenizer.encode``, which calls the same batch entry point.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from engine.frontend.tokenizer import cleans_up_spaces

T = TypeVar("T")

# Below this many bytes (or token ids) a job runs inline on the caller's thread (~tens of µs).
INLINE_MAX_BYTES = 4096
# Work admitted to the pool at once (running + queued): beyond it, RendererBusyError.
MAX_PENDING_JOBS = 256
MAX_PENDING_BYTES = 64 << 20


class RendererBusyError(RuntimeError):
    """The pool holds as much work as it may: retry later (HTTP 503)."""


class Renderer:
    def __init__(
        self, workers: int, max_pending_jobs: int = MAX_PENDING_JOBS, max_pending_bytes: int = MAX_PENDING_BYTES
    ) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="renderer")
        self._max_jobs, self._max_bytes = max_pending_jobs, max_pending_bytes
        # Released by the job's own completion (from the worker thread), not by its awaiting
        # task: a cancelled request's job still occupies the pool until it has run.
        self._lock = threading.Lock()
        self._jobs = self._bytes = 0

    async def run(self, size: int, fn: Callable[..., T], *args: Any, inline: bool = True) -> T:
        """``fn(*args)``, off the loop unless ``size`` (bytes of input) is small and ``inline``
        allows it: a chat template's cost is the template's, not its input's, so it never runs
        inline (it bounds its own time: engine/frontend/chat_template.py)."""
        if inline and size < INLINE_MAX_BYTES:
            return fn(*args)
        with self._lock:
            if self._jobs >= self._max_jobs or self._bytes + size > self._max_bytes:
                raise RendererBusyError(
                    f"the tokenizer pool is full ({self._jobs} jobs, {self._bytes} bytes pending); retry later"
                )
            self._jobs += 1
            self._bytes += size
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._release(size)
            raise
        future.add_done_callback(lambda _: self._release(size))
        return await asyncio.wrap_future(future)

    def _release(self, size: int) -> None:
        with self._lock:
            self._jobs -= 1
            self._bytes -= size

    @property
    def pending(self) -> tuple[int, int]:
        """(jobs, bytes) admitted and not yet finished."""
        with self._lock:
            return self._jobs, self._bytes

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=...)``, releasing the GIL while it works."""
    backend = tokenizer.backend_tokenizer
    batch = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: no offsets, same ids
    return batch([text], add_special_tokens=add_special_tokens)[0].ids


def encode_pair(tokenizer: Any, text_1: str, text_2: str) -> list[int]:
    """The ids of a text pair as the tokenizer encodes one (``tokenizer(text_1, text_2)``: its
    pair template, special tokens included), releasing the GIL while it works."""
    backend = tokenizer.backend_tokenizer
    batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return batch([(text_1, text_2)], add_special_tokens=True)[0].ids


def decode(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """``tokenizer.decode(token_ids)``, releasing the GIL while it works."""
    text = tokenizer.backend_tokenizer.decode_batch([list(token_ids)], skip_special_tokens=False)[0]
    if cleans_up_spaces(tokenizer):
        text = tokenizer.clean_up_tokenization(text)
    return text


def max_token_bytes(tokenizer: Any) -> int:
    """An upper bound of the UTF-8 bytes of prompt text that one token can cover.

    A text of B bytes is then at least ``B / max_token_bytes`` tokens long, so a prompt too long
    for the context can be refused from its size before it is tokenized. Computed once from the
    vocabulary (added tokens included; ~0.1 s for 50k tokens): each token decoded alone by the
    tokenizer's decoder (byte-level BPE stores a byte as one mapped character, 'Ġ' for a space,
    so the stored strings overstate it), plus one byte for the leading space a decoder may strip
    (Metaspace, Strip); with no decoder, the stored string's length, which can only overstate.
    A normalizer may shrink text before it is split (Unicode composition folds up to three
    characters into one), so with one the bound is taken four times over.
    """
    backend = tokenizer.backend_tokenizer
    decoder = backend.decoder
    tokens = list(backend.get_vocab(with_added_tokens=True))
    if decoder is None:
        longest = max(len(t.encode()) for t in tokens)
    else:
        longest = 1 + max(len(decoder.decode([t]).encode()) for t in tokens)
    return longest * (4 if backend.normalizer is not None else 1)
