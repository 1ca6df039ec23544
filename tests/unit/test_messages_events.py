"""messages_events.py on its own: chat chunks retold as Anthropic's events, and the framing of an
error that ends a stream after its first byte (a timeout, a dead engine, the server's stop), which
the HTTP tests cannot provoke without timing."""

from __future__ import annotations

import json

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import (
    ChatCompletionChunk,
    ChatStreamChoice,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    UsageInfo,
)
from engine.entrypoints.openai.messages_bodies import MessageResponse
from engine.entrypoints.openai.messages_events import AnthropicFraming, MessageEvents


def _chunk(delta: DeltaMessage, finish=None, stop=None, usage=None) -> ChatCompletionChunk:
    return ChatCompletionChunk("msg_1", 0, "tiny", [ChatStreamChoice(0, delta, None, finish, stop)], usage=usage)


def _frames(events) -> list[tuple[str, dict]]:
    framing = AnthropicFraming()
    out = []
    for event in events:
        kind, data = framing.event(event).decode().removesuffix("\n\n").split("\n")
        out.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_text_then_a_call_are_two_blocks_and_the_call_makes_tool_use():
    events = MessageEvents(MessageResponse(id="msg_1", model="tiny", content=[]))
    said = events.start(_chunk(DeltaMessage(role="assistant", content=""), usage=UsageInfo(7, 0, 7)))
    said += events.feed(_chunk(DeltaMessage(content="Let me look.")))
    said += events.feed(
        _chunk(
            DeltaMessage(
                tool_calls=[
                    DeltaToolCall(0, "call_1", "function", DeltaFunctionCall(name="get_weather", arguments='{"city": '))
                ]
            )
        )
    )
    said += events.feed(
        _chunk(
            DeltaMessage(tool_calls=[DeltaToolCall(0, function=DeltaFunctionCall(arguments='"Paris"}'))]),
            finish="stop",
            usage=UsageInfo(7, 9, 16),
        )
    )
    said += events.finish()
    frames = _frames(said)
    assert [kind for kind, _ in frames] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert frames[0][1]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert frames[5][1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}},
    }
    assert frames[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert frames[-2][1]["usage"] == {"input_tokens": 7, "output_tokens": 9}
    assert events.message.content[1].input == {"city": "Paris"} and events.message.stop_reason == "tool_use"


def test_a_matched_stop_string_is_stop_sequence_and_a_stop_token_is_end_turn():
    for stop, reason in (("END", "stop_sequence"), (2, "end_turn")):
        events = MessageEvents(MessageResponse(id="msg_1", model="tiny", content=[]))
        events.feed(_chunk(DeltaMessage(content="x"), finish="stop", stop=stop))
        events.finish()
        assert events.message.stop_reason == reason
        assert events.message.stop_sequence == (stop if reason == "stop_sequence" else None)


def test_an_error_after_the_first_byte_is_an_anthropic_error_event_without_done():
    framing = AnthropicFraming()
    raw = framing.error(
        OpenAIError(
            504, "the request took longer than the server's request timeout", type="server_error", code="timeout"
        )
    ).decode()
    kind, data = raw.removesuffix("\n\n").split("\n")
    assert kind == "event: error" and framing.end == b""
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "the request took longer than the server's request timeout"},
    }
