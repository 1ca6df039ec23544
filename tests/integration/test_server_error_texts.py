"""Error bodies are for clients: a body whose Content-Encoding data is bad is a 400 in OpenAI's
shape with no traceback in the log, and no error text names the server's modules or classes.
"""

from __future__ import annotations

import gzip
import http.client
import json
import zlib

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.public_errors import public_error, public_message
from engine.entrypoints.openai.server import error_middleware
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def logged_server(tiny_model_dir, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", log=log) as remote:
        remote.log_path = log
        yield remote


def _post(remote: RemoteServer, body: bytes, encoding: str) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", remote.port, timeout=30)
    try:
        conn.request(
            "POST", "/v1/chat/completions", body, {"Content-Type": "application/json", "Content-Encoding": encoding}
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read()), dict(response.getheaders())
    finally:
        conn.close()


@pytest.mark.parametrize(
    "encoding, body, code",
    [
        ("gzip", b"this is not gzip data at all", "invalid_body"),
        ("deflate", b"\x78\x9c garbage that is no deflate stream", "invalid_body"),
        # Truncated: what decompresses is a prefix of the JSON, which is what is refused.
        # mtime=0: the gzip header otherwise carries the clock, and pytest-xdist refuses workers whose
        # collected test ids differ.
        ("gzip", gzip.compress(json.dumps(CHAT).encode(), mtime=0)[:20], "invalid_json"),
    ],
    ids=["not-gzip", "not-deflate", "truncated-gzip"],
)
def test_bad_content_encoding_data_is_a_400_without_a_traceback(logged_server, encoding, body, code):
    status, answer, headers = _post(logged_server, body, encoding)
    assert status == 400 and answer["error"]["code"] == code, answer
    if code == "invalid_body":
        assert "could not be read" in answer["error"]["message"] and headers.get("Connection") == "close"
    with open(logged_server.log_path) as f:
        log = f.read()
    assert "Traceback" not in log and "Unhandled exception" not in log


def test_good_content_encoding_data_is_served(logged_server):
    for encoding, data in [
        ("gzip", gzip.compress(json.dumps(CHAT).encode())),
        ("deflate", zlib.compress(json.dumps(CHAT).encode())),
    ]:
        status, answer, _ = _post(logged_server, data, encoding)
        assert status == 200 and answer["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    "raw, public",
    [
        (
            "engine.frontend.tokenizer.FastTokenizer.apply_chat_template() got multiple values for keyword argument "
            "'tools'",
            "apply_chat_template() got multiple values for keyword argument 'tools'",
        ),
        (
            "FastTokenizer.apply_chat_template() takes from 2 to 8 positional arguments",
            "apply_chat_template() takes from 2 to 8 positional arguments",
        ),
        ("expected <class 'engine.sampling_params.SamplingParams'>, got dict", "expected SamplingParams, got dict"),
        ("engine.exceptions.ParameterError: bad", "ParameterError: bad"),
        # What a client sent is echoed as it was: only qualified names of code are reduced.
        ("the model 'org.team.model' does not exist", "the model 'org.team.model' does not exist"),
        ("temperature must be >= 0, got -0.5", "temperature must be >= 0, got -0.5"),
    ],
)
def test_public_messages_name_no_module_or_class_path(raw, public):
    assert public_message(raw) == public


def test_an_internal_error_names_no_exception_type():
    error = public_error(
        OpenAIError(500, "internal server error: KeyError", type="server_error", code="internal_error")
    )
    assert error.status == 500 and "KeyError" not in error.message and "server log" in error.message


async def test_the_error_middleware_answers_with_public_texts():
    async def fails(request: web.Request) -> web.Response:
        raise TypeError(
            "engine.frontend.tokenizer.FastTokenizer.apply_chat_template() got multiple values for "
            "keyword argument 'tools'"
        )

    async def crashes(request: web.Request) -> web.Response:
        raise KeyError("engine.core.scheduler.Scheduler")

    app = web.Application(middlewares=[error_middleware])
    app.add_routes([web.post("/fails", fails), web.post("/crashes", crashes)])
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        async with session.post(server.make_url("/fails")) as response:
            assert response.status == 400
            body = await response.text()
        assert "engine." not in body and "FastTokenizer" not in body
        assert json.loads(body)["error"]["message"].startswith("apply_chat_template() got multiple values")
        async with session.post(server.make_url("/crashes")) as response:
            assert response.status == 500
            body = await response.text()
        assert "KeyError" not in body and "Scheduler" not in body
