"""The error every OpenAI-compatible route answers with, and its body in OpenAI's shape.

A leaf module (it imports nothing of the engine): the request bodies, the field checks, the
structured-output and tool-call readers all raise it, and none of them may import another
just to reach the error type (that is how import circles start).
"""

from __future__ import annotations

from typing import Optional

from msgspec import Struct


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorInfo(self.message, self.type, self.param, self.code))


class ErrorInfo(Struct):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorResponse(Struct):
    error: ErrorInfo
