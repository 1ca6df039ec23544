"""A chat completion's stream of chunks, retold as an Anthropic message and its stream events.

The Messages API is served on the chat machinery (serving_messages.py), so its whole answer and
its stream come from one place: ``MessageEvents`` reads the chat chunks (content deltas, tool-call
deltas, the finish reason and stop string, the running usage) and says each as Anthropic's events,
in Anthropic's order: ``message_start``, ``ping``; per content block ``content_block_start``,
``content_block_delta`` (``text_delta`` or ``input_json_delta``)..., ``content_block_stop``; then
``message_delta`` (stop reason and usage) and ``message_stop``. A non-streamed request drains the
same events and answers with ``message``, so the two cannot disagree.

The stop reason is vLLM's mapping of chat's finish reason (``stop`` -> ``end_turn``, ``length`` ->
``max_tokens``, ``tool_calls`` -> ``tool_use``), with Anthropic's two refinements: a matched stop
sequence is ``stop_sequence`` and names it, and an answer holding tool calls (as a named
``tool_choice`` forces) is ``tool_use``.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Union

import msgspec

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import ChatCompletionChunk
from engine.entrypoints.openai.messages_bodies import (
    AnthropicUsage,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    InputJsonDelta,
    MessageDelta,
    MessageResponse,
    MessageStart,
    MessageStop,
    Ping,
    StopDelta,
    TextContent,
    TextDelta,
    ToolUseContent,
    anthropic_error,
)
from engine.entrypoints.openai.serving_engine import SSEFraming

_encode = msgspec.json.Encoder().encode
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessageEvents:
    def __init__(self, message: MessageResponse) -> None:
        self.message = message
        self.current: Union[TextContent, ToolUseContent, None] = None
        self.arguments = ""  # the open tool_use block's input, as JSON text so far
        self.finish_reason: Optional[str] = None
        self.stop_reason: Any = None  # chat's: the matched stop string, or a stop token id

    def start(self, first: Optional[ChatCompletionChunk]) -> list:
        """``message_start`` (with the prompt's tokens, which the first chunk carries) and ``ping``,
        then what the first chunk says."""
        later = self.feed(first) if first is not None else []
        start = MessageStart(
            msgspec.structs.replace(self.message, content=[], usage=msgspec.structs.replace(self.message.usage))
        )
        return [start, Ping(), *later]

    def feed(self, chunk: ChatCompletionChunk) -> list:
        """The events one chat chunk says (none for the opening role chunk)."""
        if chunk.usage is not None:  # running usage (continuous_usage_stats), and the last chunk's
            self.message.usage = AnthropicUsage(
                input_tokens=chunk.usage.prompt_tokens, output_tokens=chunk.usage.completion_tokens
            )
        events: list = []
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                events += self._text(delta.content)
            for call in delta.tool_calls or ():
                if call.id is not None:  # a call's first delta: its id and whole name
                    events += self._open(ToolUseContent(id=call.id, name=call.function.name or "", input={}))
                piece = call.function.arguments if call.function is not None else None
                if piece and isinstance(self.current, ToolUseContent):
                    self.arguments += piece
                    events.append(ContentBlockDelta(self._index(), InputJsonDelta(piece)))
            if choice.finish_reason is not None:
                self.finish_reason, self.stop_reason = choice.finish_reason, choice.stop_reason
        return events

    def finish(self) -> list:
        """The closing events: the open block's stop, ``message_delta``, ``message_stop``."""
        events = self._close()
        message = self.message
        reason = _STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        if reason == "end_turn" and isinstance(self.stop_reason, str):
            reason, message.stop_sequence = "stop_sequence", self.stop_reason
        if reason != "max_tokens" and any(isinstance(block, ToolUseContent) for block in message.content):
            reason = "tool_use"
        message.stop_reason = reason
        delta = StopDelta(stop_reason=reason, stop_sequence=message.stop_sequence)
        return events + [MessageDelta(delta, msgspec.structs.replace(message.usage)), MessageStop()]

    # ---- content blocks ----

    def _index(self) -> int:
        return len(self.message.content) - 1

    def _open(self, block: Union[TextContent, ToolUseContent]) -> list:
        events = self._close()
        self.current = block
        self.message.content.append(block)
        return events + [ContentBlockStart(self._index(), msgspec.structs.replace(block))]

    def _text(self, piece: str) -> list:
        events = [] if isinstance(self.current, TextContent) else self._open(TextContent(text=""))
        self.current.text += piece
        return events + [ContentBlockDelta(self._index(), TextDelta(piece))]

    def _close(self) -> list:
        block, self.current = self.current, None
        if block is None:
            return []
        if isinstance(block, ToolUseContent):
            block.input, self.arguments = _input(self.arguments, block.name), ""
        return [ContentBlockStop(self.message.content.index(block))]


def _input(arguments: str, name: str) -> dict[str, Any]:
    """A call's arguments as its ``input`` object (the tool parsers hand over whole JSON objects)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise OpenAIError(
            500,
            f"the model's call of {name[:64]!r} has arguments that are not a JSON object",
            type="server_error",
            code="invalid_tool_call",
        )
    return value


class AnthropicFraming(SSEFraming):
    """Anthropic's SSE: each event as an ``event: <type>`` line and its ``data:`` line; an error
    as an ``error`` event; no end marker (``message_stop`` ends a stream)."""

    end = b""

    def event(self, event: Any) -> bytes:
        kind = type(event).__struct_config__.tag
        return b"event: " + kind.encode() + b"\ndata: " + _encode(event) + b"\n\n"

    def error(self, error: OpenAIError) -> bytes:
        return self.event(anthropic_error(error))
