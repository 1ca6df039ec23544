"""Where a reply's reasoning ends, in token ids: the core's side of ``--reasoning-parser``.

A reasoning model writes ``<think>...</think>`` before its answer, and a structured-outputs
grammar is about the answer: the core lets the model think freely and starts the grammar with the
first token after the end marker (vLLM's ``reasoning_ended`` in its structured-output manager). The
markers are texts (``reasoning_start``/``reasoning_end`` in ``structured_outputs_config``), turned
into ids with the model's ``tokenizer.json``: a single id where the tokenizer has the marker as one
token (Qwen3, DeepSeek-R1), else the marker's tokenization, matched as a run of ids. The model
writing a marker in some other spelling of tokens is not seen here (the frontend, reading text,
would still split there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class ReasoningMarkers:
    start: tuple[int, ...]
    end: tuple[int, ...]

    @classmethod
    def load(cls, tokenizer_path: str, start: str, end: str) -> Optional["ReasoningMarkers"]:
        """The markers' ids, or None without a ``tokenizer.json`` (no grammar runs then anyway:
        structured outputs need that file too)."""
        import tokenizers

        path = tokenizer_path if tokenizer_path.endswith(".json") else os.path.join(tokenizer_path, "tokenizer.json")
        if not os.path.isfile(path):
            return None
        tokenizer = tokenizers.Tokenizer.from_file(path)
        ids = [tuple(tokenizer.encode(text, add_special_tokens=False).ids) for text in (start, end)]
        if not ids[1]:
            raise ValueError(f"structured_outputs_config.reasoning_end {end!r} has no tokens")
        return cls(ids[0], ids[1])

    def ended(self, token_ids: Sequence[int]) -> bool:
        """Whether ``token_ids`` (a prompt) leave reasoning closed: their last marker is an end
        (a template that switches thinking off writes ``<think></think>``; one that opens it
        ends with ``<think>``)."""
        import numpy as np

        ids = np.asarray(token_ids, dtype=np.int64)
        end = _last(ids, self.end)
        return end >= 0 and end > _last(ids, self.start)

    def ends_with_end(self, token_ids: Sequence[int]) -> bool:
        """Whether the last tokens of ``token_ids`` are the end marker."""
        n = len(self.end)
        return len(token_ids) >= n and tuple(token_ids[-n:]) == self.end


def _last(ids: Any, marker: tuple[int, ...]) -> int:
    """Where ``marker`` last starts in ``ids`` (a numpy array), -1 if nowhere (or if it is empty).
    Vectorized, so a long prompt costs the step loop about a millisecond, whatever it holds
    (a Python scan of 128k tokens took ~12 ms, and ~75 ms when every token began a marker)."""
    n, size = len(marker), len(ids)
    if not n or size < n:
        return -1
    hits = ids[: size - n + 1] == marker[0]
    for k in range(1, n):
        hits &= ids[k : size - n + 1 + k] == marker[k]
    found = hits.nonzero()[0]
    return int(found[-1]) if found.size else -1
