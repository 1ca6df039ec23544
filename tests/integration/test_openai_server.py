"""The OpenAI-compatible server, end to end: a real ``ringllm serve`` process on the tiny
dummy-weight model, driven by the real ``openai`` package (and by raw HTTP where the wire
format itself is under test). One server serves the whole module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import traceback

import aiohttp
import openai
import pytest

from engine.entrypoints.openai.serving_engine import to_openai_error
from engine.exceptions import EngineDeadError, ParameterError
from tests.helpers.openai_server_utils import RINGLLM, TINY_SERVE_ARGS, RemoteServer, parse_sse, wait_for

API_KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_LIMIT = 64 << 10
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--api-key",
        API_KEY,
        "--max-request-body-bytes",
        str(BODY_LIMIT),
    ) as remote:
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def greedy(**kw):
    return dict(model="tiny", temperature=0.0, **kw)


# ---- completions ----


def test_completion_reports_text_finish_reason_and_usage(server, client):
    out = client.completions.create(prompt=PROMPT, max_tokens=7, extra_body={"ignore_eos": True}, **greedy())
    prompt_tokens = server.post_json("/tokenize", {"prompt": PROMPT}, AUTH)[1]["count"]
    assert out.object == "text_completion" and out.model == "tiny" and out.id.startswith("cmpl-")
    assert len(out.choices) == 1 and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        prompt_tokens,
        7,
        prompt_tokens + 7,
    )


def test_streamed_completion_concatenates_to_the_whole_one(client):
    whole = client.completions.create(prompt=PROMPT, max_tokens=12, **greedy()).choices[0]
    chunks = list(
        client.completions.create(
            prompt=PROMPT, max_tokens=12, stream=True, stream_options={"include_usage": True}, **greedy()
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2] if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 12


def test_batch_of_prompts_with_n_numbers_choices_prompt_major(client):
    out = client.completions.create(
        prompt=[PROMPT, "Once upon a time"],
        n=2,
        max_tokens=4,
        seed=1,
        model="tiny",
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 16


def test_token_id_prompt_with_echo_and_logprobs(server, client):
    ids = server.post_json("/tokenize", {"prompt": PROMPT}, AUTH)[1]["tokens"]
    out = client.completions.create(prompt=ids, echo=True, logprobs=2, max_tokens=3, **greedy())
    choice = out.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3 == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and "".join(lp.tokens) == choice.text


def test_echo_with_max_tokens_0_answers_the_prompt_and_its_logprobs(server, client):
    """OpenAI's and vLLM's way to score a prompt, streamed and not; before, a 400 (max_tokens
    must be at least 1). Without echo, max_tokens 0 is a 400 naming it."""
    ids = server.post_json("/tokenize", {"prompt": PROMPT}, AUTH)[1]["tokens"]
    out = client.completions.create(prompt=PROMPT, echo=True, logprobs=1, max_tokens=0, **greedy())
    (choice,) = out.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == PROMPT and lp.token_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 0)
    chunks = [
        c
        for c in client.completions.create(prompt=PROMPT, echo=True, logprobs=1, max_tokens=0, stream=True, **greedy())
        if c.choices
    ]
    assert "".join(c.choices[0].text for c in chunks) == PROMPT and chunks[-1].choices[0].finish_reason == "length"
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks) == len(ids)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(prompt=PROMPT, max_tokens=0, **greedy())
    assert info.value.body["param"] == "max_tokens"


def test_stop_string_cuts_the_text_before_it(client):
    text = (
        client.completions.create(prompt=PROMPT, max_tokens=24, **greedy(), extra_body={"ignore_eos": True})
        .choices[0]
        .text
    )
    start = next(i for i in range(len(text) // 2, len(text) - 3) if text[i : i + 3].strip())
    stop = text[start : start + 3]
    out = client.completions.create(
        prompt=PROMPT, max_tokens=24, stop=[stop], **greedy(), extra_body={"ignore_eos": True}
    ).choices[0]
    assert out.finish_reason == "stop" and out.text == text[: text.index(stop)]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            prompt=PROMPT, max_tokens=24, stop=[stop], stream=True, **greedy(), extra_body={"ignore_eos": True}
        )
    )
    assert streamed == out.text


# ---- chat ----

MESSAGES = [{"role": "user", "content": "Hello! Who are you?"}]


def test_chat_completion_uses_the_tokenizer_chat_template(server, client):
    out = client.chat.completions.create(messages=MESSAGES, max_tokens=6, **greedy())
    rendered = server.post_json("/tokenize", {"messages": MESSAGES}, AUTH)[1]["count"]
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.usage.prompt_tokens == rendered > 10  # the ChatML template wraps the message
    assert out.choices[0].finish_reason in ("length", "stop")


def test_streamed_chat_opens_with_the_role_and_ends_with_finish_reason(server, client):
    whole = client.chat.completions.create(messages=MESSAGES, max_completion_tokens=10, **greedy())
    chunks = list(client.chat.completions.create(messages=MESSAGES, max_completion_tokens=10, stream=True, **greedy()))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_n_and_logprobs(client):
    out = client.chat.completions.create(
        messages=MESSAGES,
        n=3,
        max_tokens=5,
        logprobs=True,
        top_logprobs=2,
        model="tiny",
        temperature=0.8,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    for choice in out.choices:
        content = choice.logprobs.content
        assert len(content) == 5 and all(len(t.top_logprobs) <= 2 and t.logprob <= 0 for t in content)
        assert "".join(t.token for t in content) == choice.message.content
    assert out.usage.completion_tokens == 15


# ---- the small endpoints ----


def test_models_health_version_tokenize_detokenize(server, client):
    models = client.models.list().data
    assert [(m.id, m.root) for m in models] == [("tiny", "tiny")]  # the served name, never the local path
    assert server.get("/health")[0] == 200
    assert "version" in json.loads(server.get("/version")[1])
    ids = server.post_json("/tokenize", {"prompt": PROMPT}, AUTH)[1]["tokens"]
    assert server.post_json("/detokenize", {"tokens": ids}, AUTH)[1] == {"prompt": PROMPT}


def test_metrics_count_requests_and_latencies(server, client):
    client.completions.create(prompt=PROMPT, max_tokens=3, **greedy())
    m = server.metrics()
    assert m["vllm:request_success_total"] >= 1 and m["vllm:generation_tokens_total"] >= 3
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert m[f"vllm:{name}_count"] >= 1
    assert "vllm:kv_cache_usage_perc" in m and "vllm:num_requests_waiting" in m
    assert m["ringllm:transport_latency_seconds_count"] >= 3  # one sample per step's outputs


# ---- errors, in OpenAI's shape ----


def _error(status_body):
    status, body, _ = status_body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return status, body["error"]


def test_invalid_json_and_invalid_fields_are_400_naming_the_field(server):
    status, err = _error(server.post_json("/v1/completions", b"{not json", AUTH))
    assert status == 400 and err["code"] == "invalid_json"
    for payload, field in [
        ({"model": "tiny", "prompt": "x", "temperature": 5}, "temperature"),
        ({"model": "tiny", "prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"model": "tiny"}, "prompt"),
        ({"model": "tiny", "prompt": "x", "logprobs": 50}, "logprobs"),
        ({"model": "tiny", "prompt": [1, [2]]}, "prompt"),
        ({"model": "tiny", "prompt": "x", "n": 0}, "n"),
    ]:
        status, err = _error(server.post_json("/v1/completions", payload, AUTH))
        assert (status, err["param"]) == (400, field), (payload, err)
    status, err = _error(server.post_json("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "x"}]}, AUTH))
    assert status == 400 and err["param"] == "messages"


def test_top_k_above_the_vocabulary_with_top_p_is_served(server):
    """It used to kill the EngineCore (an index past the end of the row in the top-p path)."""
    for top_k in (49153, 10**6):
        status, body, _ = server.post_json(
            "/v1/completions",
            {"prompt": PROMPT, "top_k": top_k, "top_p": 0.9999, "max_tokens": 3, "ignore_eos": True},
            AUTH,
        )
        assert status == 200 and body["usage"]["completion_tokens"] == 3, body
    assert server.get("/health")[0] == 200


@pytest.mark.parametrize(
    "path,extra,field",
    [
        ("/v1/completions", {"seed": 2**64}, "seed"),
        ("/v1/completions", {"seed": -(2**63) - 1}, "seed"),
        ("/v1/completions", {"max_tokens": 2**64}, "max_tokens"),
        ("/v1/completions", {"min_tokens": 2**64}, "min_tokens"),
        ("/v1/completions", {"stop_token_ids": [1, 2**64]}, "stop_token_ids"),
        ("/v1/completions", {"top_k": 2**64}, "top_k"),
        ("/v1/completions", {"logprobs": 2**64}, "logprobs"),
        ("/v1/completions", {"prompt": [1, 2**64]}, "prompt"),
        ("/v1/completions", {"n": 2**64}, "n"),
        ("/v1/completions", {"max_tokens": True}, "max_tokens"),
        ("/v1/completions", {"seed": 1.5}, "seed"),
        ("/v1/chat/completions", {"max_completion_tokens": 2**64}, "max_completion_tokens"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2**64}, "top_logprobs"),
        ("/v1/chat/completions", {"seed": 2**70}, "seed"),
    ],
)
def test_integers_beyond_64_bits_or_of_the_wrong_type_are_400_naming_the_field(server, path, extra, field):
    """Such ints used to pass the decoder and fail as 500 when sent to the core (msgpack overflow)."""
    base = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    status, err = _error(server.post_json(path, {**base, "max_tokens": 2, **extra}, AUTH))
    assert (status, err["param"], err["type"]) == (400, field, "invalid_request_error"), err


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"min_tokens": 5, "max_tokens": 3}, "min_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
        ({"top_k": -2}, "top_k"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_sampling_params_refusals_name_their_field(server, extra, field):
    status, err = _error(server.post_json("/v1/completions", {"prompt": PROMPT, **extra}, AUTH))
    assert (status, err["param"]) == (400, field), err


def test_deeply_nested_json_is_400_and_the_server_keeps_serving(server):
    """It used to be a 500 (msgspec's RecursionError), nested in a known field or an unknown one."""
    depth = (BODY_LIMIT - 200) // 2
    nested = b"[" * depth + b"]" * depth
    for path, body in [
        ("/v1/completions", b'{"prompt": "x", "junk": ' + nested + b"}"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"a": ' + nested + b"}}",
        ),
    ]:
        status, err = _error(server.post_json(path, body, AUTH))
        assert status == 400 and err["code"] == "invalid_json", err
    assert _error(server.post_json("/v1/completions", nested, AUTH))[0] == 400  # not even an object
    status, body, _ = server.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, AUTH)
    assert status == 200


def test_engine_death_answers_a_short_message_and_logs_the_traceback(caplog):
    """The core's report (a traceback with file paths) goes to the server log, once; the HTTP
    body says only that the engine is gone."""
    try:
        raise RuntimeError("index 49153 is out of bounds for dimension 1 with size 49152")
    except RuntimeError:
        report = traceback.format_exc()
    dead = EngineDeadError(report)
    assert str(dead).endswith("RuntimeError: index 49153 is out of bounds for dimension 1 with size 49152")
    assert dead.cause == report
    with caplog.at_level(logging.ERROR, logger="engine.entrypoints.openai.serving_engine"):
        errors = [to_openai_error(dead) for _ in range(3)]
    for error in errors:
        assert (error.status, error.code, error.type) == (500, "engine_dead", "server_error")
        assert "Traceback" not in error.message and __file__ not in error.message and "/" not in error.message
    assert sum(__file__ in record.getMessage() for record in caplog.records) == 1


def test_parameter_errors_carry_their_field_to_the_http_error():
    error = to_openai_error(ParameterError("the prompt is empty", parameter="prompt"))
    assert (error.status, error.param, error.message) == (400, "prompt", "the prompt is empty")
    assert to_openai_error(ValueError("no field: here")).param is None  # nothing read out of the text


def test_prompt_longer_than_the_context_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(prompt=[5] * 4096, max_tokens=1, model="tiny")
    assert info.value.body["param"] == "prompt"


def test_missing_or_wrong_api_key_is_401(server):
    bad = openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for path, payload in [
        ("/v1/completions", {"prompt": "x"}),
        ("/tokenize", {"prompt": "x"}),
        ("/detokenize", {"tokens": [1]}),
        ("/v1/nothing-here", {}),
    ]:
        status, err = _error(server.post_json(path, payload))
        assert status == 401 and err["type"] == "authentication_error", path
    # The probes stay open: a load balancer or a scraper holds no key.
    assert [server.get(path)[0] for path in ("/health", "/metrics", "/version")] == [200, 200, 200]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert info.value.body["code"] == "model_not_found"


def test_body_over_the_limit_is_413_and_unknown_route_404(server):
    status, err = _error(server.post_json("/v1/completions", {"prompt": "x" * BODY_LIMIT}, AUTH))
    assert status == 413

    async def chunked() -> tuple[int, dict]:  # no Content-Length: the limit applies while reading
        async def body():
            yield b'{"prompt": "'
            for _ in range(BODY_LIMIT // 1024):
                yield b"x" * 1024
            yield b'"}'

        async with aiohttp.ClientSession() as session:
            async with session.post(server.url + "/v1/completions", data=body(), headers=AUTH) as resp:
                return resp.status, await resp.json()

    status, body = asyncio.run(chunked())
    assert status == 413 and set(body["error"]) == {"message", "type", "param", "code"}
    status, err = _error(server.post_json("/v1/nothing-here", {}, AUTH))
    assert status == 404


# ---- disconnects and concurrency ----


async def _stream_then_drop(url: str) -> None:
    payload = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1900, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=payload, headers=AUTH) as resp:
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")
            await resp.content.readuntil(b"\n\n")
        # leaving the block closes the connection mid-stream


async def _wait_then_drop(url: str) -> None:
    payload = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1900, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            async with asyncio.timeout(0.3):
                await session.post(url + "/v1/completions", json=payload, headers=AUTH)


@pytest.mark.parametrize("drop", [_stream_then_drop, _wait_then_drop], ids=["streaming", "non-streaming"])
def test_client_disconnect_aborts_the_request_in_the_core(server, drop):
    asyncio.run(drop(server.url))
    # 1900 tokens would take seconds; an abort empties the core within a step or two.
    assert wait_for(lambda: server.unfinished_in_core() == 0, timeout=1.0)


def test_64_concurrent_streams_all_complete_well_formed(server):
    async def one(session: aiohttp.ClientSession, i: int) -> list:
        payload = {
            "model": "tiny",
            "prompt": f"{PROMPT} {i}",
            "max_tokens": 32,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(server.url + "/v1/completions", json=payload, headers=AUTH) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            return parse_sse(await resp.read())

    async def all_streams() -> list:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            return await asyncio.gather(*(one(session, i) for i in range(64)))

    for events in asyncio.run(all_streams()):
        *chunks, usage = events
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 32
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
        assert all(c["id"] == chunks[0]["id"] for c in chunks)
    assert server.unfinished_in_core() == 0


# ---- the command-line clients ----


def test_ringllm_complete_quick_prints_a_completion(server):
    out = subprocess.run(
        [*RINGLLM, "complete", "--url", server.base_url, "--api-key", API_KEY, "--max-tokens", "4", "--quick", PROMPT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_ringllm_chat_keeps_a_conversation_over_stdin(server):
    out = subprocess.run(
        [
            *RINGLLM,
            "chat",
            "--url",
            server.base_url,
            "--api-key",
            API_KEY,
            "--max-tokens",
            "4",
            "--system-prompt",
            "Be brief.",
        ],
        input="Hello\nAnd then?\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("> ") == 3  # two turns answered, then the prompt that read end-of-input


@pytest.mark.model
def test_default_model_answers_a_chat_question():
    with RemoteServer("--max-model-len", "512") as remote:  # no MODEL: the embedded default model
        client = openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0)
        out = client.chat.completions.create(
            model=client.models.list().data[0].id,
            temperature=0.0,
            max_tokens=20,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in out.choices[0].message.content
