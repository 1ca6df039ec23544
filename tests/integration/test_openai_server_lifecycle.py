"""The server under pressure and at the ends of its life: overload (503 + Retry-After), the
per-request timeout, the EngineCore dying under it, and a SIGTERM drain. Real processes,
the tiny dummy-weight model; the tests of one server run in file order, the death last.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import aiohttp
import pytest

from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, parse_sse, wait_for

PROMPT = "The capital of France is"
TIMEOUT_S = 0.5
# Longer than any test waits: a request this long only ends by abort, timeout or death.
LONG = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8000, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_long_model(tmp_path_factory) -> str:
    """The tiny model with room for 8192 positions and sampling defaults in its generation config."""
    from engine.models.default_model import write_tiny_model

    path = write_tiny_model(str(tmp_path_factory.mktemp("tiny-long")), max_position_embeddings=8192)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 2, "temperature": 0.0, "max_new_tokens": 7}, f)
    return path


@pytest.fixture(scope="module")
def server(tiny_long_model):
    # Two sequences at a time, so further requests wait in the scheduler: a deterministic queue.
    with RemoteServer(
        tiny_long_model,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--max-num-seqs",
        "2",
        "--max-waiting-requests",
        "2",
        "--request-timeout",
        str(TIMEOUT_S),
    ) as remote:
        yield remote


async def _first_event(session: aiohttp.ClientSession, url: str, payload: dict) -> tuple[aiohttp.ClientResponse, bytes]:
    """Open a stream; return it with its first event, once that has arrived (the request runs)."""
    resp = await session.post(url + "/v1/completions", json={**payload, "stream": True})
    assert resp.status == 200
    return resp, await resp.content.readuntil(b"\n\n")


def test_unset_sampling_fields_take_the_model_generation_config(server):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True}
    first, second = (server.post_json("/v1/chat/completions", chat)[1] for _ in range(2))
    assert first["usage"]["completion_tokens"] == 7  # max_new_tokens, with no max_tokens asked
    assert first["choices"][0]["message"] == second["choices"][0]["message"]  # temperature 0: greedy
    assert server.post_json("/v1/chat/completions", {**chat, "max_tokens": 3})[1]["usage"]["completion_tokens"] == 3


def test_requests_beyond_the_waiting_bound_get_503_with_retry_after(server):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            running = [(await _first_event(session, server.url, LONG))[0] for _ in range(2)]
            waiting = [asyncio.create_task(session.post(server.url + "/v1/completions", json=LONG)) for _ in range(2)]
            assert await asyncio.to_thread(wait_for, lambda: server.metrics()["vllm:num_requests_waiting"] == 2, 5.0)
            async with session.post(server.url + "/v1/completions", json=LONG) as refused:
                body = await refused.json()
                assert refused.status == 503 and int(refused.headers["Retry-After"]) >= 1
                assert body["error"]["code"] == "overloaded"
            for resp in running:
                resp.close()
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(scenario())
    assert wait_for(lambda: server.unfinished_in_core() == 0, timeout=2.0)


def test_request_timeout_is_504_or_an_error_event_and_aborts(server):
    start = time.monotonic()
    status, body, _ = server.post_json("/v1/completions", LONG)
    assert status == 504 and body["error"]["code"] == "timeout"
    assert time.monotonic() - start < TIMEOUT_S + 2
    status, raw, headers = server.request(
        "POST", "/v1/completions", _json({**LONG, "stream": True}), {"Content-Type": "application/json"}
    )
    events = parse_sse(raw)
    assert status == 200 and events[-1]["error"]["code"] == "timeout"
    assert all("choices" in e for e in events[:-1]) and len(events) > 1
    assert wait_for(lambda: server.unfinished_in_core() == 0, timeout=1.0)


def test_core_death_ends_streams_with_an_error_event_and_health_turns_503(server):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            resp, first = await _first_event(session, server.url, LONG)
            (core,) = server.core_pids()
            os.kill(core, signal.SIGKILL)
            async with asyncio.timeout(5):
                return parse_sse(first + await resp.read())

    events = asyncio.run(scenario())
    assert events[-1]["error"]["code"] == "engine_dead"
    assert wait_for(lambda: server.get("/health")[0] == 503, timeout=1.0)
    status, body, _ = server.post_json("/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
    assert status == 500 and body["error"]["code"] == "engine_dead"


def test_sigterm_drains_in_flight_streams_then_exits(tiny_long_model):
    with RemoteServer(tiny_long_model, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as remote:
        cores = remote.core_pids()

        async def scenario():
            async with aiohttp.ClientSession() as session:
                resp, first = await _first_event(session, remote.url, {**LONG, "max_tokens": 300})
                remote.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.1)
                remote.proc.send_signal(signal.SIGTERM)  # a repeated signal must not cut the drain short
                async with asyncio.timeout(30):
                    return parse_sse(first + await resp.read())

        events = asyncio.run(scenario())
        assert events[-1]["choices"][0]["finish_reason"] == "length"  # ran to its end, not cut off
        assert remote.proc.wait(30) == 0
        assert wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in cores), timeout=5)


class SessionLeaderServer(RemoteServer):
    """The server as the leader of its own session and process group, as a shell job or a
    service is: a signal to the group (Ctrl-C in the terminal, ``kill -TERM -PGID``, a service
    manager stopping the unit) reaches the server and its EngineCore alike. ``os.setsid`` then
    ``exec`` keeps the pid, so ``proc`` is the server itself."""

    def __init__(self, *serve_args: str) -> None:
        super().__init__(*serve_args)
        self.argv = [
            sys.executable,
            "-c",
            "import os, sys; os.setsid(); os.execv(sys.argv[1], sys.argv[1:])",
            *self.argv,
        ]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_process_group_drains_streams_then_everything_exits(tiny_long_model, sig):
    """The EngineCore ignores the group's signal and serves until the drain is over (no /dev/shm
    entry or child left: conftest checks after every test)."""
    with SessionLeaderServer(tiny_long_model, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as remote:
        pgid = remote.proc.pid
        assert os.getpgid(pgid) == pgid
        cores = remote.core_pids()
        assert cores and all(os.getpgid(pid) == pgid for pid in cores)  # the group signal reaches them

        async def scenario():
            async with aiohttp.ClientSession() as session:
                resp, first = await _first_event(session, remote.url, {**LONG, "max_tokens": 300})
                os.killpg(pgid, sig)
                async with asyncio.timeout(30):
                    return parse_sse(first + await resp.read())

        events = asyncio.run(scenario())
        assert "error" not in events[-1], events[-1]
        assert events[-1]["choices"][0]["finish_reason"] == "length"  # ran to its end, not cut off
        assert remote.proc.wait(30) == 0
        assert wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in cores), timeout=5)


def _json(payload: dict) -> bytes:
    return json.dumps(payload).encode()
