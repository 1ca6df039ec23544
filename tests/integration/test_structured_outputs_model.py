"""The default model (SmolLM2-135M-Instruct, real weights) under every constraint type: the
output is valid whatever the model would have said, with the default (auto) backend."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "languages", "employed"],
}
DATE = r"\d{4}-\d{2}-\d{2}"
SENTIMENT = ["positive", "negative", "neutral"]
ARITHMETIC = 'root ::= term "+" term "+" term\nterm ::= [1-9] [0-9]?'
LARK = 'start: "The answer is " WORD "."\nWORD: /[a-z]{1,12}/'


@pytest.fixture(scope="module")
def llm():
    from engine.models.default_model import default_model_path

    llm = LLM(model=default_model_path(), max_model_len=1024, kv_cache_memory=256 << 20)
    yield llm
    llm.shutdown()


def chat(llm, question, so, **kw):
    params = SamplingParams(max_tokens=kw.pop("max_tokens", 200), temperature=0.0, structured_outputs=so, **kw)
    (out,) = llm.chat([{"role": "user", "content": question}], params, use_tqdm=False)
    return out.outputs[0]


def test_json_schema(llm):
    out = chat(llm, "Describe a software engineer from Paris as JSON.", StructuredOutputsParams(json=PERSON))
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), PERSON)


def test_json_object(llm):
    out = chat(llm, "Give me a JSON object about the weather.", StructuredOutputsParams(json_object=True))
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)


def test_regex(llm):
    out = chat(llm, "When did the French revolution start?", StructuredOutputsParams(regex=DATE))
    assert out.finish_reason == "stop" and re.fullmatch(DATE, out.text)


def test_choice(llm):
    out = chat(llm, "Classify: 'I love this film!'", StructuredOutputsParams(choice=SENTIMENT))
    assert out.finish_reason == "stop" and out.text in SENTIMENT


def test_ebnf_grammar(llm):
    out = chat(llm, "Write a sum of three numbers.", StructuredOutputsParams(grammar=ARITHMETIC), max_tokens=30)
    assert out.finish_reason == "stop" and re.fullmatch(r"[1-9][0-9]?\+[1-9][0-9]?\+[1-9][0-9]?", out.text)


def test_lark_grammar(llm):
    out = chat(llm, "What colour is the sky?", StructuredOutputsParams(grammar=LARK), max_tokens=30)
    assert out.finish_reason == "stop" and re.fullmatch(r"The answer is [a-z]{1,12}\.", out.text)
