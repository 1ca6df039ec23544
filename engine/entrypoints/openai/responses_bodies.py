"""The Responses API's bodies (POST /v1/responses), as msgspec Structs that read as OpenAI's spec.

The request is decoded as the chat request is (``http_bodies.decode_request``: a wrong type is a
400 naming the field, ``field_support`` places every vLLM field the struct does not declare).
``input`` items stay loose dicts here and are read one by one into chat messages by
serving_responses.py, so that an item of a kind ringllm cannot take is a 400 naming its index.
The response and its stream events carry their ``type`` as msgspec tags.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from engine.entrypoints.openai.http_bodies import (
    MAX_REQUEST_ID_CHARS,
    Int64,
    PositiveInt,
    ReasoningEffort,
    Temperature,
    TopP,
)


class FunctionTool(Struct, kw_only=True):
    """A Responses function tool: the chat tool's ``function`` fields, flat."""

    type: str  # "function"; any other kind (web_search, file_search, mcp...) is refused by name
    name: Optional[Annotated[str, Meta(min_length=1)]] = None
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class TextFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Optional[str] = None
    schema: Optional[dict[str, Any]] = None
    description: Optional[str] = None
    strict: Optional[bool] = None


class TextConfig(Struct, kw_only=True):
    format: Optional[TextFormat] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None  # only "medium" (the default) is honoured


class NamedFunctionChoice(Struct, kw_only=True):
    type: str  # "function"; a built-in tool's choice is refused
    name: Optional[str] = None


class ReasoningConfig(Struct, kw_only=True):
    effort: Optional[ReasoningEffort] = None  # the chat template's reasoning_effort, as vLLM passes it
    summary: Optional[str] = None  # no summary is written here: a value that asks for one is a 400


class ResponsesRequest(Struct, kw_only=True):
    """POST /v1/responses. Fields vLLM knows and this struct leaves out are placed in field_support.py."""

    input: Union[str, list[dict[str, Any]]]
    model: Optional[str] = None
    instructions: Optional[str] = None  # a system message before the input (not carried to the next turn)
    max_output_tokens: Optional[PositiveInt] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedFunctionChoice, None] = None
    parallel_tool_calls: bool = True
    text: Optional[TextConfig] = None
    stream: bool = False
    store: bool = True  # OpenAI's and vLLM's default: kept for previous_response_id and GET, within the bounds
    previous_response_id: Optional[Annotated[str, Meta(min_length=1, max_length=MAX_REQUEST_ID_CHARS)]] = None
    background: bool = False  # answered at once (status "queued"); GET polls it, /cancel ends it
    # OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512
    metadata: Optional[
        Annotated[dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]], Meta(max_length=16)]
    ] = None
    user: Optional[str] = None
    # vLLM's extras
    ignore_eos: bool = False
    seed: Optional[Int64] = None
    logit_bias: Optional[dict[str, float]] = None  # as chat's
    reasoning: Optional[ReasoningConfig] = None


# ---- the response ----


class OutputText(Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = []


class OutputMessage(Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: str  # in_progress, completed, incomplete
    content: list[OutputText]
    role: str = "assistant"


class FunctionCallItem(Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str  # what a later function_call_output names
    name: str
    arguments: str  # a JSON object, as text
    status: str


class ReasoningText(Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str


class ReasoningItem(Struct, kw_only=True, tag_field="type", tag="reasoning"):
    """The reply's thinking (``--reasoning-parser``), as vLLM answers it: the text in ``content``,
    no ``summary``."""

    id: str
    status: str
    summary: list[Any] = []
    content: list[ReasoningText] = []


OutputItem = Union[OutputMessage, FunctionCallItem, ReasoningItem]


class InputTokensDetails(Struct):
    cached_tokens: int = 0


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0  # not counted (the reasoning is split from the text, not the tokens)


class ResponseUsage(Struct, kw_only=True):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class IncompleteDetails(Struct):
    reason: str  # max_output_tokens


class ResponseError(Struct):
    code: str
    message: str


class ResponseObject(Struct, kw_only=True):
    """The response, as created, polled (GET) and stored; the request's settings echoed back."""

    id: str
    created_at: int
    model: str
    status: str  # queued, in_progress, completed, incomplete, cancelled, failed
    object: str = "response"
    output: list[OutputItem] = []
    usage: Optional[ResponseUsage] = None
    error: Optional[ResponseError] = None
    incomplete_details: Optional[IncompleteDetails] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    metadata: Optional[dict[str, str]] = None
    parallel_tool_calls: bool = True
    previous_response_id: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    tool_choice: Any = "auto"
    tools: list[Any] = []
    text: Any = None
    store: bool = True
    background: bool = False
    truncation: str = "disabled"


# ---- stream events: each with its type (the tag) and sequence_number ----


def _event(name: str, tag: str, fields: list) -> type[Struct]:
    return msgspec.defstruct(
        name, [("sequence_number", int), *fields], tag_field="type", tag=tag, kw_only=True, module=__name__
    )


_RESPONSE = [("response", ResponseObject)]
_ITEM = [("output_index", int), ("item", OutputItem)]
_PART = [("item_id", str), ("output_index", int), ("content_index", int), ("part", Union[OutputText, ReasoningText])]
_TEXT_AT = [("item_id", str), ("output_index", int), ("content_index", int)]
_CALL_AT = [("item_id", str), ("output_index", int)]

ResponseCreated = _event("ResponseCreated", "response.created", _RESPONSE)
ResponseInProgress = _event("ResponseInProgress", "response.in_progress", _RESPONSE)
ResponseCompleted = _event("ResponseCompleted", "response.completed", _RESPONSE)
OutputItemAdded = _event("OutputItemAdded", "response.output_item.added", _ITEM)
OutputItemDone = _event("OutputItemDone", "response.output_item.done", _ITEM)
ContentPartAdded = _event("ContentPartAdded", "response.content_part.added", _PART)
ContentPartDone = _event("ContentPartDone", "response.content_part.done", _PART)
OutputTextDelta = _event(
    "OutputTextDelta", "response.output_text.delta", [*_TEXT_AT, ("delta", str), ("logprobs", list, [])]
)
OutputTextDone = _event(
    "OutputTextDone", "response.output_text.done", [*_TEXT_AT, ("text", str), ("logprobs", list, [])]
)
ReasoningTextDelta = _event("ReasoningTextDelta", "response.reasoning_text.delta", [*_TEXT_AT, ("delta", str)])
ReasoningTextDone = _event("ReasoningTextDone", "response.reasoning_text.done", [*_TEXT_AT, ("text", str)])
ArgumentsDelta = _event("ArgumentsDelta", "response.function_call_arguments.delta", [*_CALL_AT, ("delta", str)])
ArgumentsDone = _event(
    "ArgumentsDone", "response.function_call_arguments.done", [*_CALL_AT, ("name", str), ("arguments", str)]
)
