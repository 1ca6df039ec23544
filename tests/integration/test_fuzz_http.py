"""HTTP fuzzing of a real ``ringllm serve`` (the tiny dummy-weight model): random and adversarial
bodies for every route, wrong methods, garbage bytes, huge ints, deep nesting. The pooling and
scoring routes are fuzzed on two pooling servers too (an embedding model and a cross-encoder).

The invariant, for every request: the answer is a 200, or a 4xx in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` (Anthropic's ``{"type": "error", "error":
{"type", "message"}}`` on its /v1/messages routes) (or a 503 overload with Retry-After: a
waiting limit is configured); /health keeps answering 200; and the server's process set is the
same at the end. Examples are derandomized (the same each run) and bounded in count, so the
module takes a minute or two.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, parse_anthropic_sse, parse_sse

API_KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ROUTES = {
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
    "/tokenize": "POST",
    "/detokenize": "POST",
    "/v1/models": "GET",
    "/health": "GET",
    "/metrics": "GET",
    "/version": "GET",
    "/v1/responses": "POST",
    "/ping": "GET",
    "/server_info": "GET",
    "/v1/messages": "POST",
    "/v1/messages/count_tokens": "POST",
}
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
# No shrinking: against a live server it costs minutes, and the failing example is printed as is.
FUZZ = settings(
    max_examples=int(os.environ.get("RINGLLM_FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--api-key",
        API_KEY,
        "--max-waiting-requests",
        "64",
        "--max-request-body-bytes",
        str(1 << 20),
    ) as remote:
        processes = remote.core_pids()
        yield remote
        assert remote.get("/health")[0] == 200
        assert remote.core_pids() == processes, "the fuzzing changed the server's processes"


# ---- values ----

HUGE_INTS = st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**63) - 1, 0])
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | HUGE_INTS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
JSON = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)
SMALL = st.integers(0, 8)
TEXT = st.text(max_size=60)
TOKEN_IDS = st.lists(st.integers(0, 49151), min_size=1, max_size=12)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool"]),
            "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2),
        }
    ),
    min_size=1,
    max_size=3,
)

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
RESPONSE_ITEMS = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "developer", "tool"]),
            "content": TEXT
            | st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["input_text", "output_text", "input_image"]), "text": TEXT}
                ),
                max_size=2,
            ),
        }
    )
    | st.fixed_dictionaries({"type": st.just("function_call"), "call_id": TEXT, "name": TEXT, "arguments": TEXT | JSON})
    | st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": TEXT, "output": TEXT | JSON}),
    min_size=1,
    max_size=3,
)

ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {}}}
ANTHROPIC_BLOCKS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "document", "thinking"]), "text": TEXT},
        optional={
            "id": TEXT,
            "name": TEXT | st.just("f"),
            "input": JSON,
            "tool_use_id": TEXT,
            "content": TEXT | JSON,
            "citations": JSON,
        },
    ),
    max_size=3,
)
ANTHROPIC_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": TEXT | ANTHROPIC_BLOCKS}
    ),
    min_size=1,
    max_size=3,
)
ANTHROPIC = {
    "model": st.just("tiny") | TEXT,
    "messages": ANTHROPIC_MESSAGES,
    "system": TEXT | ANTHROPIC_BLOCKS,
    "tools": st.lists(st.just(ANTHROPIC_TOOL) | st.fixed_dictionaries({"type": TEXT, "name": TEXT}), max_size=2),
    "tool_choice": st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none"])},
        optional={"name": TEXT | st.just("f"), "disable_parallel_tool_use": st.booleans()},
    ),
    "chat_template_kwargs": st.dictionaries(st.text(max_size=8), JSON, max_size=2),
}

# Each field with values a client may plausibly send (so requests get deep into the server)...
SAMPLING = {
    "model": st.just("tiny") | TEXT,
    "n": st.integers(1, 4) | st.integers(-3, 300),
    "temperature": st.floats(0, 2) | st.floats(),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(-1, 60000),
    "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0, 3),
    "seed": st.integers(),
    "stop": TEXT | st.lists(TEXT, max_size=3),
    "stop_token_ids": TOKEN_IDS,
    "presence_penalty": st.floats(-3, 3),
    "frequency_penalty": st.floats(-3, 3),
    "ignore_eos": st.booleans(),
    "min_tokens": SMALL,
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": TEXT,
}
FIELDS = {
    "/v1/completions": {
        **SAMPLING,
        "prompt": TEXT | TOKEN_IDS | st.lists(TEXT, max_size=4) | st.lists(TOKEN_IDS, max_size=3),
        "max_tokens": SMALL,
        "echo": st.booleans(),
        "logprobs": st.integers(0, 30),
        "suffix": TEXT,
    },
    "/v1/chat/completions": {
        **SAMPLING,
        "messages": MESSAGES,
        "max_tokens": SMALL,
        "max_completion_tokens": SMALL,
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 30),
        "add_generation_prompt": st.booleans(),
        "chat_template_kwargs": st.dictionaries(st.text(max_size=8), JSON, max_size=2),
    },
    "/tokenize": {
        "model": st.just("tiny"),
        "prompt": TEXT,
        "messages": MESSAGES,
        "add_special_tokens": st.booleans(),
        "add_generation_prompt": st.booleans(),
    },
    "/detokenize": {"model": st.just("tiny"), "tokens": TOKEN_IDS | st.lists(st.integers(), max_size=5)},
    "/v1/responses": {
        "model": st.just("tiny") | TEXT,
        "input": TEXT | RESPONSE_ITEMS,
        "instructions": TEXT,
        "max_output_tokens": SMALL,
        "temperature": st.floats(0, 2) | st.floats(),
        "top_p": st.floats(0, 1),
        "tools": st.lists(st.just(TOOL) | st.fixed_dictionaries({"type": TEXT}), max_size=2),
        "tool_choice": st.sampled_from(["auto", "none", "required"])
        | st.fixed_dictionaries({"type": st.just("function"), "name": TEXT | st.just("f")}),
        "text": st.fixed_dictionaries(
            {
                "format": st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "json_object", "json_schema"]), "schema": JSON}
                )
            }
        ),
        "stream": st.booleans(),
        "store": st.booleans(),
        "background": st.booleans(),
        "previous_response_id": TEXT,
        "metadata": st.dictionaries(TEXT, TEXT, max_size=3),
        "ignore_eos": st.booleans(),
        "seed": st.integers(),
    },
    "/v1/messages": {
        **ANTHROPIC,
        "max_tokens": SMALL,
        "stop_sequences": st.lists(TEXT, max_size=3),
        "stream": st.booleans(),
        "temperature": st.floats(0, 2) | st.floats(),
        "top_p": st.floats(0, 1),
        "top_k": st.integers(-1, 60000),
        "metadata": st.fixed_dictionaries({"user_id": TEXT}),
        "output_config": st.fixed_dictionaries(
            {"format": st.fixed_dictionaries({"type": st.just("json_schema"), "schema": JSON})}
        ),
        "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"])}),
    },
    "/v1/messages/count_tokens": ANTHROPIC,
}
REQUIRED = {
    "/v1/completions": ("prompt", "max_tokens"),
    "/v1/chat/completions": ("messages", "max_tokens"),
    "/tokenize": ("prompt",),
    "/detokenize": ("tokens",),
    "/v1/responses": ("input", "max_output_tokens"),
    "/v1/messages": ("model", "messages", "max_tokens"),
    "/v1/messages/count_tokens": ("model", "messages"),
}

# The pooling and scoring routes (served by a pooling model; a generating one answers 400).
TEXTS = TEXT | st.lists(TEXT, max_size=4)
PROMPTS = TEXT | TOKEN_IDS | st.lists(TEXT, max_size=4) | st.lists(TOKEN_IDS, max_size=3)
POOLING_BASIC = {
    "model": st.just("tiny") | TEXT,
    "user": TEXT,
    "use_activation": st.booleans(),
    "truncate_prompt_tokens": st.integers(-2, 300) | HUGE_INTS,
    "truncation_side": st.sampled_from(["left", "right", "up"]),
    "priority": st.integers(),
    "request_id": TEXT,
    "cache_salt": TEXT,
    "padding": st.sampled_from(["max_length", "do_not_pad"]),
}
POOLING_FIELDS = {
    "/pooling": {
        **POOLING_BASIC,
        "input": PROMPTS,
        "add_special_tokens": st.booleans(),
        "task": st.sampled_from(["embed", "classify", "token_embed"]) | TEXT,
        "encoding_format": st.sampled_from(["float", "base64", "bytes"]),
        "embed_dtype": st.sampled_from(["float32", "float16", "bfloat16", "int8"]),
        "endianness": st.sampled_from(["native", "little", "big"]),
        "dimensions": st.integers(-2, 100),
    },
    "/classify": {**POOLING_BASIC, "input": PROMPTS, "add_special_tokens": st.booleans()},
    "/score": {
        **POOLING_BASIC,
        **{name: TEXTS for name in ("text_1", "text_2", "queries", "documents", "items", "data_1", "data_2")},
    },
    "/rerank": {
        **POOLING_BASIC,
        "query": TEXT,
        "documents": st.lists(TEXT, max_size=6),
        "top_n": st.integers(-3, 10) | HUGE_INTS,
        "return_documents": st.booleans(),
    },
}
POOLING_REQUIRED = {
    "/pooling": ("input",),
    "/classify": ("input",),
    "/score": ("text_1", "text_2"),
    "/rerank": ("query", "documents"),
}
POOLING_ROUTES = {
    "/pooling": "/pooling",
    "/classify": "/classify",
    "/score": "/score",
    "/v1/score": "/score",
    "/rerank": "/rerank",
    "/v1/rerank": "/rerank",
    "/v2/rerank": "/rerank",
}  # path -> its body
for _path, _body in POOLING_ROUTES.items():
    FIELDS[_path], REQUIRED[_path] = POOLING_FIELDS[_body], POOLING_REQUIRED[_body]
    ROUTES[_path] = "POST"


@st.composite
def field_bodies(draw, path: str) -> dict:
    """A body of the route's own fields: plausible values, some replaced by anything at all."""
    fields = FIELDS[path]
    names = sorted(set(REQUIRED[path]) | set(draw(st.sets(st.sampled_from(sorted(fields)), max_size=6))))
    body = {name: draw(fields[name]) for name in names}
    for name in draw(st.sets(st.sampled_from(names + ["unknown_field"]), max_size=2)):
        body[name] = draw(JSON)
    # Bounded work: the tiny model generates ~1k tokens/s, so keep what a valid request asks small.
    for limit in ("max_tokens", "max_output_tokens"):
        if isinstance(body.get(limit), int) and body[limit] > 64:
            body[limit] = 64
    return body


def deep(depth: int, kind: str) -> bytes:
    return {
        "list": b"[" * depth + b"]" * depth,
        "object": b'{"a":' * depth + b"1" + b"}" * depth,
        "prompt": b'{"prompt": ' + b"[" * depth + b"1" + b"]" * depth + b', "max_tokens": 1}',
    }[kind]


def raw_bodies(path: str):
    """Bytes on the wire: JSON of the route's fields, any JSON, garbage (deep nesting: below)."""
    as_json = (field_bodies(path) if path in FIELDS else JSON).map(lambda v: json.dumps(v).encode())
    return st.one_of(
        as_json,
        as_json,
        JSON.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=200),
        st.just(b""),
        st.just(b'\xff\xfe{"prompt": "\xc3\x28"}'),
    )


# ---- the invariant ----


def check_answer(server: RemoteServer, method: str, path: str, body: bytes, headers: dict) -> None:
    status, raw, resp_headers = server.request(method, path, body if method != "GET" or body else None, headers)
    context = f"{method} {path} {body[:200]!r} -> {status} {raw[:300]!r}"
    assert status == 200 or 400 <= status < 500 or (status == 503 and "Retry-After" in resp_headers), context
    if status != 200:
        answer = json.loads(raw)
        error = answer["error"]
        if path in ANTHROPIC_ROUTES:
            assert answer["type"] == "error" and set(error) == {"type", "message"}, context
        else:
            assert set(error) == {"message", "type", "param", "code"}, context
        assert isinstance(error["message"], str) and error["message"], context
    elif resp_headers.get("Content-Type", "").startswith("text/event-stream") and path in ANTHROPIC_ROUTES:
        events = parse_anthropic_sse(raw)  # a well-formed stream, ending in message_stop or an error event
        assert events[-1]["type"] in ("message_stop", "error"), context
    elif resp_headers.get("Content-Type", "").startswith("text/event-stream"):
        events = parse_sse(raw)  # a well-formed stream, ending in [DONE]; an error event is allowed
        assert all("error" in e or "choices" in e or e.get("type", "").startswith("response.") for e in events), context
    elif path not in ("/health", "/ping", "/metrics"):
        json.loads(raw)
    assert server.get("/health")[0] == 200, f"/health failed after {context}"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_generation_routes_answer_200_or_an_openai_4xx(server, path):
    @FUZZ
    @given(body=raw_bodies(path), authorized=st.booleans() | st.just(True))
    def fuzz(body, authorized):
        check_answer(server, "POST", path, body, {"Content-Type": "application/json", **(AUTH if authorized else {})})

    fuzz()


def test_small_routes_answer_200_or_an_openai_4xx(server):
    @FUZZ
    @given(data=st.data())
    def fuzz(data):
        path = data.draw(st.sampled_from(sorted(ROUTES)))
        body = data.draw(raw_bodies(path))
        check_answer(server, ROUTES[path], path, body, {"Content-Type": "application/json", **AUTH})

    fuzz()


@pytest.fixture(scope="module", params=["embedding", "cross-encoder"])
def pooling_server(request, tmp_path_factory):
    """A pooling model of each kind: an embedding model (scores are cosines) and a one-label
    classifier (scores are the pair's, encoded together)."""
    from engine.models.default_model import write_tiny_model

    if request.param == "embedding":
        model, args = write_tiny_model(str(tmp_path_factory.mktemp("embed"))), ("--runner", "pooling")
    else:
        model, args = (
            write_tiny_model(
                str(tmp_path_factory.mktemp("cross")), num_labels=1, architectures=["LlamaForSequenceClassification"]
            ),
            (),
        )
    with RemoteServer(
        model,
        *TINY_SERVE_ARGS,
        *args,
        "--served-model-name",
        "tiny",
        "--api-key",
        API_KEY,
        "--max-waiting-requests",
        "64",
        "--max-request-body-bytes",
        str(1 << 20),
    ) as remote:
        processes = remote.core_pids()
        yield remote
        assert remote.get("/health")[0] == 200
        assert remote.core_pids() == processes, "the fuzzing changed the server's processes"


def test_pooling_routes_answer_200_or_an_openai_4xx(pooling_server):
    @FUZZ
    @given(data=st.data())
    def fuzz(data):
        path = data.draw(st.sampled_from(sorted(POOLING_ROUTES)))
        check_answer(
            pooling_server, "POST", path, data.draw(raw_bodies(path)), {"Content-Type": "application/json", **AUTH}
        )

    fuzz()
    for path in sorted(POOLING_ROUTES):
        for depth in (64, 100_000):
            check_answer(
                pooling_server, "POST", path, deep(depth, "object"), {"Content-Type": "application/json", **AUTH}
            )


# Until decode_request refuses deep nesting itself (http_bodies.py, the validation work), msgspec's
# RecursionError surfaces as a 500 here: these assert the invariant that work restores.
@pytest.mark.parametrize("path", sorted(FIELDS))
@pytest.mark.parametrize("depth", [64, 2000, 100_000])
@pytest.mark.parametrize("kind", ["list", "object", "prompt"])
def test_deeply_nested_bodies_answer_an_openai_4xx(server, path, depth, kind):
    check_answer(server, "POST", path, deep(depth, kind), {"Content-Type": "application/json", **AUTH})


def test_wrong_methods_and_unknown_paths_answer_an_openai_4xx(server):
    @FUZZ
    @given(
        path=st.sampled_from(sorted(ROUTES)) | st.text(max_size=30).map(lambda t: "/" + t.encode().hex()),
        method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
        body=st.binary(max_size=64),
        authorized=st.booleans(),
    )
    def fuzz(path, method, body, authorized):
        if ROUTES.get(path) == method:
            return  # the right method: covered above
        check_answer(server, method, path, body, AUTH if authorized else {})

    fuzz()
