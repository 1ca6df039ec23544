"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through a real ``ringllm serve``
on the tiny model, driven by the ``anthropic`` package (and raw HTTP where the wire itself is under
test).

The tiny model writes gibberish: tool calls and JSON come from the constraints (a named
``tool_choice``, ``output_config.format``), with free JSON whitespace off so it cannot pad forever.
What the conversion sends to the model is observed through ``/tokenize``: a messages request must
cost exactly the tokens of the chat conversation it stands for.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from tests.helpers.openai_server_utils import constrained_tiny_server, parse_anthropic_sse

API_KEY = "sk-messages"
AUTH = {"x-api-key": API_KEY}
BODY_LIMIT = 64 << 10
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": CITY}
FORCED = {"type": "tool", "name": "get_weather"}
SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "boolean"}, "rank": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["capital", "rank"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
DEEP = json.loads("[" * 600 + "]" * 600)  # deeper than the chat template's helpers can recurse


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with constrained_tiny_server(tiny_model_dir, API_KEY, BODY_LIMIT) as remote:
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


def tokens(server, messages, add_generation_prompt: bool = True) -> int:
    status, body, _ = server.post_json(
        "/tokenize",
        {"messages": messages, "add_generation_prompt": add_generation_prompt},
        {"Authorization": f"Bearer {API_KEY}"},
    )
    assert status == 200, body
    return body["count"]


def create(client, extra_body=None, **kw):
    """Greedy unless told otherwise. The package (2.x) no longer offers the sampling fields the
    API still takes (temperature, top_p, top_k): they go in ``extra_body``."""
    kw.setdefault("model", "tiny")
    kw.setdefault("max_tokens", 8)
    kw.setdefault("messages", [{"role": "user", "content": "Hello there"}])
    sampling = {name: kw.pop(name) for name in ("temperature", "top_p", "top_k") if name in kw}
    return client.messages.create(**kw, extra_body={"temperature": 0.0, **sampling, **(extra_body or {})})


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


# ---- create ----


def test_create_with_system_reports_usage_as_tokenize_counts(server, client):
    out = create(client, system="Answer briefly.")
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_") and out.model == "tiny"
    assert [block.type for block in out.content] == ["text"] and out.content[0].text
    assert out.usage.input_tokens == tokens(
        server, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello there"}]
    )
    assert out.usage.output_tokens == 8 and out.stop_reason == "max_tokens" and out.stop_sequence is None
    blocks = create(
        client,
        system=[{"type": "text", "text": "Answer "}, {"type": "text", "text": "briefly."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}],
    )
    assert blocks.usage.input_tokens == out.usage.input_tokens and text_of(blocks) == text_of(out)
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"},
    ]
    assert create(client, messages=history).usage.input_tokens == tokens(server, history)


def test_max_tokens_and_stop_sequences_give_their_stop_reasons(client):
    whole = create(client, max_tokens=16)
    text = text_of(whole)  # the tiny model's greedy answer: newlines, one a token
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 16 and text == "\n" * 16
    cut = create(client, max_tokens=16, stop_sequences=["never-said", "\n\n"])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "\n\n"
    assert text_of(cut) == "" and cut.content == [] and cut.usage.output_tokens < 16


def test_temperature_top_p_and_top_k_reach_the_sampler(client):
    kw = dict(max_tokens=12)
    greedy = text_of(create(client, **kw))
    assert text_of(create(client, temperature=1.0, top_k=1, **kw)) == greedy  # only the top token is left
    assert text_of(create(client, temperature=1.0, top_p=1e-9, **kw)) == greedy
    assert any(text_of(create(client, temperature=1.0, **kw)) != greedy for _ in range(3))


def test_output_config_format_gives_json_of_the_schema(client):
    out = create(
        client, max_tokens=100, extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    )
    assert out.stop_reason == "end_turn"
    jsonschema.validate(json.loads(text_of(out)), SCHEMA)


def test_forced_tool_use_and_a_tool_result_round_trip(server, client):
    first = create(client, messages=ASK, tools=[WEATHER], tool_choice=FORCED, max_tokens=64)
    uses = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"]
    assert isinstance(uses[0].input, dict)
    jsonschema.validate(uses[0].input, CITY)
    one = create(
        client,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=64,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert one.stop_reason == "tool_use" and [b.type for b in one.content].count("tool_use") == 1

    use = uses[0]
    history = [
        *ASK,
        {"role": "assistant", "content": [use.model_dump()]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "18 C and sunny"}]}
            ],
        },
    ]
    answer = create(client, messages=history, tools=[WEATHER])  # auto: hermes reads the reply
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    as_chat = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "18 C and sunny"},
    ]
    status, chat, _ = server.post_json(
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": as_chat,
            "max_tokens": 1,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": CITY},
                }
            ],
        },
        {"Authorization": f"Bearer {API_KEY}"},
    )
    assert status == 200, chat
    assert answer.usage.input_tokens == chat["usage"]["prompt_tokens"]
    counted = client.messages.count_tokens(model="tiny", messages=history, tools=[WEATHER])
    assert counted.input_tokens == answer.usage.input_tokens
    none = create(client, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"})
    assert [b.type for b in none.content] == ["text"] and none.stop_reason == "max_tokens"


def test_count_tokens_counts_the_conversation_and_its_template_kwargs(server, client):
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"},
    ]
    counted = client.messages.count_tokens(model="tiny", system="Be kind.", messages=history)
    as_chat = [{"role": "system", "content": "Be kind."}, *history]
    assert counted.input_tokens == tokens(server, as_chat)
    bare = client.messages.count_tokens(
        model="tiny",
        system="Be kind.",
        messages=history,
        extra_body={"chat_template_kwargs": {"add_generation_prompt": False}},
    )
    assert bare.input_tokens == tokens(server, as_chat, add_generation_prompt=False) < counted.input_tokens


# ---- streams ----


def test_stream_events_in_order_and_deltas_join_to_the_message(server, client):
    whole = create(client, max_tokens=10)
    status, raw, headers = server.request(
        "POST",
        "/v1/messages",
        json.dumps(
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 10,
                "temperature": 0.0,
                "stream": True,
            }
        ).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [(e["type"], e) for e in parse_anthropic_sse(raw)]
    kinds = [kind for kind, _ in events]
    deltas = kinds.count("content_block_delta")
    assert (
        kinds
        == [
            "message_start",
            "ping",
            "content_block_start",
            *["content_block_delta"] * deltas,
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        and deltas >= 1
    )
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    assert "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta") == text_of(whole)
    end = events[-2][1]
    assert end["delta"]["stop_reason"] == "max_tokens" and end["usage"]["output_tokens"] == 10

    with client.messages.stream(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice=FORCED, max_tokens=64, extra_body={"temperature": 0.0}
    ) as stream:
        seen = list(stream)
        final = stream.get_final_message()
    pieces = "".join(
        e.delta.partial_json for e in seen if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    uses = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and uses and json.loads(pieces) == uses[0].input
    jsonschema.validate(uses[0].input, CITY)


# ---- refusals and auth ----


@pytest.mark.parametrize(
    "fields,param",
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                        ],
                    }
                ]
            },
            "messages.0.content.0",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
                        ],
                    }
                ]
            },
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{"x": 1}]}]}]},
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages.0.content.0",
        ),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ({"messages": []}, "messages"),
        ({"system": [{"type": "image", "source": {}}]}, "system.0"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"container": "container_1"}, "container"),
        ({"mcp_servers": [{"type": "url", "url": "https://example.com/mcp", "name": "x"}]}, "mcp_servers"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        (
            {
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": DEEP}}],
                    },
                ]
            },
            "messages",
        ),
        (
            {
                "output_config": {
                    "format": {
                        "type": "json_schema",
                        "schema": {"type": "object", "properties": {"a": json.loads('{"x": ' * 900 + "1" + "}" * 900)}},
                    }
                }
            },
            "output_config",
        ),
        ({"max_tokens": 1 << 20}, "max_tokens"),
        ({"max_tokens": None}, "max_tokens"),
        ({"temperature": 9}, "temperature"),
    ],
)
def test_bad_input_is_400_in_anthropic_shape_naming_the_field(server, fields, param):
    payload = {"model": "tiny", "max_tokens": 4, "messages": ASK, **fields}
    payload = {k: v for k, v in payload.items() if v is not None}
    status, body, _ = server.post_json("/v1/messages", payload, AUTH)
    assert status == 400, body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert param in body["error"]["message"] and "Traceback" not in body["error"]["message"]


def test_the_client_raises_bad_request_and_not_found(client):
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        create(client, thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.NotFoundError, match="model"):
        create(client, model="claude-nope")


def test_the_key_is_taken_as_x_api_key_or_bearer_and_required(server):
    payload = {"model": "tiny", "max_tokens": 2, "messages": ASK}
    status, body, _ = server.post_json("/v1/messages", payload)
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert server.post_json("/v1/messages", payload, {"x-api-key": "wrong"})[0] == 401
    assert server.post_json("/v1/messages/count_tokens", {"model": "tiny", "messages": ASK})[0] == 401
    assert server.post_json("/v1/messages", payload, {"Authorization": f"Bearer {API_KEY}"})[0] == 200
    assert server.post_json("/v1/messages", payload, AUTH)[0] == 200
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(**payload)


def test_an_oversize_body_and_an_unknown_route_method_answer_in_anthropic_shape(server):
    status, body, _ = server.post_json(
        "/v1/messages",
        {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]},
        AUTH,
    )
    assert status == 413 and body["type"] == "error" and body["error"]["type"] == "request_too_large"
    status, raw, _ = server.get("/v1/messages", AUTH)
    assert status == 405 and json.loads(raw)["type"] == "error"
