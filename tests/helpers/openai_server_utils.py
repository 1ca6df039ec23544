"""A real ``ringllm serve`` process for the server tests, and small HTTP helpers.

The server is started exactly as a user starts it (the ``ringllm`` entry point, which builds
the app through ``build_app``), on a free loopback port, and is waited for through /health
with a deadline. On exit it gets SIGTERM, as a process manager would send, and must be gone,
its EngineCore with it, within the deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

# The tiny dummy-weight Llama: a step costs about a millisecond, so tests measure the server.
TINY_SERVE_ARGS = [
    "--load-format",
    "dummy",
    "--dtype",
    "float32",
    "--num-threads",
    "1",
    "--kv-cache-memory",
    str(64 << 20),
    "--seed",
    "0",
]
START_TIMEOUT_S = 180.0
RINGLLM = [sys.executable, "-c", "import sys; from engine.entrypoints.cli import main; sys.exit(main())"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """All live descendants of ``pid`` (from /proc, so no extra package is needed)."""
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(p) for p in f.read().split()]
            except FileNotFoundError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    frontier.append(kid)
    return found


class RemoteServer:
    def __init__(self, *serve_args: str, env: Optional[dict] = None, log: Optional[str] = None) -> None:
        """``serve_args``: what follows ``ringllm serve`` (the model first, or none for the default);
        ``log``: a file for the server's output (stdout and stderr), which is otherwise the test's."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*RINGLLM, "serve", *serve_args, "--port", str(self.port)]
        self.env = dict(os.environ, **(env or {}))
        self.log = log
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "RemoteServer":
        out = None if self.log is None else open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=None if out is None else subprocess.STDOUT,
            )
        finally:
            if out is not None:
                out.close()  # the child has its own copy
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ringllm serve exited with {self.proc.returncode} during start-up")
            try:
                if self.get("/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop(timeout=5)
        raise TimeoutError(f"ringllm serve did not answer /health within {START_TIMEOUT_S} s")

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def core_pids(self) -> set[int]:
        return descendants(self.proc.pid)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; the server (and every process under it) must be gone in time."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        children = self.core_pids()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in children), "the EngineCore outlived the server"
        return code

    def get(self, path: str, headers: Optional[dict] = None) -> tuple[int, bytes, dict]:
        return self.request("GET", path, None, headers)

    def request(
        self, method: str, path: str, body: Optional[bytes], headers: Optional[dict] = None, timeout: float = 30.0
    ) -> tuple[int, bytes, dict]:
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers)

    def post_json(
        self, path: str, payload, headers: Optional[dict] = None, timeout: float = 30.0
    ) -> tuple[int, dict, dict]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        status, data, resp_headers = self.request(
            "POST", path, body, {"Content-Type": "application/json", **(headers or {})}, timeout
        )
        return status, json.loads(data) if data else {}, resp_headers

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name (labels dropped, values of one name summed)."""
        status, body, _ = self.get("/metrics")
        assert status == 200
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
        return samples

    def unfinished_in_core(self) -> int:
        m = self.metrics()
        return int(m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"])


def constrained_tiny_server(model_dir: str, api_key: str, body_limit: int) -> RemoteServer:
    """The tiny model served as "tiny" behind ``api_key``, bodies up to ``body_limit`` bytes, auto
    tool choice with the hermes parser, and free JSON whitespace off (so constrained output cannot
    pad forever): the Responses and Messages API tests' server."""
    return RemoteServer(
        model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--api-key",
        api_key,
        "--max-request-body-bytes",
        str(body_limit),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--structured-outputs-config",
        '{"disable_any_whitespace": true}',
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def parse_sse(raw: bytes) -> list:
    """The events of a finished SSE body: each ``data:`` payload, JSON-decoded except [DONE].
    Asserts the framing OpenAI clients rely on: only ``data:`` lines, each event ends in a
    blank line, and the stream ends with exactly one [DONE]."""
    text = raw.decode()
    assert text.endswith("\n\n"), "the stream must end at an event boundary"
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ") and "\n" not in block, f"malformed SSE event {block!r}"
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    assert events and events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return events[:-1]


def parse_anthropic_sse(raw: bytes) -> list[dict]:
    """The events of a finished Anthropic SSE body: each an ``event: <type>`` line and a ``data:``
    line whose ``type`` is the same, then a blank line; no [DONE]."""
    text = raw.decode()
    assert text.endswith("\n\n"), "the stream must end at an event boundary"
    events = []
    for block in text.split("\n\n")[:-1]:
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: "), f"malformed SSE event {block!r}"
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == kind[len("event: ") :], block
        events.append(payload)
    return events


def post_while_probing_health(
    server: "RemoteServer", path: str, payload: dict, timeout: float = 30.0, interval: float = 0.0
) -> tuple[tuple, list[tuple[int, float]]]:
    """POST ``payload`` to ``path`` (answered within ``timeout``), and GET /health every
    ``interval`` s (back to back by default) while it runs: the answer, and each probe's
    (status, round trip in s)."""
    result: dict = {}
    request = threading.Thread(target=lambda: result.update(answer=server.post_json(path, payload, timeout=timeout)))
    request.start()
    probes = []
    while request.is_alive():
        sent = time.monotonic()
        probes.append((server.get("/health")[0], time.monotonic() - sent))
        time.sleep(interval)
    request.join()
    return result["answer"], probes
