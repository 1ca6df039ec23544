"""What an error body may say: the rules every HTTP error passes on its way out.

Error texts often come from Python itself (a TypeError names the function it was raised in,
module and class included: ``engine.frontend.tokenizer.FastTokenizer.apply_chat_template() got
multiple values for keyword argument 'tools'``) or from a library. A client should read what
was wrong with its request, never how the server is built, so ``public_message`` reduces any
qualified name to its last part and names no exception type; the full text stays in the log.
"""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, DecompressSizeError, HttpProcessingError

from engine.entrypoints.openai.errors import OpenAIError

# A dotted name: "pkg.module.Class.method()" or "engine.x.Y" (our own packages, whose paths no
# client needs); the last part (what the client may know of: a function or parameter) stays.
_QUALIFIED_CALL = re.compile(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*\(\))")
_OUR_QUALIFIED_NAME = re.compile(r"\b(?:engine|shm_transport)(?:\.[A-Za-z_]\w*)*\.([A-Za-z_]\w*)\b")
_CLASS_REPR = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>")


def public_message(text: str) -> str:
    """``text`` without module paths or class qualifiers (see the module docstring)."""
    text = _CLASS_REPR.sub(r"\1", text)
    text = _QUALIFIED_CALL.sub(r"\1", text)
    return _OUR_QUALIFIED_NAME.sub(r"\1", text)


def public_error(error: OpenAIError) -> OpenAIError:
    """``error`` as a client may see it; an internal error says only that it was one."""
    if error.code == "internal_error":
        message = "internal server error; see the server log"
    else:
        message = public_message(error.message)
    if message == error.message:
        return error
    return OpenAIError(
        error.status, message, type=error.type, param=error.param, code=error.code, headers=error.headers
    )


def payload_error(exc: web.RequestPayloadError) -> OpenAIError:
    """A body aiohttp could not decode (bad gzip/deflate data, a broken chunked encoding, a
    length it does not have) is the client's fault: a 400 that says which."""
    cause = exc.__cause__
    if isinstance(cause, DecompressSizeError):
        problem = "it decompresses to more than the server accepts"
    elif isinstance(cause, ContentEncodingError):
        problem = "it is not valid data of its Content-Encoding"
    elif isinstance(cause, HttpProcessingError) and cause.message:
        problem = cause.message.strip().rstrip(".")
    else:
        problem = "it is malformed"
    return OpenAIError(
        400, f"the request body could not be read: {problem}", code="invalid_body", headers={"Connection": "close"}
    )
