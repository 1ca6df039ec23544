"""The one error a grammar can raise, and how a backend's message is shortened for a client."""

from __future__ import annotations

import re

_MAX_MESSAGE = 300


class GrammarError(ValueError):
    """A constraint the backend cannot compile (invalid, unsupported, or too slow to compile).
    The message names ``structured_outputs`` and carries the backend's reason, shortened: the
    first few lines, at most a few hundred characters."""


# What native backends put in front of their reason: a time stamp, a source path and line, an
# assertion's text. None of it is for a client.
_NOISE = re.compile(
    r"\[\d{2}:\d{2}:\d{2}\]\s*|(?:/[\w.\-]+)+\.(?:cc|cpp|h|hpp|py|rs):\d+:\s*"
    r"|Check failed: \(.*?\) is false:\s*"
)


def shorten(message: str) -> str:
    lines = [_NOISE.sub("", line).rstrip() for line in str(message).strip().splitlines() if line.strip()]
    lines = [line for line in lines if line.strip()]
    text = " ".join(lines[:6]) if lines else "unknown error"
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."
