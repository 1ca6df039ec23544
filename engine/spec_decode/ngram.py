"""N-gram prompt lookup (vLLM's ``method: "ngram"``, llama.cpp's lookup decoding): the draft is
what followed the last earlier occurrence of the request's own latest tokens.

A request's context (prompt + output) ends with some n-gram; if that n-gram occurred before, the
tokens after that occurrence are a guess at what comes next, and a good one wherever text repeats
(code edited in place, quoted documents, lists, templates). It costs no model: a few numpy passes
over the context, O(context) for the first token compared and then only over the positions still
matching, so a step's lookups are bounded by the running requests' lengths.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from engine.core.request import Request


class Proposer(Protocol):
    """What the scheduler asks for drafts: one list per request (empty: no draft), each at most
    ``max_tokens[i]`` long. A draft-model proposer implements the same call."""

    def propose(self, requests: Sequence[Request], max_tokens: Sequence[int]) -> list[list[int]]: ...


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, requests: Sequence[Request], max_tokens: Sequence[int]) -> list[list[int]]:
        return [
            ngram_draft(_context(r), self.min_n, self.max_n, k) if k > 0 else [] for r, k in zip(requests, max_tokens)
        ]


def _context(req: Request) -> np.ndarray:
    """The request's tokens as an array, kept in its draft state and extended by the tokens added
    since the last call (converting the whole list each step cost ~1 ms per 8,000 tokens, 250x the
    lookup itself). A request's tokens are only ever appended."""
    state = req.spec_state
    buf, filled = state.context if state.context is not None else (np.empty(0, dtype=np.int32), 0)
    n = req.num_tokens
    if n > buf.shape[0]:
        grown = np.empty(max(2 * n, 256), dtype=np.int32)  # token ids < 2**31
        grown[:filled] = buf[:filled]
        buf = grown
    buf[filled:n] = req.all_token_ids[filled:n]
    state.context = (buf, n)
    return buf[:n]


def ngram_draft(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens following the last earlier occurrence (with k tokens after it, if any has)
    of the longest suffix of ``tokens`` whose length is in [min_n, max_n]; [] when no suffix of
    min_n tokens occurred before.

    ``ends`` holds the candidate positions where an earlier occurrence could end (never the last
    position: that is the suffix itself); pass j keeps those whose token j back also matches
    the suffix's, so a pass only touches the candidates still alive."""
    length = tokens.shape[0]
    if length < min_n + 1 or k < 1:
        return []
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])
    matched = 1
    best = ends if min_n <= 1 else None
    while matched < max_n and ends.size:
        ends = ends[ends >= matched]  # room for one more token before the occurrence
        ends = ends[tokens[ends - matched] == tokens[length - 1 - matched]]
        matched += 1
        if ends.size and matched >= min_n:
            best = ends
    if best is None or not best.size:
        return []
    # The last occurrence of the longest match that has k tokens after it, else the first (the
    # one with the most): in a run of one repeated token, the last occurrence ends just before
    # the suffix and would propose a single token.
    full = best[best + k < length]
    start = int(full[-1] if full.size else best[0]) + 1
    return tokens[start : start + k].tolist()
