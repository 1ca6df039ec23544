"""No request can freeze or flood the server: huge prompts are refused from their size or worked
off the event loop (so /health keeps answering), admission counts sequences (prompts x n) and
refuses before anything reaches the core, a batch's disconnect is one abort message, and a
SIGTERM drain ends the requests still running cleanly. Real ``ringllm serve`` processes on the
tiny dummy-weight model (one in-process app where the core's messages are counted).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys

import aiohttp
import pytest

from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, parse_sse, wait_for

PROMPT = "The capital of France is"
BIG_BYTES = 4 << 20
HEALTH_BUDGET_S = 0.2  # the one timing bound: /health answers within 200 ms, always


def big_text(size: int = BIG_BYTES) -> str:
    """~``size`` bytes of varied words (tokenizing it takes seconds)."""
    rng = random.Random(0)
    words = ["hello", "world", "the", "capital", "of", "France", "is", "Paris", "zebra", "quantum"]
    return " ".join(rng.choice(words) for _ in range(size // 5))[:size]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--max-request-body-bytes",
        str(2 * BIG_BYTES),
        "--max-waiting-requests",
        "8",
    ) as remote:
        yield remote


# Probes /health back to back on one keep-alive connection until its stdin closes, then prints
# each probe's (seconds, status) as JSON. A process of its own: neither the test's event loop,
# busy uploading megabytes, nor its GIL (parsing megabytes of JSON) can delay a probe.
PROBER = """
import http.client, json, sys, threading, time
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conn, probes = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10), []
while not stop.is_set():
    start = time.perf_counter()
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        status = response.status
    except OSError as exc:  # a probe that timed out or failed counts, with its time
        status = repr(exc)
        conn.close()
    probes.append((time.perf_counter() - start, status))
    if len(probes) <= 3:  # up and probing
        print(len(probes), flush=True, file=sys.stderr)
    time.sleep(0.01)
print(json.dumps(probes))
"""


class HealthProber:
    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBER, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_started(self, probes: int = 3) -> None:
        for _ in range(probes):
            assert self.proc.stderr.readline(), "the prober died"

    def finish(self) -> list[tuple[float, object]]:
        out, _ = self.proc.communicate("", timeout=60)
        return [tuple(p) for p in json.loads(out)]


def test_health_answers_within_200ms_while_4mb_prompts_are_refused_or_tokenized(server):
    text = big_text()
    bodies = [
        ("/tokenize", {"prompt": text}),
        ("/tokenize", {"messages": [{"role": "user", "content": text}]}),
        ("/v1/completions", {"prompt": text, "max_tokens": 1}),
        ("/v1/completions", {"prompt": [text, PROMPT], "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "stream": True}),
    ]
    encoded = [(path, json.dumps(body).encode()) for path, body in bodies]

    async def send_all() -> list[tuple[str, int, dict]]:
        async def one(session: aiohttp.ClientSession, path: str, data: bytes):
            async with session.post(server.url + path, data=data, headers={"Content-Type": "application/json"}) as resp:
                return path, resp.status, await resp.json()

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            return await asyncio.gather(*(one(session, path, data) for path, data in encoded))

    prober = HealthProber(server.port)
    try:
        prober.wait_started()
        results = asyncio.run(send_all())
    finally:
        probes = prober.finish()
    by_path = {}
    for path, status, body in results:
        by_path.setdefault(path, []).append((status, body))
    # Tokenized off the loop (or refused as overload, never a hang), and the too-long ones refused.
    assert all(s == 200 and b["count"] > 100_000 or s == 503 for s, b in by_path["/tokenize"]), by_path["/tokenize"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        for status, body in by_path[path]:
            assert status == 400 and body["error"]["param"] in ("prompt", "messages"), (path, body)
            assert "max_model_len" in body["error"]["message"]
    assert {status for _, status in probes} == {200}
    slow = [round(t, 3) for t, _ in probes if t > HEALTH_BUDGET_S]
    assert not slow, f"/health took {slow} s of {len(probes)} probes while 4 MB prompts were in flight"


def test_a_prompt_too_long_for_the_model_is_refused_from_its_size(server):
    for payload in (
        {"prompt": "x " * (BIG_BYTES // 2), "max_tokens": 1},
        {"prompt": ["hi", "y" * BIG_BYTES], "max_tokens": 1},
    ):
        status, body, _ = server.post_json("/v1/completions", payload)
        assert status == 400 and body["error"]["param"] == "prompt" and "bytes" in body["error"]["message"]


def test_admission_counts_sequences_and_refuses_before_the_core(server):
    before = server.metrics().get("vllm:prompt_tokens_total", 0.0)
    # 8 prompts x n=128 = 1024 sequences against a waiting limit of 8: overload, retry later.
    status, body, headers = server.post_json("/v1/completions", {"prompt": ["a"] * 8, "n": 128, "max_tokens": 1})
    assert status == 503 and body["error"]["code"] == "overloaded" and int(headers["Retry-After"]) >= 1
    # 2000 prompts x n=128 (256,000 engine requests) in a 10 KB body: more than the engine can ever hold.
    payload = json.dumps({"prompt": ["a"] * 2000, "n": 128, "max_tokens": 1}).encode()
    assert len(payload) <= 10 << 10
    status, body, _ = server.post_json("/v1/completions", payload)
    assert status == 400 and body["error"]["code"] == "too_many_sequences"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    status, body, headers = server.post_json(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 9, "max_tokens": 1}
    )
    assert status == 503 and "Retry-After" in headers
    # Nothing reached the core: no prompt was processed.
    assert server.metrics().get("vllm:prompt_tokens_total", 0.0) == before
    # Within the limit: 2 prompts x n=4 = 8 sequences run.
    status, body, _ = server.post_json("/v1/completions", {"prompt": ["a", "b"], "n": 4, "max_tokens": 1})
    assert status == 200 and len(body["choices"]) == 8


def test_tokenize_and_detokenize_of_large_inputs_round_trip(server):
    text = big_text(256 << 10)
    status, body, _ = server.post_json("/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200 and body["count"] == len(body["tokens"]) > 10_000
    status, out, _ = server.post_json("/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and out["prompt"] == text


# ---- one abort message for a whole batch ----


async def test_a_batch_disconnect_is_one_abort_message_to_the_core(tiny_model_dir):
    from aiohttp.test_utils import TestServer

    from engine.async_llm import build_async_engine_client_from_engine_args
    from engine.config import AsyncEngineArgs
    from engine.entrypoints.openai.server import SERVING, ServerSettings, build_app

    args = AsyncEngineArgs(
        model=tiny_model_dir, load_format="dummy", dtype="float32", num_threads=1, kv_cache_memory=64 << 20, seed=0
    )
    app = build_app(build_async_engine_client_from_engine_args(args), ServerSettings())
    async with TestServer(app) as test_server, aiohttp.ClientSession() as session:
        engine = app[SERVING].completion.engine
        core = engine.engine_core
        aborts: list[list[str]] = []
        send_abort = core.abort_requests_nowait

        def counting_abort(request_ids):  # the real call, counted
            if request_ids:
                aborts.append(list(request_ids))
            return send_abort(request_ids)

        core.abort_requests_nowait = counting_abort
        payload = {
            "prompt": [f"{PROMPT} {i}" for i in range(16)],
            "n": 2,
            "max_tokens": 1900,
            "ignore_eos": True,
            "stream": True,
        }
        async with session.post(str(test_server.make_url("/v1/completions")), json=payload) as resp:
            assert resp.status == 200
            for _ in range(4):
                await resp.content.readuntil(b"\n\n")
        # the connection is closed mid-stream: the handler is cancelled

        async def unfinished() -> int:
            stats = await core.call_utility_async("get_stats")
            return stats["num_running_reqs"] + stats["num_waiting_reqs"]

        async with asyncio.timeout(10):
            while aborts == [] or await unfinished():
                await asyncio.sleep(0.05)
        assert len(aborts) == 1, f"{len(aborts)} abort messages: {aborts}"
        assert len(aborts[0]) == 32  # 16 prompts x n=2, all in the one message


# ---- the end of a drain ----


@pytest.fixture(scope="module")
def tiny_long_model(tmp_path_factory) -> str:
    from engine.models.default_model import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-long")), max_position_embeddings=8192)


def test_streams_still_running_at_the_end_of_the_drain_get_an_error_event_and_done(tiny_long_model):
    long = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8000, "ignore_eos": True}
    with RemoteServer(
        tiny_long_model, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--drain-timeout", "1"
    ) as remote:

        async def scenario():
            async with aiohttp.ClientSession() as session:
                streams = [
                    await session.post(remote.url + path, json=body)
                    for path, body in [
                        ("/v1/completions", {**long, "stream": True}),
                        (
                            "/v1/chat/completions",
                            {**long, "messages": [{"role": "user", "content": "Hi"}], "stream": True},
                        ),
                    ]
                ]
                firsts = [await s.content.readuntil(b"\n\n") for s in streams]
                whole = asyncio.create_task(session.post(remote.url + "/v1/completions", json=long))
                assert await asyncio.to_thread(wait_for, lambda: remote.unfinished_in_core() == 3, 10)
                remote.proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    ends = [parse_sse(first + await s.read()) for first, s in zip(firsts, streams)]
                    refused = await whole
                    return ends, refused.status, await refused.json()

        ends, status, body = asyncio.run(scenario())
        for events in ends:
            assert "choices" in events[0] and len(events) > 2
            assert events[-1]["error"]["code"] == "server_shutdown", events[-1]
        assert status == 503 and body["error"]["code"] == "server_shutdown"
        assert remote.proc.wait(30) == 0


# ---- routes ----


def test_routes_call_their_serving_methods_directly():
    """Each route's handler is a module-level function of server.py, found by its name (no
    handler built from a string at run time)."""
    from engine.entrypoints.openai import server

    for route in server.ROUTES:
        assert getattr(server, route.handler.__name__) is route.handler, route.path
