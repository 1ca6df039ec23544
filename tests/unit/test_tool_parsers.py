"""The tool-call parsers on canned model text (vLLM's known failure cases), streamed and not.

Every case is also streamed split at every character position and one character at a time: the
streamed deltas must concatenate to exactly the non-streaming calls and content, each call's
first delta must carry its index, id, type and whole name, and its arguments must be valid JSON.
"""

from __future__ import annotations

import json
import textwrap

import hypothesis.strategies as st
import jsonschema
import pytest
from hypothesis import given, settings

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import ChatCompletionRequest, decode_request
from engine.entrypoints.openai.tool_parsers import ToolParser, ToolParserManager
from engine.entrypoints.openai.tool_parsers.forced import NamedToolCallParser, RequiredToolCallParser
from engine.entrypoints.openai.partial_json import MAX_DEPTH, canonical, canonical_prefix
from engine.entrypoints.openai.tool_parsers.tool_choice import ToolCallPlan, ToolServing, plan_tool_calls
from engine.sampling_params import SamplingParams, StructuredOutputsParams

NESTED = {"city": "Zürich", "when": {"days": [1, 2, {"deep": [[], {}]}], "exact": None}, "ok": True}
TRICKY = {"text": 'a {brace} and "quotes" and \\ and [brackets] </tool_call> ]', "emoji": "🌧", "n": -0.5}


def dumps(value, **kw) -> str:
    return json.dumps(value, ensure_ascii=False, **kw)


# (parser, model text, expected calls [(name, arguments dict)], expected content)
CASES = [
    (
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {dumps(NESTED)}}}\n</tool_call>',
        [("get_weather", NESTED)],
        None,
    ),
    (
        "hermes",
        f'Let me look that up.\n<tool_call>{{"name": "search", "arguments": {dumps(TRICKY)}}}</tool_call>',
        [("search", TRICKY)],
        "Let me look that up.\n",
    ),
    (
        "hermes",
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"arguments": {"y": [2, 3]}, "name": "b"}</tool_call>\n<tool_call>{"name": "c"}</tool_call>',
        [("a", {"x": 1}), ("b", {"y": [2, 3]}), ("c", {})],
        None,
    ),
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>', [("f", {"q": "x"})], None),
    (
        "llama3_json",
        f'<|python_tag|>{{"name": "get_weather", "parameters": {dumps(NESTED, indent=2)}}}',
        [("get_weather", NESTED)],
        None,
    ),
    (
        "llama3_json",
        f'{{"name": "a", "arguments": {dumps(TRICKY)}}}; {{"name": "b", "parameters": {{"n": 1e2}}}}',
        [("a", TRICKY), ("b", {"n": 100.0})],
        None,
    ),
    (
        "mistral",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {dumps(NESTED)}}}]',
        [("get_weather", NESTED)],
        None,
    ),
    (
        "mistral",
        f'Checking. [TOOL_CALLS] [{{"name": "a", "arguments": {dumps(TRICKY)}}}, {{"name": "b", "arguments": {{}}}}]',
        [("a", TRICKY), ("b", {})],
        "Checking. ",
    ),
    (
        "mistral",
        f"[TOOL_CALLS]get_weather[ARGS]{dumps(NESTED)}[TOOL_CALLS]now[ARGS]{{}}",
        [("get_weather", NESTED), ("now", {})],
        None,
    ),
    ("mistral", f"Sure.[TOOL_CALLS]search[ARGS] {dumps(TRICKY)}", [("search", TRICKY)], "Sure."),
    (
        "pythonic",
        '[get_weather(city="Zürich", days=[1, 2, {"deep": ((), {})}], exact=None, ok=True)]',
        [("get_weather", {"city": "Zürich", "days": [1, 2, {"deep": [[], {}]}], "exact": None, "ok": True})],
        None,
    ),
    (
        "pythonic",
        "[search(text='a {brace}, \"quotes\", (parens) and ]', n=-0.5), now(), note(body='''multi\nline, with )''')]",
        [
            ("search", {"text": 'a {brace}, "quotes", (parens) and ]', "n": -0.5}),
            ("now", {}),
            ("note", {"body": "multi\nline, with )"}),
        ],
        None,
    ),
]
PLAIN = [  # replies without calls: content, whole
    ("hermes", "The weather is {fine} today, <tool_ a word"),
    ("hermes", 'Broken: <tool_call>{"name": "f", "arguments": {"x": </tool_call>'),
    ("llama3_json", 'Sure, here: {"name": "f", "parameters": {}}'),
    ("llama3_json", '{"answer": 42}'),
    ("mistral", "No [TOOL_ here, just [brackets]."),
    ("mistral", "[TOOL_CALLS]not a name[ARGS]{}"),
    ("pythonic", "[1] a footnote, then text"),
    ("pythonic", '[f(x=__import__("os").system("echo owned"))]'),
    ("pythonic", "[f(1, 2)]"),
]


def calls_of(extracted) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in extracted.tool_calls]


def stream(
    parser: ToolParser, pieces: list[str], max_calls=None, streamer=None
) -> tuple[str, list[tuple[str, str]], list]:
    """The concatenated content and calls of a stream fed ``pieces``, and its raw tool deltas.
    ``streamer``: the parser's streamer to feed, for a test that looks at it afterwards."""
    streamer = streamer or parser.streamer(max_calls)
    deltas = [streamer.feed(piece) for piece in pieces] + [streamer.finish()]
    content, calls, raw = "", {}, []
    for delta in filter(None, deltas):
        content += delta.content or ""
        for call in delta.tool_calls or ():
            raw.append(call)
            if call.index not in calls:  # the opening delta: index, id, type and the whole name
                assert call.id and call.type == "function" and call.function.name, call
                calls[call.index] = [call.function.name, ""]
            else:
                assert call.id is None and call.function.name is None, "the name is sent once"
            calls[call.index][1] += call.function.arguments or ""
    assert sorted(calls) == list(range(len(calls))), "indexes count up from 0"
    return content, [tuple(calls[i]) for i in sorted(calls)], raw


def splits(text: str):
    yield list(text)  # one character at a time
    for cut in range(1, len(text)):
        yield [text[:cut], text[cut:]]


@pytest.mark.parametrize("name,text,expected,content", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_parser_reads_calls_whole_and_streamed_at_every_split(name, text, expected, content):
    extracted = ToolParserManager.get_tool_parser(name)().extract_tool_calls(text)
    assert extracted.tools_called and calls_of(extracted) == expected
    assert extracted.content == content
    ids = [c.id for c in extracted.tool_calls]
    assert len(set(ids)) == len(ids)
    whole = [(c.function.name, c.function.arguments) for c in extracted.tool_calls]
    for pieces in splits(text):
        got_content, got_calls, _ = stream(ToolParserManager.get_tool_parser(name)(), pieces)
        assert got_calls == whole, pieces
        assert got_content == (content or ""), pieces


@pytest.mark.parametrize("name,text", PLAIN, ids=[f"{c[0]}-{i}" for i, c in enumerate(PLAIN)])
def test_reply_without_readable_calls_is_content(name, text, capfd):
    extracted = ToolParserManager.get_tool_parser(name)().extract_tool_calls(text)
    assert not extracted.tools_called and extracted.tool_calls == [] and extracted.content == text
    for pieces in (list(text), [text]):
        got_content, got_calls, _ = stream(ToolParserManager.get_tool_parser(name)(), pieces)
        # a reply that only turns out malformed late may have opened a call already; its content
        # still adds up to the whole reply
        assert got_content == text
    assert "owned" not in capfd.readouterr().out  # pythonic arguments are literals, never run


def test_streamed_arguments_arrive_in_pieces_before_the_call_ends():
    text = '<tool_call>{"name": "f", "arguments": {"a": "' + "x" * 50 + '", "b": [1, 2]}}</tool_call>'
    _, calls, raw = stream(
        ToolParserManager.get_tool_parser("hermes")(), [text[i : i + 5] for i in range(0, len(text), 5)]
    )
    pieces = [c.function.arguments for c in raw if c.function.arguments]
    assert len(pieces) > 5 and json.loads("".join(pieces)) == {"a": "x" * 50, "b": [1, 2]}


def test_text_that_may_open_a_call_is_held_back_then_released():
    parser = ToolParserManager.get_tool_parser("hermes")()
    streamer = parser.streamer()
    assert streamer.feed("Hi <tool").content == "Hi "
    assert streamer.feed("bar").content == "<toolbar"


def test_parallel_tool_calls_false_streams_only_the_first_call():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    _, calls, _ = stream(ToolParserManager.get_tool_parser("hermes")(), list(text), max_calls=1)
    assert calls == [("a", "{}")]


def test_mistral_call_ids_are_nine_alphanumerics():
    extracted = ToolParserManager.get_tool_parser("mistral")().extract_tool_calls('[TOOL_CALLS][{"name": "f"}]')
    (call,) = extracted.tool_calls
    assert len(call.id) == 9 and call.id.isalnum()


def test_forced_outputs_read_as_calls():
    required = RequiredToolCallParser().extract_tool_calls(
        '[{"name": "a", "parameters": {"x": [1, {"y": "}"}]}}, {"name": "b", "parameters": {}}]'
    )
    assert calls_of(required) == [("a", {"x": [1, {"y": "}"}]}), ("b", {})] and required.content is None
    named = NamedToolCallParser("f").extract_tool_calls(' {"q": "a \\"b\\""} \n')
    assert calls_of(named) == [("f", {"q": 'a "b"'})]
    cut = NamedToolCallParser("f").extract_tool_calls('{"q": "unfini')  # what it settles, as its stream
    assert cut.unfinished and [(c.function.name, c.function.arguments) for c in cut.tool_calls] == [
        ("f", '{"q": "unfini')
    ]


# ---- replies cut inside a call: streamed and whole give the same answer ----

FORCED = {"required": RequiredToolCallParser, "named": lambda: NamedToolCallParser("f")}
CUT_REPLIES = [(name, text) for name, text, _, _ in CASES] + [
    ("required", f'[{{"name": "a", "parameters": {dumps(NESTED)}}}, {{"name": "b", "parameters": {{}}}}]'),
    ("named", dumps(TRICKY)),
]


def new_parser(name: str) -> ToolParser:
    return FORCED[name]() if name in FORCED else ToolParserManager.get_tool_parser(name)()


def test_cut_replies_are_tested_for_every_registered_parser():
    assert {name for name, _ in CUT_REPLIES} >= set(ToolParserManager.names()) | set(FORCED)


@pytest.mark.parametrize("name,text", CUT_REPLIES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CUT_REPLIES)])
def test_a_reply_cut_inside_a_call_streams_what_the_whole_reply_answers(name, text):
    """Cut by max_tokens (or ended by a stop string) anywhere: the whole reply answers what the
    text settles, which is what its stream sent token by token, and neither says ``tool_calls``
    unless the calls are whole."""
    mode = name if name in FORCED else "auto"
    tool_plan = ToolCallPlan(mode, None, name="f", auto_parser=None if name in FORCED else type(new_parser(name)))
    cuts = sorted({*range(1, len(text), max(1, len(text) // 9)), len(text) // 2, len(text) - 1, len(text)})
    for cut in cuts:
        reply = text[:cut]
        whole = new_parser(name).extract_tool_calls(reply)
        streamer = new_parser(name).streamer()
        content, calls, _ = stream(streamer.parser, list(reply), streamer=streamer)
        assert calls == [(c.function.name, c.function.arguments) for c in whole.tool_calls], reply
        assert content == (whole.content or ""), reply
        for reason in ("length", "stop"):
            finish = tool_plan.finish_reason(whole, reason)
            assert tool_plan.finish_reason(streamer.final, reason) == finish, reply
            if whole.unfinished or not whole.tools_called:
                assert finish == reason, reply  # never "tool_calls" for a reply cut inside a call
        if cut == len(text):
            assert not whole.unfinished and whole.tools_called
        elif whole.unfinished:
            assert whole.tools_called and calls, reply


def test_a_reply_cut_mid_arguments_keeps_its_call_and_the_settled_arguments():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    whole = new_parser("hermes").extract_tool_calls(text)
    assert whole.unfinished and whole.content is None
    assert [(c.function.name, c.function.arguments) for c in whole.tool_calls] == [("get_weather", '{"city": "Par')]
    plan = ToolCallPlan("auto", None, auto_parser=type(new_parser("hermes")))
    assert plan.finish_reason(whole, "length") == "length" and plan.finish_reason(whole, "stop") == "stop"
    complete = new_parser("hermes").extract_tool_calls(text + 'is"}}</tool_call>')
    assert plan.finish_reason(complete, "stop") == "tool_calls"


# ---- deep nesting: content, never a RecursionError ----

DEEP = 1500  # issue 32, finding 6: 1,200-1,500 levels made a RecursionError (a 500 and its traceback)


def deep_replies(depth: int) -> list[tuple[str, str]]:
    value = "[" * depth + "]" * depth
    return [
        ("hermes", f'Sure. <tool_call>{{"name": "f", "arguments": {{"a": {value}}}}}</tool_call>'),
        ("hermes", f'<tool_call>{{"name": "f", "arguments": "{{\\"a\\": {value}}}"}}</tool_call>'),
        ("llama3_json", f'{{"name": "f", "parameters": {{"a": {value}}}}}'),
        ("mistral", f'[TOOL_CALLS][{{"name": "f", "arguments": {{"a": {value}}}}}]'),
        ("mistral", f'[TOOL_CALLS]f[ARGS]{{"a": {value}}}'),
        ("pythonic", f"[f(a={value})]"),
        ("pythonic", f"[f(a={'-' * 20 * depth}1)]"),  # Python's parser: MemoryError, "too complex"
        ("pythonic", f"[f(a={'not ' * 20 * depth}1)]"),
        ("required", f'[{{"name": "f", "parameters": {{"a": {value}}}}}]'),
        ("named", f'{{"a": {value}}}'),
    ]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, DEEP])
def test_deeply_nested_calls_are_content_streamed_and_whole(depth):
    for name, text in deep_replies(depth):
        whole = new_parser(name).extract_tool_calls(text)
        if name == "hermes" and '"arguments": "' in text:  # arguments as a string: that string
            assert [c.function.name for c in whole.tool_calls] == ["f"], name
        else:
            assert not whole.tools_called and whole.content == text, name
        for pieces in ([text], [text[i : i + 7] for i in range(0, len(text), 7)]):
            content, calls, _ = stream(new_parser(name), pieces)
            if not whole.tools_called:  # a call opened before the nesting went too deep stays sent,
                assert content == text, name  # but the content adds up to the whole reply
            # and what is nested too deep is never streamed as JSON arguments
            assert all(args.count("[") <= MAX_DEPTH for _, args in calls if not args.startswith('"')), name


def test_nesting_up_to_the_limit_still_reads_as_a_call():
    value = "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)
    text = f'<tool_call>{{"name": "f", "arguments": {{"a": {value}}}}}</tool_call>'
    whole = new_parser("hermes").extract_tool_calls(text)
    assert calls_of(whole) == [("f", json.loads(f'{{"a": {value}}}'))]
    _, calls, _ = stream(new_parser("hermes"), [text[i : i + 7] for i in range(0, len(text), 7)])
    assert calls == [("f", whole.tool_calls[0].function.arguments)]


# ---- canonical JSON prefixes: the property the streaming rests on ----

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(json_values, st.sampled_from([None, 0, 2]), st.booleans())
def test_every_prefix_settles_a_prefix_of_the_canonical_text(value, indent, ascii_):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_)
    final = canonical(text)
    assert final == json.dumps(json.loads(text), ensure_ascii=False)
    for cut in range(len(text)):
        prefix, end = canonical_prefix(text[:cut])
        assert final.startswith(prefix), (text[:cut], prefix)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.text(max_size=5), json_values, max_size=4),
    st.sampled_from(["hermes", "mistral", "llama3_json"]),
    st.lists(st.integers(1, 12), min_size=1, max_size=40),
    st.sampled_from([None, 2]),
)
def test_random_arguments_stream_to_the_whole_parse(arguments, name, cuts, indent):
    body = dumps({"name": "f", "arguments": arguments}, indent=indent)
    text = {"hermes": f"<tool_call>{body}</tool_call>", "mistral": f"[TOOL_CALLS][{body}]", "llama3_json": body}[name]
    pieces, pos = [], 0
    for cut in cuts * (1 + len(text) // sum(cuts)):
        pieces.append(text[pos : pos + cut])
        pos += cut
    whole = ToolParserManager.get_tool_parser(name)().extract_tool_calls(text)
    assert calls_of(whole) == [("f", arguments)]
    _, streamed, _ = stream(ToolParserManager.get_tool_parser(name)(), [p for p in pieces if p])
    assert streamed == [("f", whole.tool_calls[0].function.arguments)]


def test_canonical_refuses_what_is_not_json():
    for bad in ('{"a" 1}', "[1,]", "{'a': 1}", "tru e", '{"a": 1} trailing', '{"a": 1'):
        with pytest.raises(ValueError):
            canonical(bad)


# ---- the registry and plugins ----


def test_unknown_parser_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="invalid tool call parser: nope.*hermes.*llama3_json.*mistral.*pythonic"):
        ToolParserManager.get_tool_parser("nope")


def test_plugin_file_registers_its_parser(tmp_path):
    plugin = tmp_path / "my_parser.py"
    plugin.write_text(
        textwrap.dedent('''
        from engine.entrypoints.openai.tool_parsers import ParsedCall, ParsedReply, ToolParser, ToolParserManager

        @ToolParserManager.register_module(["shout", "shout2"])
        class ShoutParser(ToolParser):
            """CALL name: the whole reply is one call without arguments."""
            def parse(self, text, final):
                if not text.startswith("CALL "):
                    return ParsedReply(text)
                return ParsedReply("", [ParsedCall(text[5:].strip() or None, "{}", final)])
    ''')
    )
    ToolParserManager.import_tool_parser(str(plugin))
    try:
        extracted = ToolParserManager.get_tool_parser("shout2")().extract_tool_calls("CALL ping")
        assert calls_of(extracted) == [("ping", {})]
    finally:
        for name in ("shout", "shout2"):
            ToolParserManager.tool_parsers.pop(name, None)


def test_broken_plugin_is_one_clear_error(tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="broken.py failed to load: RuntimeError: boom"):
        ToolParserManager.import_tool_parser(str(plugin))
    with pytest.raises(ValueError, match="no such file"):
        ToolParserManager.import_tool_parser(str(tmp_path / "missing.py"))


# ---- tool_choice: vLLM's checks and the constraint of required/named ----

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/City"}},
            "required": ["city"],
            "$defs": {"City": {"type": "string"}},
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}


def plan(serving=ToolServing(), **body):
    request = decode_request(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], **body}).encode(), ChatCompletionRequest
    )
    return plan_tool_calls(request, serving)


@pytest.mark.parametrize(
    "body,param,message",
    [
        ({"tools": []}, "tools", "must not be an empty array"),
        ({"tool_choice": "required"}, "tool_choice", "`tools` must be set"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "`tools` must be set"),
        (
            {"tools": [NOW], "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "tool_choice",
            "does not match any of the specified `tools`",
        ),
        ({"tools": [NOW]}, "tool_choice", "--enable-auto-tool-choice and --tool-call-parser"),
        ({"tools": [NOW], "tool_choice": "auto"}, "tool_choice", "--enable-auto-tool-choice"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
                "tool_choice": "none",
            },
            "tools",
            'type "object"',
        ),
        ({"tools": [NOW], "tool_choice": {"type": "function"}}, "tool_choice", "function"),
        ({"tools": [NOW], "tool_choice": {"type": "function", "function": {}}}, "tool_choice", "name"),
        ({"tools": [NOW], "tool_choice": "always"}, "tool_choice", ""),
    ],
)
def test_tool_requests_vllm_refuses_are_400_naming_the_field(body, param, message):
    with pytest.raises(OpenAIError) as info:
        plan(**body)
    assert info.value.status == 400 and info.value.param == param and message in info.value.message


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "function"}],
        [{"type": "function", "function": {"name": ""}}],
        [{"type": "code", "function": {"name": "f"}}],
        [{"function": {"name": 3}}],
        "not a list",
    ],
)
def test_malformed_tool_definitions_are_400_naming_tools(tools):
    with pytest.raises(OpenAIError) as info:
        plan(tools=tools, tool_choice="required")
    assert info.value.status == 400 and info.value.param == "tools"


def test_tool_choice_defaults_as_vllm_does():
    assert plan().mode == "none" and plan().tools is None
    assert plan(tools=[NOW], tool_choice="none").tools[0]["function"]["name"] == "now"  # still for the template
    hermes = ToolParserManager.get_tool_parser("hermes")
    assert plan(ToolServing(True, hermes), tools=[NOW]).mode == "auto"


def test_required_schema_admits_exactly_calls_of_the_tools():
    schema = plan(tools=[WEATHER, NOW], tool_choice="required").schema
    assert schema["$defs"] == {"City": {"type": "string"}}  # hoisted where "#/$defs/City" points
    valid = [
        [{"name": "get_weather", "parameters": {"city": "Paris"}}],
        [{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}],
    ]
    invalid = [
        [],
        [{"name": "other", "parameters": {}}],
        [{"name": "get_weather", "parameters": {"city": 3}}],
        [{"name": "get_weather"}],
    ]
    for calls in valid:
        jsonschema.validate(calls, schema)
    for calls in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(calls, schema)
    single = plan(tools=[WEATHER, NOW], tool_choice="required", parallel_tool_calls=False).schema
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(valid[1], single)


def test_named_choice_constrains_to_the_arguments_object():
    named = plan(tools=[WEATHER, NOW], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.mode == "named" and named.schema == WEATHER["function"]["parameters"]
    assert plan(tools=[NOW], tool_choice={"type": "function", "function": {"name": "now"}}).schema == {
        "type": "object",
        "properties": {},
    }


def test_forced_calls_take_the_constraint_in_place_of_a_response_format():
    required = plan(tools=[WEATHER], tool_choice="required")
    params = required.constrain(SamplingParams(max_tokens=8))
    assert params.structured_outputs.json == required.schema
    # no invented keys and no free whitespace: what a small model otherwise fills its budget with
    assert params.structured_outputs.disable_additional_properties and params.structured_outputs.disable_any_whitespace
    # a response_format's constraint gives way to the call's grammar (vLLM's rule)
    formatted = plan(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    given = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(json_object=True))
    assert formatted.constrain(given).structured_outputs == params.structured_outputs
    assert plan(tools=[NOW], tool_choice="none").constrain(params) is params


@pytest.mark.parametrize(
    "field,value",
    [("structured_outputs", {"regex": "a+"}), ("guided_json", {"type": "object"}), ("guided_choice", ["a", "b"])],
)
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_second_constraint_beside_a_forced_call_is_a_400_naming_it(field, value, tool_choice):
    with pytest.raises(OpenAIError) as info:  # before: only refused later, naming tool_choice
        plan(tools=[WEATHER], tool_choice=tool_choice, **{field: value})
    assert info.value.status == 400 and info.value.param == field
    assert "not both" in info.value.message and "tool_choice" in info.value.message
    plan(
        ToolServing(True, ToolParserManager.get_tool_parser("hermes")),
        tools=[WEATHER],
        tool_choice="auto",
        **{field: value},
    )  # auto: the constraint shapes the reply in text


@pytest.mark.parametrize("tool_choice", ["required", "none", {"type": "function", "function": {"name": "f"}}])
def test_parameters_nested_deeper_than_the_parsers_read_are_400_naming_tools(tool_choice):
    deep = {"type": "object", "properties": {"a": json.loads('{"x": ' * 900 + "1" + "}" * 900)}}
    with pytest.raises(OpenAIError) as info:  # before: copy.deepcopy's RecursionError, a 500
        plan(tools=[{"type": "function", "function": {"name": "f", "parameters": deep}}], tool_choice=tool_choice)
    assert info.value.status == 400 and info.value.param == "tools" and "nested deeper" in info.value.message
    fine = {"type": "object", "properties": {"a": json.loads('{"x": ' * 60 + "1" + "}" * 60)}}
    plan(tools=[{"type": "function", "function": {"name": "f", "parameters": fine}}], tool_choice=tool_choice)


def test_two_tools_defining_one_def_differently_are_refused():
    other = json.loads(json.dumps(WEATHER).replace('"string"}}', '"integer"}}').replace("get_weather", "g"))
    with pytest.raises(OpenAIError) as info:
        plan(tools=[WEATHER, other], tool_choice="required")
    assert info.value.param == "tools" and "City" in info.value.message
