"""The Responses API (/v1/responses) and the operational routes (/ping, /reset_prefix_cache,
/server_info, /openapi.json) through a real ``ringllm serve`` on the tiny model, driven by the
``openai`` package (and raw HTTP where the wire itself is under test).

The tiny model writes gibberish: tool calls and JSON come from the constraints (``required`` and
named ``tool_choice``, ``text.format``), with free JSON whitespace off so it cannot pad forever.
What the conversion sends to the model is observed through ``/tokenize``: a responses request must
cost exactly the tokens of the chat conversation it stands for.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.helpers.openai_server_utils import (
    TINY_SERVE_ARGS,
    RemoteServer,
    constrained_tiny_server,
    parse_sse,
    wait_for,
)

API_KEY = "sk-responses"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_LIMIT = 64 << 10
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": CITY}
SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "boolean"}, "rank": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["capital", "rank"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with constrained_tiny_server(tiny_model_dir, API_KEY, BODY_LIMIT) as remote:
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def tokens(server, messages) -> int:
    status, body, _ = server.post_json("/tokenize", {"messages": messages}, AUTH)
    assert status == 200, body
    return body["count"]


def create(client, **kw):
    kw.setdefault("model", "tiny")
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_output_tokens", 8)
    return client.responses.create(**kw)


# ---- create ----


def test_string_and_item_input_with_instructions(server, client):
    plain = create(client, input="Hello there", instructions="Answer briefly.")
    assert plain.object == "response" and plain.id.startswith("resp_") and plain.model == "tiny"
    assert plain.instructions == "Answer briefly."
    assert plain.usage.input_tokens == tokens(
        server, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello there"}]
    )
    items = create(
        client,
        instructions="Answer briefly.",
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello "}, {"type": "input_text", "text": "there"}],
            }
        ],
    )
    assert items.usage.input_tokens == plain.usage.input_tokens
    assert items.output_text == plain.output_text  # greedy: the same prompt gives the same text
    bare = create(client, input="Hello there")
    assert bare.usage.input_tokens == tokens(server, [{"role": "user", "content": "Hello there"}])


def test_usage_and_max_output_tokens_make_an_incomplete_response(client):
    prompt = "Count the sheep jumping the fence " * 8  # several blocks of its own
    out = create(client, input=prompt, max_output_tokens=5, extra_body={"ignore_eos": True})
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 5
    assert out.usage.total_tokens == out.usage.input_tokens + 5
    assert out.usage.output_tokens_details.reasoning_tokens == 0
    again = create(client, input=prompt, max_output_tokens=5, extra_body={"ignore_eos": True})
    # the same prompt again: its own full blocks come from the prefix cache too
    assert out.usage.input_tokens_details.cached_tokens + 32 <= again.usage.input_tokens_details.cached_tokens


def test_seed_temperature_and_top_p_reach_the_sampler(client):
    greedy = (
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Go"}],
            max_tokens=12,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .message.content
    )
    kw = dict(input="Go", max_output_tokens=12, extra_body={"ignore_eos": True})
    assert create(client, **kw).output_text == greedy
    assert create(client, temperature=1.0, top_p=1e-9, **kw).output_text == greedy  # only the top token is left
    seeded = [
        create(client, temperature=1.0, **{**kw, "extra_body": {"ignore_eos": True, "seed": s}}).output_text
        for s in (7, 7, 8)
    ]
    assert seeded[0] == seeded[1] and seeded[0] != greedy and seeded[2] != seeded[0]


def test_function_tool_round_trip_with_function_call_output(server, client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = create(client, input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=64)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    jsonschema.validate(json.loads(calls[0].arguments), CITY)
    named = create(
        client,
        input=ask,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    )
    assert [item.type for item in named.output] == ["function_call"]
    single = create(
        client, input=ask, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_output_tokens=64
    )
    assert len([item for item in single.output if item.type == "function_call"]) == 1

    call = calls[0]
    history = [
        *ask,
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"},
    ]
    answer = create(client, input=history, tools=[WEATHER], max_output_tokens=8)  # auto: hermes reads the reply
    assert answer.status in ("completed", "incomplete")
    as_chat = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C and sunny"},
    ]
    assert answer.usage.input_tokens == tokens(server, as_chat)


def test_text_format_json_schema_gives_json_of_the_schema(client):
    out = create(
        client,
        input="A city?",
        max_output_tokens=100,
        text={"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}},
    )
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SCHEMA)
    obj = create(client, input="A city?", max_output_tokens=100, text={"format": {"type": "json_object"}})
    assert obj.output_text.startswith("{")


# ---- streams ----


def test_stream_events_in_order_and_deltas_join_to_the_text(server, client):
    whole = create(client, input="Tell me", max_output_tokens=10, extra_body={"ignore_eos": True})
    status, raw, headers = server.request(
        "POST",
        "/v1/responses",
        json.dumps(
            {
                "model": "tiny",
                "input": "Tell me",
                "max_output_tokens": 10,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = parse_sse(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert (
        kinds
        == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            *["response.output_text.delta"] * deltas,
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        and deltas >= 1
    )
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert text == events[-4]["text"] == final["output"][0]["content"][0]["text"] == whole.output_text
    assert final["usage"]["output_tokens"] == 10 and final["status"] == "incomplete"

    with client.responses.stream(
        model="tiny", input="Weather in Rome?", tools=[WEATHER], tool_choice="required", max_output_tokens=64
    ) as stream:
        seen = [event for event in stream]
        final = stream.get_final_response()
    pieces = "".join(e.delta for e in seen if e.type == "response.function_call_arguments.delta")
    done = [e for e in seen if e.type == "response.function_call_arguments.done"]
    calls = [item for item in final.output if item.type == "function_call"]
    assert done and pieces.startswith(done[0].arguments) and done[0].arguments == calls[0].arguments
    assert "response.output_item.added" in [e.type for e in seen]


# ---- stored responses ----


def test_retrieve_and_previous_response_id_continue_a_stored_conversation(server, client):
    first = create(client, input="My name is Ada.", metadata={"topic": "names"}, extra_body={"ignore_eos": True})
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.metadata == {"topic": "names"}
    second = create(client, input="What is my name?", previous_response_id=first.id, instructions="Be kind.")
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == tokens(
        server,
        [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    unstored = create(client, input="Forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_unknown_response_ids_are_404_in_openai_shape(server, client):
    for call in (
        lambda: client.responses.retrieve("resp_unknown"),
        lambda: client.responses.cancel("resp_unknown"),
        lambda: create(client, input="Hi", previous_response_id="resp_unknown"),
    ):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "response_not_found" and "resp_unknown" in err.value.body["message"]
    assert err.value.body["param"] == "previous_response_id"


def test_background_response_is_polled_and_cancelled(server, client):
    for _ in range(3):
        long = create(client, input="Go on", background=True, max_output_tokens=1500, extra_body={"ignore_eos": True})
        assert long.status == "queued" and long.background
        assert wait_for(lambda: client.responses.retrieve(long.id).status == "in_progress", 30)
        cancelled = client.responses.cancel(long.id)
        # the dummy model writes 1500 tokens in about a second: a test process stalled on a busy
        # host may send the cancel after the last one (the response is then "incomplete"): again
        if cancelled.status != "incomplete":
            break
    assert cancelled.status == "cancelled" and client.responses.retrieve(long.id).status == "cancelled"
    assert wait_for(lambda: server.unfinished_in_core() == 0, 30)  # its engine request was aborted

    short = create(client, input="Hi", background=True, max_output_tokens=4, extra_body={"ignore_eos": True})
    assert wait_for(lambda: client.responses.retrieve(short.id).status == "incomplete", 30)
    assert client.responses.retrieve(short.id).usage.output_tokens == 4
    with pytest.raises(openai.BadRequestError, match="already incomplete"):
        client.responses.cancel(short.id)
    sync = create(client, input="Hi")
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        client.responses.cancel(sync.id)
    with pytest.raises(openai.BadRequestError) as err:
        create(client, input="Hi", background=True, store=False)
    assert err.value.body["param"] == "background"


# ---- refusals and limits ----


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input.0"),
        ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]}, "input.0"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input.0"),
        ({"input": []}, "input"),
        ({"reasoning": {"summary": "auto"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
        ({"text": {"verbosity": "low"}}, "text"),
        ({"max_output_tokens": 1 << 20}, "max_output_tokens"),
        ({"temperature": 9}, "temperature"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"stream": True, "background": True}, "stream"),
    ],
)
def test_bad_input_is_400_naming_the_field(server, fields, param):
    status, body, _ = server.post_json("/v1/responses", {"model": "tiny", "input": "Hi", **fields}, AUTH)
    assert status == 400, body
    assert body["error"]["param"] == param and "Traceback" not in body["error"]["message"]


def test_an_oversize_body_is_413_and_the_key_is_required(server):
    status, body, _ = server.post_json("/v1/responses", {"input": "x" * BODY_LIMIT}, AUTH)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert server.post_json("/v1/responses", {"input": "Hi"})[0] == 401
    assert server.get("/v1/responses/resp_x")[0] == 401


def test_the_store_keeps_at_most_its_entries_for_at_most_its_age(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--responses-store-max-entries",
        "2",
        "--responses-store-max-age",
        "2",
    ) as remote:
        client = openai.OpenAI(base_url=remote.base_url, api_key="none", max_retries=0)
        ids = [create(client, input=f"Hi {i}", max_output_tokens=2).id for i in range(3)]
        with pytest.raises(openai.NotFoundError):  # the oldest made room
            client.responses.retrieve(ids[0])
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]

        def gone() -> bool:
            try:
                client.responses.retrieve(ids[2])
            except openai.NotFoundError:
                return True
            return False

        assert wait_for(gone, 30, interval=0.2)  # past its age

        running = create(
            client, input="Go on", background=True, max_output_tokens=1500, extra_body={"ignore_eos": True}
        )
        assert wait_for(lambda: client.responses.retrieve(running.id).status == "in_progress", 30)
        assert remote.stop() == 0  # the stop cancels it before the engine goes


# ---- the operational routes ----


def test_ping_reset_prefix_cache_server_info_and_openapi(server, client):
    for method in ("GET", "POST"):  # a probe: open without the key, as /health is
        assert server.request(method, "/ping", b"" if method == "POST" else None)[0] == 200

    prompt = [{"role": "user", "content": "A long shared prefix " * 20}]

    def cached() -> int:
        out = client.chat.completions.create(model="tiny", messages=prompt, max_tokens=1)
        return out.usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0
    assert server.request("POST", "/reset_prefix_cache", b"")[0] == 401
    assert server.request("POST", "/reset_prefix_cache", b"", AUTH)[0] == 200
    assert cached() == 0

    assert server.get("/server_info")[0] == 401
    status, raw, _ = server.get("/server_info", AUTH)
    info = json.loads(raw)
    assert status == 200 and info["model"]["served_model_name"] == "tiny" and info["model"]["max_model_len"] > 0
    assert info["server"]["api_key_required"] is True and info["server"]["responses_store"]["max_entries"] > 0
    assert API_KEY not in raw.decode() and "/tmp" not in raw.decode() and server.url not in raw.decode()

    status, raw, _ = server.get("/openapi.json", AUTH)
    spec = json.loads(raw)
    from engine.entrypoints.openai.server import ROUTES

    assert status == 200 and spec["openapi"].startswith("3.")
    assert {(r.method.lower(), r.path) for r in ROUTES} <= {(m, p) for p, ops in spec["paths"].items() for m in ops}
    body = spec["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/ResponsesRequest")
    assert "input" in spec["components"]["schemas"]["ResponsesRequest"]["properties"]


@pytest.mark.slow
def test_reset_prefix_cache_resets_every_data_parallel_rank(tiny_model_dir):
    """Sequential requests alternate between the two idle cores (ties rotate), so the 3rd and 4th
    of one prompt hit each core's cache; after the reset neither core may still hold it."""
    with RemoteServer(
        tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--data-parallel-size", "2"
    ) as remote:
        client = openai.OpenAI(base_url=remote.base_url, api_key="none", max_retries=0)
        prompt = [{"role": "user", "content": "A long shared prefix " * 20}]

        def cached() -> int:
            out = client.chat.completions.create(model="tiny", messages=prompt, max_tokens=1)
            return out.usage.prompt_tokens_details.cached_tokens

        assert [cached() > 0 for _ in range(4)] == [False, False, True, True]
        assert remote.request("POST", "/reset_prefix_cache", b"")[0] == 200
        assert [cached() for _ in range(2)] == [0, 0]
