"""Errors the entry points raise about the EngineCore, with vLLM's names.

They sit apart from the clients so a caller can catch them without importing the
transport, and so the OpenAI server can map them to HTTP status codes.
"""

from __future__ import annotations

from typing import Any, Optional

_ENGINE_DEAD = "EngineCore encountered an issue and is no longer running"


class ParameterError(ValueError):
    """A request parameter is out of range or of the wrong type (vLLM's VLLMValidationError).

    ``parameter`` names the offending field, so the OpenAI server can answer with it as the
    error's ``param`` without reading it back out of the message text.
    """

    def __init__(self, message: str, *, parameter: str, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class EngineDeadError(Exception):
    """The EngineCore process died or failed: every pending request fails with this and
    new ones are refused at once. Not recoverable; build a new engine.

    ``cause`` keeps everything the core reported (a traceback, with file paths) for the
    server log; the message carries only its last line, the exception itself, so the
    traceback never travels further than a log (an HTTP body, for one).
    """

    def __init__(self, cause: str = "", *, suppress_context: bool = False) -> None:
        super().__init__(self._message(_last_line(cause)))
        self.cause = cause
        self.__suppress_context__ = suppress_context

    @staticmethod
    def _message(summary: Optional[str]) -> str:
        return f"{_ENGINE_DEAD}: {summary}" if summary else _ENGINE_DEAD


class EngineShutdownError(EngineDeadError):
    """``shutdown()`` ended the engine: a call still running then (on another thread, or a
    task's ``generate``) and every later one raise this. An EngineDeadError, since the engine is
    as gone as a dead one (whoever catches that needs nothing new), but its message says what
    happened instead of reporting a failure."""

    RUNNING = "the engine was shut down while the request was running"

    def __init__(self, cause: str = "the engine was shut down") -> None:
        super().__init__(cause)

    @staticmethod
    def _message(summary: Optional[str]) -> str:
        return summary or ""


def _last_line(text: str) -> Optional[str]:
    """The last non-blank line of ``text``: for a Python traceback, ``Type: message``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


class EngineGenerateError(Exception):
    """One request failed (for example a bad input found late); the engine keeps serving."""


class EngineStepError(Exception):
    """One request failed because the engine step running it raised (a fault of the engine,
    not of the request: HTTP 500). The requests of that step fail with it; the engine keeps
    serving, and the core's log holds the traceback."""


class EngineStartupError(RuntimeError):
    """The EngineCore process could not start (bad model, out of memory, crash before
    READY); the message carries the cause reported by the core or its exit status."""
