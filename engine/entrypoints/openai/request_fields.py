"""vLLM's extra request fields as both generation endpoints answer them, in one place: the
request id (``request_id`` or the ``X-Request-Id`` header), tokens as ``token_id:{id}`` strings
(``return_tokens_as_token_ids``), and the prompt's logprobs in vLLM's shape (``prompt_logprobs``).
"""

from __future__ import annotations

import uuid
from typing import Optional

from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import MAX_REQUEST_ID_CHARS, PromptLogprobs
from engine.outputs import RequestOutput

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_KEY = web.RequestKey("ringllm_request_id", str)  # where the served id is kept on the request
_FROM_CLIENT_KEY = web.RequestKey("ringllm_request_id_from_client", bool)


def request_id(prefix: str, request: web.Request, body_request_id: Optional[str]) -> str:
    """The response id, as vLLM makes it: ``{prefix}-{X-Request-Id header, else the body's
    request_id, else a random uuid}``."""
    header = request.headers.get(REQUEST_ID_HEADER)
    if header is not None and len(header) > MAX_REQUEST_ID_CHARS:  # the body's request_id has the same bound
        raise OpenAIError(
            400,
            f"the {REQUEST_ID_HEADER} header is longer than {MAX_REQUEST_ID_CHARS} characters",
            param=REQUEST_ID_HEADER,
            code="invalid_value",
        )
    given = header or body_request_id
    base = given or uuid.uuid4().hex
    request[REQUEST_ID_KEY] = base  # for the X-Request-Id response header
    request[_FROM_CLIENT_KEY] = given is not None
    return f"{prefix}-{base}"


def engine_request_id(response_id: str, request: web.Request) -> str:
    """The id of its requests in the engine: the response id, made unique when the client chose
    it, since a client may send the same request_id twice at once (the engine refuses a
    duplicate id)."""
    return f"{response_id}-{uuid.uuid4().hex[:8]}" if request.get(_FROM_CLIENT_KEY) else response_id


def token_text(token_id: int, decoded: Optional[str], as_ids: Optional[bool]) -> str:
    """A logprob's token: ``token_id:{id}`` with return_tokens_as_token_ids (tokens that are
    not valid UTF-8 on their own stay identifiable), else its decoded text."""
    return f"token_id:{token_id}" if as_ids else (decoded or "")


def prompt_logprobs(output: RequestOutput, wanted: Optional[int]) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs`` of a finished output (its own rows), or None when they were not
    asked for."""
    return None if wanted is None else output.prompt_logprobs
