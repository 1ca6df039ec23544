"""A client that hangs up at any write of a stream, the last included, is routine: the stream
ends quietly (a debug line), never with a traceback in the server's log (the soak test once saw
one from the closing ``data: [DONE]`` write)."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from engine.entrypoints.openai.serving_engine import OPENAI_SSE, Deadlines, OpenAIServing, ServingLimits


def _serving() -> OpenAIServing:
    serving = OpenAIServing.__new__(OpenAIServing)  # sse_response needs only its limits and deadlines
    serving.limits = ServingLimits(None, None, 1, 1)
    serving.deadlines = Deadlines()
    return serving


async def _events():
    for i in range(3):
        yield {"i": i}


def _stream_with_reset_at(monkeypatch, caplog, fails_on) -> list[bytes]:
    written: list[bytes] = []

    async def prepare(self, request):
        return None

    async def write(self, data):
        if fails_on(data):
            raise ConnectionResetError("Cannot write to closing transport")
        written.append(data)

    async def write_eof(self, data=b""):
        written.append(b"<eof>")

    monkeypatch.setattr(web.StreamResponse, "prepare", prepare)
    monkeypatch.setattr(web.StreamResponse, "write", write)
    monkeypatch.setattr(web.StreamResponse, "write_eof", write_eof)
    request = make_mocked_request("POST", "/v1/completions")
    with caplog.at_level(logging.DEBUG, logger="engine.entrypoints.openai.serving_engine"):
        asyncio.run(_serving().sse_response(request, _events()))
    assert "client left /v1/completions" in caplog.text
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG]
    return written


def test_a_reset_at_the_closing_write_ends_the_stream_quietly(monkeypatch, caplog):
    written = _stream_with_reset_at(monkeypatch, caplog, lambda data: data == OPENAI_SSE.end)
    assert len(written) == 3 and b"<eof>" not in written  # the events went out, the end could not


def test_a_reset_mid_stream_ends_it_quietly(monkeypatch, caplog):
    written = _stream_with_reset_at(monkeypatch, caplog, lambda data: b'"i":1' in data)
    assert len(written) == 1
