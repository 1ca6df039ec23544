"""/health tells the truth about the EngineCore: a core that is stopped (SIGSTOP) has not died,
so only a liveness probe can see it. /health turns 503 within the bound while a request is in
flight, answers at once meanwhile (it never waits on the core), and turns 200 again when the
core is continued, and the request then finishes. A real ``ringllm serve`` on the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request

import pytest

from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, parse_sse, wait_for

BUSY_TIMEOUT_S = 2.0  # the server's bound with work; the deadlines below are generous multiples
PROBE_DEADLINE_S = 60.0
MAX_TOKENS = 1000  # a second or more of decoding on the tiny model: in flight when the core is stopped


def _health(remote: RemoteServer) -> tuple[int, dict]:
    status, body, _ = remote.get("/health")
    return status, json.loads(body) if body else {}


@pytest.mark.slow
def test_health_turns_503_while_the_core_is_stopped_and_200_when_it_continues(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--health-busy-timeout", str(BUSY_TIMEOUT_S)
    ) as remote:
        (core,) = remote.core_pids()
        started, result = threading.Event(), {}

        def generate() -> None:  # a stream long enough to be in flight throughout
            body = json.dumps(
                {
                    "model": "tiny",
                    "prompt": "Hello",
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            )
            request = urllib.request.Request(
                remote.url + "/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=300) as response:  # it waits out the stop
                first = response.readline()  # the first event: the request is running in the core
                started.set()
                result["events"] = parse_sse(first + response.read())

        client = threading.Thread(target=generate)
        client.start()
        try:
            assert started.wait(60), "the stream never started"
            os.kill(core, signal.SIGSTOP)
            try:
                seen: list = []
                assert wait_for(lambda: seen.append(_health(remote)) or seen[-1][0] == 503, PROBE_DEADLINE_S), (
                    f"/health stayed {seen[-1]} with the core stopped"
                )
                error = seen[-1][1]["error"]
                assert error["code"] == "engine_unresponsive" and "with requests in flight" in error["message"]
                # Answered, not left waiting on the stopped core (from the last verdict).
                assert _health(remote)[0] == 503
            finally:
                os.kill(core, signal.SIGCONT)
            assert wait_for(lambda: _health(remote)[0] == 200, PROBE_DEADLINE_S), "/health did not come back"
        finally:
            client.join(120)
        events = result["events"]  # the request finished whole once the core went on
        assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]
        assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS


@pytest.mark.slow
def test_an_idle_stopped_core_is_reported_after_the_idle_bound(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir, *TINY_SERVE_ARGS, "--health-busy-timeout", "1", "--health-idle-timeout", "3"
    ) as remote:
        (core,) = remote.core_pids()
        os.kill(core, signal.SIGSTOP)
        try:
            assert wait_for(lambda: _health(remote)[0] == 503, PROBE_DEADLINE_S)
            assert "while idle" in _health(remote)[1]["error"]["message"]
        finally:
            os.kill(core, signal.SIGCONT)
        assert wait_for(lambda: _health(remote)[0] == 200, PROBE_DEADLINE_S)
