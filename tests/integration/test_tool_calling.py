"""Tool calling through a real ``ringllm serve``, with the ``openai`` client.

On the tiny random model: vLLM's refusals (400 naming the field), the start-up checks of the
tool flags, tool definitions and a tool-call history reaching the chat template, and the auto
path end to end through a parser a ``--tool-parser-plugin`` file registers. On the default model
(``model``): ``required`` and named choices, streamed and not, are well-formed calls of the
given schema because the constraint makes them so; ``auto`` with the hermes parser answers in
one of its two shapes; and a conversation goes on after a tool's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import jsonschema
import openai
import pytest
from tests.helpers.openai_server_utils import RINGLLM, TINY_SERVE_ARGS, RemoteServer
from tokenizers import Tokenizer

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER_PARAMS},
}
TIME_PARAMS = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time in a timezone", "parameters": TIME_PARAMS},
}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]

# A template that shows what reaches it: the tools, each call of an assistant message (its
# arguments as a dict) and the call a tool message answers.
TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.id }} {{ c.function.name }} city={{ c.function.arguments.city }}]"
    "{% endfor %}{% if m.tool_call_id %}[answers {{ m.tool_call_id }}]{% endif %}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
]
HISTORY_TEXT = (
    "TOOLS:get_weather;get_time;<user>What is the weather in Paris right now?|"
    "<assistant>[call call_1 get_weather city=Paris]|<tool>18 C and sunny[answers call_1]|<assistant>"
)

ECHO_PLUGIN = textwrap.dedent('''
    """A test parser: every reply is one call of `echo` with the reply as its `text`."""
    import json

    from engine.entrypoints.openai.tool_parsers import ParsedCall, ParsedReply, ToolParser, ToolParserManager


    @ToolParserManager.register_module("echo_all")
    class EchoAllParser(ToolParser):
        def parse(self, text, final):
            arguments = json.dumps({"text": text}, ensure_ascii=False)
            return ParsedReply("", [ParsedCall("echo", arguments if final else arguments[:-2], final)])
''')


@pytest.fixture(scope="module")
def tools_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with TOOLS_TEMPLATE as its chat template."""
    path = tmp_path_factory.mktemp("tools-model")
    for name in os.listdir(tiny_model_dir):
        with open(os.path.join(tiny_model_dir, name), "rb") as src, open(path / name, "wb") as dst:
            dst.write(src.read())
    (path / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "echo_parser.py"
    path.write_text(ECHO_PLUGIN)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tools_model_dir, plugin_file):
    """The tiny model; auto tool choice through the plugin's parser."""
    with RemoteServer(
        tools_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--tool-parser-plugin",
        plugin_file,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "echo_all",
    ) as remote:
        yield openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0), tools_model_dir


@pytest.fixture(scope="module")
def tiny_plain(tiny_model_dir):
    """The tiny model without --enable-auto-tool-choice."""
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as remote:
        yield openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0)


def bad_request(call) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    "kwargs,param,message",
    [
        ({"tool_choice": "required"}, "tool_choice", "When using `tool_choice`, `tools` must be set"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "tool_choice",
            "does not match any of the specified `tools`",
        ),
        ({"tools": [WEATHER]}, "tool_choice", '"auto" tool choice requires --enable-auto-tool-choice'),
        ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice", "--tool-call-parser"),
        ({"tools": []}, "tools", "must not be an empty array"),
        (
            {"tools": [{"type": "function", "function": {"description": "no name"}}], "tool_choice": "required"},
            "tools",
            "name",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
                "tool_choice": "required",
            },
            "tools",
            'type "object"',
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", ""),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"a": json.loads('{"x": ' * 900 + "1" + "}" * 900)},
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
            "nested deeper than",
        ),
    ],
)
def test_tool_requests_vllm_refuses_get_400_naming_the_field(tiny_plain, kwargs, param, message):
    error = bad_request(lambda: tiny_plain.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, **kwargs))
    assert error.body["param"] == param and message in error.body["message"]
    assert "Traceback" not in error.body["message"] and "/" not in error.body["message"].replace("--", "")


def test_tools_and_a_tool_call_history_reach_the_chat_template(tiny):
    client, model_dir = tiny
    out = client.chat.completions.create(
        model="tiny", messages=HISTORY, tools=[WEATHER, TIME], tool_choice="none", max_tokens=2, temperature=0.0
    )
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    assert out.usage.prompt_tokens == len(tokenizer.encode(HISTORY_TEXT, add_special_tokens=False).ids)
    assert out.choices[0].message.tool_calls is None  # tool_choice "none": content only


@pytest.mark.parametrize(
    "arguments",
    ["{city: Paris", '{"city": ' + "[" * 5000 + "]" * 5000 + "}", '{"city": ' + "[" * 600 + "]" * 600 + "}"],
)  # JSON, nested too deep
def test_tool_call_arguments_that_are_not_json_are_refused(tiny, arguments):
    client, _ = tiny
    history = json.loads(json.dumps(HISTORY))
    history[1]["tool_calls"][0]["function"]["arguments"] = arguments
    error = bad_request(lambda: client.chat.completions.create(model="tiny", messages=history, max_tokens=2))
    assert error.body["param"] == "messages.1.tool_calls" and "call_1" in error.body["message"]


def test_auto_reads_calls_with_the_plugin_parser(tiny):
    client, _ = tiny
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=6, temperature=0.0)
    (call,) = out.choices[0].message.tool_calls
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function" and call.function.name == "echo"
    assert isinstance(json.loads(call.function.arguments)["text"], str) and out.choices[0].message.content is None
    assert out.choices[0].finish_reason == "length"  # only a reply that stops becomes "tool_calls"
    streamed = collect(
        client.chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER], max_tokens=6, temperature=0.0, stream=True
        )
    )
    ((name, arguments),) = streamed["calls"]
    assert name == "echo" and isinstance(json.loads(arguments)["text"], str)


def test_streamed_tool_calls_carry_running_usage_and_token_ids(tiny):
    client, _ = tiny
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER],
            max_tokens=6,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"return_token_ids": True},
        )
    )
    deltas = [c for c in chunks[1:] if c.choices]  # after the role chunk
    assert deltas and all(c.usage is not None for c in deltas)
    assert [c.usage.completion_tokens for c in deltas] == sorted(c.usage.completion_tokens for c in deltas)
    token_ids = [t for c in deltas for t in (c.choices[0].model_extra.get("token_ids") or ())]
    assert len(token_ids) == chunks[-1].usage.completion_tokens == 6


# ---- the hermes parser on forced text: a reply cut inside a call, a call nested too deep ----


@pytest.fixture(scope="module")
def tiny_hermes(tiny_model_dir, tmp_path_factory):
    """The tiny model with the hermes parser; no prefix cache, so a second request computes the
    same tokens as the first (the forced text has more than one tokenization to choose from)."""
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--no-enable-prefix-caching",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        log=log,
    ) as remote:
        yield openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0), log


def forced(client, text: str, **kwargs):
    """A chat reply forced to ``text`` (a structured-outputs choice of one) with auto tool choice."""
    return client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[WEATHER],
        temperature=0.0,
        extra_body={"structured_outputs": {"choice": [text]}},
        **kwargs,
    )


def test_a_reply_cut_inside_a_call_is_the_same_streamed_and_not(tiny_hermes):
    client, _ = tiny_hermes
    full = json.dumps({"city": "Paris " * 40, "unit": "celsius"})
    text = '<tool_call>{"name": "get_weather", "arguments": ' + full + "}</tool_call>"
    # 60 tokens: past the 58 characters before the city's text, short of the ~80 tokens of the
    # whole text at best, whichever tokenization the random model takes
    whole = forced(client, text, max_tokens=60).choices[0]
    ((name, arguments),) = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert whole.finish_reason == "length" and whole.message.content is None
    assert name == "get_weather" and full.startswith(arguments) and len('{"city": "') < len(arguments) < len(full)
    streamed = collect(forced(client, text, max_tokens=60, stream=True))
    assert streamed["finish"] == "length" and streamed["content"] == ""
    assert streamed["calls"] == [(name, arguments)]


def test_a_call_nested_too_deep_is_content_streamed_and_not(tiny_hermes):
    client, log = tiny_hermes
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": ' + "[" * 600 + "]" * 600 + "}}</tool_call>"
    whole = forced(client, text, max_tokens=1000).choices[0]
    assert whole.message.content == text and not whole.message.tool_calls and whole.finish_reason == "stop"
    streamed = collect(forced(client, text, max_tokens=1000, stream=True))
    assert streamed["content"] == text and streamed["finish"] == "stop"
    with open(log) as f:
        assert "Traceback" not in f.read()


@pytest.mark.slow
def test_tool_flags_are_checked_at_start(tiny_model_dir):
    cases = [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
        (["--tool-call-parser", "nope"], "invalid tool call parser: nope (choose from hermes"),
        (["--tool-parser-plugin", "/nonexistent/parser.py"], "no such file"),
    ]
    for flags, message in cases:
        done = subprocess.run(
            [*RINGLLM, "serve", tiny_model_dir, *TINY_SERVE_ARGS, *flags], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


# ---- the default model ----


def collect(stream) -> dict:
    """A streamed reply as the openai client sees it: its chunks checked for OpenAI's tool-call
    shape (each call opened once with index, id, type and name; then argument pieces)."""
    content, calls, ids, finish = "", {}, {}, []
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or ():
                if call.index not in calls:
                    assert call.id and call.type == "function" and call.function.name
                    calls[call.index], ids[call.index] = [call.function.name, ""], call.id
                else:
                    assert call.id is None and call.function.name is None
                calls[call.index][1] += call.function.arguments or ""
            if choice.finish_reason is not None:
                finish.append(choice.finish_reason)
    assert len(finish) == 1, "one finish_reason, in the last chunk"
    return {
        "content": content,
        "calls": [tuple(calls[i]) for i in sorted(calls)],
        "finish": finish[0],
        "ids": list(ids.values()),
    }


def check_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.fixture(scope="module")
def model():
    with RemoteServer("--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as remote:
        client = openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0)
        yield client, client.models.list().data[0].id


@pytest.mark.model
def test_required_gives_calls_of_the_tools_streamed_and_not(model):
    client, name = model
    kwargs = dict(
        model=name, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0.0, max_tokens=300
    )
    out = client.chat.completions.create(**kwargs).choices[0]
    assert out.finish_reason == "tool_calls" and out.message.content is None and out.message.tool_calls
    for call in out.message.tool_calls:
        assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
        check_call(call.function.name, call.function.arguments)
    # (Streamed and whole replies are compared on canned text in test_tool_parsers.py: here a
    # second request may hit the prefix cache, whose numerics can flip a close greedy choice.)
    streamed = collect(client.chat.completions.create(**kwargs, stream=True))
    assert streamed["finish"] == "tool_calls" and streamed["content"] == "" and streamed["calls"]
    for call_name, arguments in streamed["calls"]:
        check_call(call_name, arguments)
    assert all(i.startswith("chatcmpl-tool-") for i in streamed["ids"])


@pytest.mark.model
def test_parallel_tool_calls_false_gives_one_call(model):
    client, name = model
    out = client.chat.completions.create(
        model=name,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.0,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Paris and the time in Tokyo?"}],
    ).choices[0]
    (call,) = out.message.tool_calls
    check_call(call.function.name, call.function.arguments)


@pytest.mark.model
def test_named_choice_calls_that_function_streamed_and_not(model):
    client, name = model
    kwargs = dict(
        model=name,
        messages=ASK,
        tools=[WEATHER, TIME],
        temperature=0.0,
        max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    out = client.chat.completions.create(**kwargs).choices[0]
    (call,) = out.message.tool_calls
    assert call.function.name == "get_time" and out.finish_reason == "stop"  # vLLM's and OpenAI's for a named call
    check_call("get_time", call.function.arguments)
    streamed = collect(client.chat.completions.create(**kwargs, stream=True))
    ((call_name, arguments),) = streamed["calls"]
    assert call_name == "get_time" and streamed["finish"] == "stop" and streamed["content"] == ""
    check_call("get_time", arguments)


@pytest.mark.model
def test_auto_with_hermes_answers_in_one_of_its_shapes(model):
    client, name = model
    kwargs = dict(model=name, messages=ASK, tools=[WEATHER], temperature=0.0, max_tokens=60)
    out = client.chat.completions.create(**kwargs).choices[0]
    if out.message.tool_calls:
        assert out.finish_reason in ("tool_calls", "length")
        for call in out.message.tool_calls if out.finish_reason == "tool_calls" else ():  # a cut call: a prefix
            json.loads(call.function.arguments)
    else:  # plain content: the whole reply, without the parser's markers or the end-of-turn token
        assert out.message.content and "<|im_end|>" not in out.message.content
        assert "<tool_call>" not in out.message.content and out.finish_reason in ("stop", "length")
    streamed = collect(client.chat.completions.create(**kwargs, stream=True))
    for _, arguments in streamed["calls"] if streamed["finish"] == "tool_calls" else ():
        json.loads(arguments)
    if not streamed["calls"]:
        assert streamed["content"] and "<|im_end|>" not in streamed["content"]
        assert streamed["finish"] in ("stop", "length")


@pytest.mark.model
def test_conversation_goes_on_after_a_tool_result(model):
    client, name = model
    out = client.chat.completions.create(
        model=name, messages=HISTORY, tools=[WEATHER], tool_choice="none", temperature=0.0, max_tokens=40
    ).choices[0]
    assert out.message.content and out.message.tool_calls is None


REPORT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
REPORT_FORMAT = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}


@pytest.mark.model
def test_a_forced_call_takes_the_place_of_a_response_format(model):
    """vLLM's rule, and what the Agents SDK sends for a required tool with an output type:
    before, ``You can only either use constraints for structured outputs or tools, not both``."""
    client, name = model
    kwargs = dict(
        model=name, messages=ASK, tools=[WEATHER, TIME], temperature=0.0, max_tokens=200, response_format=REPORT_FORMAT
    )
    out = client.chat.completions.create(**kwargs, tool_choice="required").choices[0]
    assert out.finish_reason == "tool_calls" and out.message.content is None and out.message.tool_calls
    for call in out.message.tool_calls:
        check_call(call.function.name, call.function.arguments)
    streamed = collect(client.chat.completions.create(**kwargs, tool_choice="required", stream=True))
    assert streamed["finish"] == "tool_calls" and streamed["calls"]
    named = client.chat.completions.create(**kwargs, tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    check_call("get_time", call.function.arguments)


@pytest.mark.model
@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_auto_and_none_answer_in_the_response_format(model, tool_choice):
    """The format shapes the reply in text, as in vLLM: JSON content by the schema, no call."""
    client, name = model
    out = client.chat.completions.create(
        model=name,
        messages=ASK,
        tools=[WEATHER],
        tool_choice=tool_choice,
        temperature=0.0,
        max_tokens=200,
        response_format=REPORT_FORMAT,
    ).choices[0]
    assert not out.message.tool_calls and out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.message.content), REPORT)


def test_a_second_constraint_beside_a_forced_call_is_a_400_naming_both(tiny_plain):
    error = bad_request(
        lambda: tiny_plain.chat.completions.create(
            model="tiny",
            messages=ASK,
            max_tokens=4,
            tools=[WEATHER],
            tool_choice="required",
            extra_body={"structured_outputs": {"regex": "[a-z]+"}},
        )
    )
    assert error.body["param"] == "structured_outputs" and "tool_choice" in error.body["message"]
