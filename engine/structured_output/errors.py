"""The one error a grammar can raise, and how a backend's message is shortened for a client."""
from __future__ import annotations

_MAX_MESSAGE = 300


class GrammarError(ValueError):
    """A constraint the backend cannot compile (invalid, unsupported, or too slow to compile).
    The message names ``structured_outputs`` and carries the backend's reason, shortened: the
    first few lines, at most a few hundred characters."""


def shorten(message: str) -> str:
    lines = [line.rstrip() for line in str(message).strip().splitlines() if line.strip()]
    text = " ".join(lines[:6]) if lines else "unknown error"
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE - 3] + "..."
