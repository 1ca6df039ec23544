"""Structured outputs and logit controls over HTTP: a real ``ringllm serve`` on the tiny
random-weight model (free JSON whitespace off engine-wide, so a random model cannot pad
forever), driven by the ``openai`` package; the default model answers ``parse()`` with a
pydantic model."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "population": {"type": "integer", "minimum": 0, "maximum": 999},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}
BANANA = 21285  # " banana"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--structured-outputs-config",
        '{"disable_any_whitespace": true}',
        log=log,
    ) as remote:
        remote.log_path = log
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


def chat(client, **kw):
    kw.setdefault("max_tokens", 200)
    kw.setdefault("seed", 1)
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "A city?"}], **kw)


def test_response_format_json_schema_strict(client):
    out = chat(
        client,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}},
    )
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)


def test_response_format_json_object_and_text(client):
    out = chat(client, response_format={"type": "json_object"}, max_tokens=300)
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    else:  # a random model may open objects forever: what it wrote is still a JSON prefix
        assert out.choices[0].message.content.startswith("{")
    plain = chat(client, response_format={"type": "text"}, max_tokens=5, temperature=0.0)
    assert plain.choices[0].message.content == chat(client, max_tokens=5, temperature=0.0).choices[0].message.content


def test_structured_outputs_field_on_completions_and_chat_streams(client):
    out = client.completions.create(
        model="tiny", prompt="Pick:", max_tokens=20, extra_body={"structured_outputs": {"choice": ["left", "right"]}}
    )
    assert out.choices[0].text in ("left", "right") and out.choices[0].finish_reason == "stop"
    stream = chat(client, stream=True, extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,6}ville"}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert re.fullmatch(r"[A-Z][a-z]{2,6}ville", text)


def test_guided_fields_are_mapped_with_a_deprecation_warning(server, client):
    out = client.completions.create(model="tiny", prompt="Code:", max_tokens=20, extra_body={"guided_regex": r"\d{4}"})
    assert re.fullmatch(r"\d{4}", out.choices[0].text)
    out = client.completions.create(
        model="tiny", prompt="Pick:", max_tokens=20, extra_body={"guided_choice": ["up", "down"]}
    )
    assert out.choices[0].text in ("up", "down")
    with open(server.log_path) as f:
        log = f.read()
    assert "guided_regex is deprecated" in log and "guided_choice is deprecated" in log


@pytest.mark.parametrize(
    "extra,param,match",
    [
        ({"response_format": {"type": "yaml"}}, "response_format", "unknown type"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "only one",
        ),
        ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex", "only one"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "multiple are specified"),
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "unclosed group"),
        ({"structured_outputs": {"grammar": "root ::= nowhere"}}, "structured_outputs", "structured_outputs.grammar"),
        ({"structured_outputs": {"colour": "red"}}, "structured_outputs", "unknown field"),
        (
            {
                "structured_outputs": {
                    "structural_tag": json.dumps(
                        {
                            "type": "structural_tag",
                            "format": {"type": "tag", "begin": "<a>", "content": {"type": "bogus"}, "end": "</a>"},
                        }
                    )
                }
            },
            "structured_outputs",
            "structural_tag.format.tag.content",
        ),
        (
            {
                "structured_outputs": {
                    "structural_tag": json.dumps(
                        {
                            "structures": [{"begin": "<a>", "schema": {"type": "bogus"}, "end": "</a>"}],
                            "triggers": ["<a"],
                        }
                    )
                }
            },
            "structured_outputs",
            "structured_outputs.structural_tag: json",
        ),
        ({"structured_outputs": {"structural_tag": "{not json"}}, "structured_outputs", "not valid JSON"),
        ({"structured_outputs": {"structural_tag": "[" * 5000}}, "structured_outputs", "nested too deeply"),
        ({"logit_bias": {"banana": 5}}, "logit_bias", "not a token id"),
        ({"logit_bias": {"999999": 5}}, "logit_bias", "out of the vocabulary"),
        ({"allowed_token_ids": [999999]}, "allowed_token_ids", "out of the vocabulary"),
    ],
)
def test_invalid_constraints_and_controls_are_400_naming_the_field(client, extra, param, match):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, max_tokens=5, extra_body=extra)
    error = info.value.body
    assert error["param"] == param and match in error["message"], error
    assert not error["message"].startswith("request "), error  # refused by the frontend, not failed in the core
    assert not re.search(r"Traceback|GrammarError|RuntimeError|\.py\b|/(root|tmp|usr|home|work)/", error["message"])


def test_logit_bias_allowed_token_ids_and_bad_words(client):
    forced = client.completions.create(
        model="tiny", prompt="The fruit is", max_tokens=3, seed=2, logit_bias={str(BANANA): 100}
    )
    assert forced.choices[0].text == " banana" * 3
    allowed = client.completions.create(
        model="tiny",
        prompt="x",
        max_tokens=10,
        temperature=1.5,
        seed=2,
        extra_body={"allowed_token_ids": [BANANA, 28], "ignore_eos": True},
    )
    assert allowed.choices[0].text.replace(" banana", "").replace(",", "") == ""  # 28 is ","
    greedy = client.completions.create(
        model="tiny", prompt="The fruit is", max_tokens=4, temperature=0.0, extra_body={"ignore_eos": True}
    )
    first = greedy.choices[0].text.split()[0] if greedy.choices[0].text.split() else None
    if first:
        banned = client.completions.create(
            model="tiny",
            prompt="The fruit is",
            max_tokens=4,
            temperature=0.0,
            extra_body={"ignore_eos": True, "bad_words": [first]},
        )
        assert first not in banned.choices[0].text.split()


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int
    city: str = pydantic.Field(max_length=20)


@pytest.mark.model
@pytest.mark.slow
def test_parse_with_a_pydantic_model_on_the_default_model():
    with RemoteServer("--num-threads", "1", "--max-model-len", "1024", "--kv-cache-memory", str(256 << 20)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        done = client.chat.completions.parse(
            model=client.models.list().data[0].id,
            temperature=0.0,
            max_tokens=120,
            response_format=Person,
            messages=[{"role": "user", "content": "Invent a person who lives in Rome."}],
        )
    person = done.choices[0].message.parsed
    assert isinstance(person, Person) and person.age >= 0 and person.name
