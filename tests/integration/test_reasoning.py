"""Reasoning parsers through a real ``ringllm serve --reasoning-parser qwen3``, with the ``openai`` client.

The tiny random model has the default tokenizer, where ``<think>`` and ``</think>`` are plain text
of three tokens each (``</think>`` is ``</``, ``think``, ``>``). A logit bias on those three makes
the model write them in some order until the run ``</think>`` comes out: everything before it is
its reasoning, everything after its answer. The chat template opens ``<think>`` in the prompt, or
writes an empty ``<think></think>`` when ``enable_thinking`` is false, as Qwen3's does.
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

END_IDS = (9617, 17400, 46)  # "</", "think", ">"
BIAS = {str(i): 30 for i in END_IDS}
ASK = [{"role": "user", "content": "Is it ok?"}]
TEMPLATE = (
    "{% if reasoning_effort %}<effort {{ reasoning_effort }}>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}[thought {{ m.reasoning_content }}]"
    "{% endif %}{{ m.content }}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
ECHO = {
    "type": "function",
    "function": {"name": "echo", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
}
# A tool parser that reads every reply as one call of `echo` with the text it is given.
ECHO_PLUGIN = textwrap.dedent("""
    import json

    from engine.entrypoints.openai.tool_parsers import ParsedCall, ParsedReply, ToolParser, ToolParserManager


    @ToolParserManager.register_module("echo_text")
    class EchoTextParser(ToolParser):
        def parse(self, text, final):
            arguments = json.dumps({"text": text}, ensure_ascii=False)
            return ParsedReply("", [ParsedCall("echo", arguments if final else arguments[:-2], final)])
""")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("thinking-model")
    for name in os.listdir(tiny_model_dir):
        with open(os.path.join(tiny_model_dir, name), "rb") as src, open(path / name, "wb") as dst:
            dst.write(src.read())
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    plugin = tmp_path_factory.mktemp("plugin") / "echo_text.py"
    plugin.write_text(ECHO_PLUGIN)
    with RemoteServer(
        model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--reasoning-parser",
        "qwen3",
        "--structured-outputs-config",
        '{"disable_any_whitespace": true}',
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "echo_text",
        "--tool-parser-plugin",
        str(plugin),
    ) as remote:
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


def chat(client, **kw):
    kw.setdefault("max_tokens", 80)
    kw.setdefault("seed", 3)
    kw.setdefault("logit_bias", BIAS)
    return client.chat.completions.create(model="tiny", messages=ASK, **kw)


def test_chat_reasoning_split_streamed_and_whole(client, tokenizer):
    out = chat(client, extra_body={"return_token_ids": True})
    message = out.choices[0].message
    reasoning, content = message.reasoning_content, message.content
    text = tokenizer.decode(out.choices[0].token_ids, skip_special_tokens=True)
    assert reasoning and "</think>" not in reasoning and message.reasoning == reasoning
    assert text == reasoning + "</think>" + (content or "")

    streamed_reasoning, streamed_content = [], []
    for chunk in chat(client, stream=True):
        for choice in chunk.choices:
            piece = getattr(choice.delta, "reasoning_content", None)
            assert piece is None or choice.delta.content is None  # reasoning comes in deltas of its own
            assert getattr(choice.delta, "reasoning", None) == piece
            streamed_reasoning.append(piece or "")
            streamed_content.append(choice.delta.content or "")
    assert "".join(streamed_reasoning) == reasoning
    assert "".join(streamed_content) == (content or "")

    left_out = chat(client, extra_body={"include_reasoning": False}).choices[0].message
    assert getattr(left_out, "reasoning_content", None) is None and left_out.content == content
    chunks = list(chat(client, stream=True, extra_body={"include_reasoning": False}))
    assert not any(getattr(c.delta, "reasoning_content", None) for chunk in chunks for c in chunk.choices)


def test_tool_calls_are_read_from_the_content_after_the_reasoning(client):
    """The tool parser sees only the text after ``</think>``, streamed and whole."""
    plain = chat(client).choices[0].message
    out = chat(client, tools=[ECHO]).choices[0]
    assert out.message.reasoning_content == plain.reasoning_content
    assert json.loads(out.message.tool_calls[0].function.arguments) == {"text": plain.content or ""}
    reasoning, arguments = [], []
    for chunk in chat(client, tools=[ECHO], stream=True):
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            arguments += [c.function.arguments or "" for c in choice.delta.tool_calls or ()]
    assert "".join(reasoning) == plain.reasoning_content
    assert "".join(arguments) == out.message.tool_calls[0].function.arguments


def test_json_schema_applies_after_the_reasoning(client):
    """The reasoning is free text (the biased marker pieces), the answer after ``</think>`` is
    JSON of the schema: the core starts the grammar only once the output ends the reasoning."""
    format_ = {"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA}}
    out = chat(client, max_tokens=120, response_format=format_)
    message = out.choices[0].message
    assert message.reasoning_content and "</think>" not in message.reasoning_content
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(message.content), SCHEMA)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in chat(client, max_tokens=120, stream=True, response_format=format_)
        if c.choices
    )
    assert streamed == message.content


def test_enable_thinking_false_reaches_the_template_and_gives_no_reasoning(client):
    """The template closes the reasoning in the prompt: the reply is all content, and a grammar
    applies from its first token."""
    off = {"chat_template_kwargs": {"enable_thinking": False}, "return_prompt_text": True}
    out = chat(client, extra_body=off)
    assert out.prompt_text.endswith("<assistant><think>\n\n</think>\n\n")
    assert getattr(out.choices[0].message, "reasoning_content", None) is None
    assert out.choices[0].message.content
    format_ = {"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA}}
    constrained = chat(client, extra_body=off, response_format=format_, logit_bias=None)
    assert getattr(constrained.choices[0].message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(constrained.choices[0].message.content), SCHEMA)


def test_responses_reasoning_item_streamed_and_whole(client):
    whole = chat(client)
    ask = dict(model="tiny", input="Is it ok?", max_output_tokens=80, extra_body={"seed": 3, "logit_bias": BIAS})
    response = client.responses.create(**ask)
    reasoning, message = response.output[0], response.output[1]
    assert reasoning.type == "reasoning" and reasoning.summary == []
    expected = whole.choices[0].message.reasoning_content
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", expected)]
    assert message.type == "message" and message.content[0].text == whole.choices[0].message.content

    events = list(client.responses.create(**ask, stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert "".join(deltas) == done[0].text == reasoning.content[0].text
    types = [e.type for e in events]
    first_text = types.index("response.output_text.delta")
    assert types.index("response.reasoning_text.done") < first_text  # the reasoning item closes first
    assert events[-1].response.output[0].content[0].text == reasoning.content[0].text


def test_reasoning_sent_back_reaches_the_template(client, tokenizer):
    """An assistant message's reasoning_content (or reasoning) in chat, a reasoning input item in
    responses (with the answer after it), and a previous response's reasoning item."""
    for field in ("reasoning_content", "reasoning"):
        history = [*ASK, {"role": "assistant", "content": "yes", field: "it is"}, {"role": "user", "content": "Sure?"}]
        out = client.chat.completions.create(
            model="tiny", messages=history, max_tokens=1, extra_body={"return_prompt_text": True}
        )
        assert "<assistant>[thought it is]yes|<user>Sure?|" in out.prompt_text

    def items(reasoning, answer):
        return [
            {"role": "user", "content": "Is it ok?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            },
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Sure?"},
        ]

    def input_tokens(**ask):
        return client.responses.create(model="tiny", max_output_tokens=1, **ask).usage.input_tokens

    thought = len(tokenizer.encode("[thought it is]", add_special_tokens=False).ids)
    without = items("", "yes")
    del without[1]
    assert input_tokens(input=items("it is", "yes")) == input_tokens(input=without) + thought

    first = client.responses.create(
        model="tiny", input="Is it ok?", max_output_tokens=80, extra_body={"seed": 3, "logit_bias": BIAS}
    )
    reasoning, answer = first.output[0].content[0].text, first.output[1].content[0].text
    assert input_tokens(input="Sure?", previous_response_id=first.id) == input_tokens(input=items(reasoning, answer))


def test_reasoning_effort_reaches_the_template(client):
    """Chat's reasoning_effort and responses' reasoning.effort, as vLLM passes them."""
    out = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=1, reasoning_effort="high", extra_body={"return_prompt_text": True}
    )
    assert out.prompt_text.startswith("<effort high><user>Is it ok?|")

    def input_tokens(**ask):
        return client.responses.create(model="tiny", input="Is it ok?", max_output_tokens=1, **ask).usage.input_tokens

    assert input_tokens(reasoning={"effort": "high"}) == out.usage.prompt_tokens > input_tokens()
    with pytest.raises(openai.BadRequestError) as err:
        input_tokens(reasoning={"effort": "high", "summary": "detailed"})
    assert err.value.body["param"] == "reasoning"


def test_unknown_reasoning_parser_is_a_clear_error(model_dir):
    run = subprocess.run(
        [*RINGLLM, "serve", model_dir, "--reasoning-parser", "nope"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode != 0
    assert "invalid reasoning parser: nope (choose from deepseek_r1, qwen3)" in run.stderr
    assert "Traceback" not in run.stderr
