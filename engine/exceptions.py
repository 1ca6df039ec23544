"""Errors the entry points raise about the EngineCore, with vLLM's names.

They sit apart from the clients so a caller can catch them without importing the
transport, and so the OpenAI server can map them to HTTP status codes.
"""
from __future__ import annotations

_ENGINE_DEAD = "EngineCore encountered an issue and is no longer running"


class EngineDeadError(Exception):
    """The EngineCore process died or failed: every pending request fails with this and
    new ones are refused at once. Not recoverable; build a new engine."""

    def __init__(self, cause: str = "", *, suppress_context: bool = False) -> None:
        super().__init__(f"{_ENGINE_DEAD}: {cause}" if cause else _ENGINE_DEAD)
        self.cause = cause
        self.__suppress_context__ = suppress_context


class EngineGenerateError(Exception):
    """One request failed (for example a bad input found late); the engine keeps serving."""


class EngineStepError(Exception):
    """One request failed because the engine step running it raised (a fault of the engine,
    not of the request: HTTP 500). The requests of that step fail with it; the engine keeps
    serving, and the core's log holds the traceback."""


class EngineStartupError(RuntimeError):
    """The EngineCore process could not start (bad model, out of memory, crash before
    READY); the message carries the cause reported by the core or its exit status."""
