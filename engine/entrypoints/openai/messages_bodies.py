"""The Anthropic Messages API's bodies (POST /v1/messages, /v1/messages/count_tokens), as msgspec
Structs that read as Anthropic's spec, with the fields vLLM adds (``chat_template_kwargs``).

The request is decoded as the chat request is (``http_bodies.decode_request``: a wrong type is a
400 naming the field; ``field_support`` places every field vLLM or Anthropic knows that the struct
does not declare). Content blocks stay loose dicts here and are read one by one by
serving_messages.py, so that a block ringllm cannot take is a 400 naming its place. The response,
the stream events and the errors carry their ``type`` as Anthropic sends it (msgspec tags).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import PositiveInt, Temperature, TopP

Blocks = list[dict[str, Any]]


class AnthropicMessage(Struct, kw_only=True):
    role: Literal["user", "assistant", "system"]  # "system": folded into the system prompt, as vLLM does
    content: Union[str, Blocks]


class AnthropicTool(Struct, kw_only=True):
    """A client tool; Anthropic's server tools (``type`` web_search_..., bash_...) are refused by name."""

    name: Annotated[str, Meta(min_length=1)]
    type: Optional[str] = None  # None or "custom"
    description: Optional[str] = None
    input_schema: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None
    cache_control: Optional[dict[str, Any]] = None  # a caching hint: ringllm's prefix cache needs none


class AnthropicToolChoice(Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None  # type "tool": the tool that must be called
    disable_parallel_tool_use: bool = False


class JsonOutputFormat(Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    format: Optional[JsonOutputFormat] = None
    effort: Optional[Literal["low", "medium", "high", "xhigh", "max"]] = None  # the template's reasoning_effort


class ConversationFields(Struct, kw_only=True):
    """What both routes read: the conversation and the tools it may call."""

    model: Annotated[str, Meta(min_length=1)]
    messages: list[AnthropicMessage]
    system: Union[str, Blocks, None] = None
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[AnthropicToolChoice] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # vLLM's


class AnthropicMessagesRequest(ConversationFields, kw_only=True):
    """POST /v1/messages. Fields known elsewhere and left out here are placed in field_support.py."""

    max_tokens: PositiveInt  # required, as Anthropic requires it
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[Annotated[int, Meta(ge=-1, le=(1 << 63) - 1)]] = None
    metadata: Optional[dict[str, Any]] = None  # Anthropic's user_id: informational, no effect on generation
    output_config: Optional[OutputConfig] = None


class AnthropicCountTokensRequest(ConversationFields, kw_only=True):
    """POST /v1/messages/count_tokens."""


class ContextManagement(Struct):
    original_input_tokens: int


class CountTokensResponse(Struct):
    input_tokens: int
    context_management: ContextManagement


# ---- the response ----


class TextContent(Struct, kw_only=True, tag_field="type", tag="text"):
    text: str


class ToolUseContent(Struct, kw_only=True, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class AnthropicUsage(Struct, kw_only=True):
    """vLLM's usage: the prompt's tokens (prefix-cached ones included) and the answer's."""

    input_tokens: int = 0
    output_tokens: int = 0


class MessageResponse(Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    model: str
    content: list[Union[TextContent, ToolUseContent]]
    role: str = "assistant"
    stop_reason: Optional[Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]] = None
    stop_sequence: Optional[str] = None
    usage: AnthropicUsage = msgspec.field(default_factory=AnthropicUsage)


# ---- stream events ----


class TextDelta(Struct, tag_field="type", tag="text_delta"):
    text: str


class InputJsonDelta(Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class StopDelta(Struct, kw_only=True):
    stop_reason: Optional[str] = None
    stop_sequence: Optional[str] = None


class MessageStart(Struct, tag_field="type", tag="message_start"):
    message: MessageResponse


class Ping(Struct, tag_field="type", tag="ping"):
    pass


class ContentBlockStart(Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: Union[TextContent, ToolUseContent]


class ContentBlockDelta(Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: Union[TextDelta, InputJsonDelta]


class ContentBlockStop(Struct, tag_field="type", tag="content_block_stop"):
    index: int


class MessageDelta(Struct, tag_field="type", tag="message_delta"):
    delta: StopDelta
    usage: AnthropicUsage


class MessageStop(Struct, tag_field="type", tag="message_stop"):
    pass


# ---- errors ----


class AnthropicErrorInfo(Struct):
    type: str
    message: str


class AnthropicError(Struct, tag_field="type", tag="error"):
    error: AnthropicErrorInfo


# Anthropic's error types by HTTP status (what its clients turn into their exception classes).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error(error: OpenAIError) -> AnthropicError:
    """``error`` in Anthropic's shape, which has no ``param``: the message names the field instead."""
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return AnthropicError(AnthropicErrorInfo(kind, message))
