"""How much input-sized work admitting a request does: the measure the renderer pool's one rule
(``renderer.INLINE_MAX_BYTES``) is applied to.

Admitting is not only tokenizing the prompt: a short prompt can carry 80,000 ``choice`` strings to
turn into a grammar and validate, a thousand ``bad_words`` to tokenize twice each, a JSON schema of
megabytes, thousands of ``logit_bias`` entries to check against the vocabulary. So the size is the
whole request's: the prompt text plus every field of the params whose work grows with its length.

The measure itself must not be input-sized, since it runs on the event loop to decide whether the
rest may: a list is summed item by item only up to ``INLINE_MAX_BYTES`` items (a longer one is
past the bound by its count alone, and the rest is extrapolated from what was read), and a JSON
schema given as a dict is walked only until it is known to reach the bound. The figure is exact
for every request that may run inline; above that it is a lower estimate, which only weighs the
job in the pool's bound of pending bytes.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from engine.frontend.renderer import INLINE_MAX_BYTES

# What one token id or logit_bias entry counts for: a Python int checked against the vocabulary.
_ID_BYTES = 8
# The params' lists of strings, each tokenized, searched or turned into a grammar.
_STRING_LISTS = ("stop", "bad_words")
_ID_COLLECTIONS = ("logit_bias", "allowed_token_ids", "stop_token_ids")
_CONSTRAINT_TEXTS = ("regex", "grammar", "structural_tag", "whitespace_pattern")


def params_size(params: Any) -> int:
    """The input-sized part of ``params`` (SamplingParams or PoolingParams), in bytes (characters)."""
    size = sum(_strings_size(getattr(params, name, None)) for name in _STRING_LISTS)
    size += sum(_ID_BYTES * len(getattr(params, name, None) or ()) for name in _ID_COLLECTIONS)
    so = getattr(params, "structured_outputs", None)
    if so is not None:
        size += _strings_size(so.choice)
        size += sum(len(getattr(so, name) or "") for name in _CONSTRAINT_TEXTS)
        size += len(so.json) if isinstance(so.json, str) else _json_size(so.json)
    return size


def _strings_size(items: Any) -> int:
    """Characters of a list of strings, plus one per item; bounded work (see the module's doc)."""
    if not isinstance(items, (list, tuple)) or not items:
        return 0
    head = items[:INLINE_MAX_BYTES]
    read = sum(len(item) if isinstance(item, str) else 1 for item in head) + len(head)
    return read if len(head) == len(items) else read * len(items) // len(head)


def _json_size(value: Any) -> int:
    """Characters of a decoded JSON value, walked until they are known to reach
    ``INLINE_MAX_BYTES`` (at most that many values and keys, each counting one at least)."""
    size, budget, stack = 0, INLINE_MAX_BYTES, [value]
    while stack and budget > 0 and size < INLINE_MAX_BYTES:
        node = stack.pop()
        budget -= 1
        if isinstance(node, dict):
            entries = list(islice(node.items(), budget))
            budget -= len(entries)
            size += 2 + sum(len(key) + 3 if isinstance(key, str) else 4 for key, _ in entries)
            stack.extend(item for _, item in entries)
        elif isinstance(node, (list, tuple)):
            size += 2
            stack.extend(islice(node, budget))
        else:
            size += len(node) + 2 if isinstance(node, str) else 4
    return size
