"""Connections cannot hold the server: idle ones, half-sent heads (slowloris) and bodies that
stop are closed within their timeouts, the number open is capped below the open-file limit (one
more evicts the longest idle; with all busy, a 503), and /health answers throughout. A real
``ringllm serve`` under a low open-file limit; every client is on loopback and bounded in count.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, wait_for

SOFT_NOFILE, HARD_NOFILE = 200, 256  # the server raises its soft limit to the hard one
TIMEOUTS = ["--header-timeout", "3", "--keep-alive-timeout", "2", "--body-timeout", "3"]
CLOSE_DEADLINE_S = 60.0  # generous: the timeouts are 2-3 s
NUM_IDLE, NUM_SLOWLORIS = 300, 200
NUM_BURST = 300  # connections made at once, past asyncio's default listen backlog of 100


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    remote = RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", *TIMEOUTS)
    remote.argv = ["prlimit", f"--nofile={SOFT_NOFILE}:{HARD_NOFILE}", "--", *remote.argv]  # prlimit execs
    with remote:
        yield remote


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or reset), reading whatever it sent first."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _read_until_closed(sock: socket.socket, deadline_s: float) -> bytes:
    sock.settimeout(deadline_s)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


class HealthProber:
    """Probes /health on a new connection each time (as a load balancer does) from a thread,
    recording every answer, until stopped."""

    def __init__(self, port: int) -> None:
        self.port, self.results, self._stop = port, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                conn.request("GET", "/health")
                self.results.append(conn.getresponse().status)
            except OSError as exc:
                self.results.append(repr(exc))
            finally:
                conn.close()
            self._stop.wait(0.1)

    def __enter__(self) -> "HealthProber":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


def test_the_open_file_limit_is_raised_to_the_hard_limit(server):
    with open(f"/proc/{server.proc.pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    assert line.split()[3:5] == [str(HARD_NOFILE), str(HARD_NOFILE)]


@pytest.mark.slow
def test_idle_and_slowloris_connections_are_closed_and_health_answers_throughout(server):
    with HealthProber(server.port) as prober:
        assert wait_for(lambda: len(prober.results) >= 3, 30)
        idle = [_connect(server.port) for _ in range(NUM_IDLE)]
        slow = []
        for _ in range(NUM_SLOWLORIS):  # half a head each, drip-fed below
            sock = _connect(server.port)
            try:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ")
            except OSError:
                pass  # already evicted to make room (the cap is below NUM_IDLE + NUM_SLOWLORIS)
            slow.append(sock)
        open_socks = set(idle + slow)
        deadline = time.monotonic() + CLOSE_DEADLINE_S
        while open_socks and time.monotonic() < deadline:
            for sock in list(open_socks):
                if _closed_by_server(sock):
                    open_socks.discard(sock)
                elif sock in slow:
                    try:
                        sock.send(b"a")  # one byte more of the header, never its end
                    except OSError:
                        open_socks.discard(sock)
            time.sleep(0.3)
        probes_during_attack = len(prober.results)
        assert wait_for(lambda: len(prober.results) >= probes_during_attack + 3, 30)
    for sock in idle + slow:
        sock.close()
    assert not open_socks, f"{len(open_socks)} of {NUM_IDLE + NUM_SLOWLORIS} connections were never closed"
    assert prober.results and all(status == 200 for status in prober.results), [
        status for status in prober.results if status != 200
    ][:5]


@pytest.mark.parametrize(
    "head, body",
    [
        (b"Content-Length: 100\r\n", b'{"model": "tiny", '),
        (b"Transfer-Encoding: chunked\r\n", b'12\r\n{"model": "tiny", \r\n'),  # a chunked body that never ends
    ],
)
def test_a_body_that_stops_is_a_408_and_the_connection_is_closed(server, head, body):
    sock = _connect(server.port)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + head
        + b"\r\n"
        + body
    )
    response = _read_until_closed(sock, CLOSE_DEADLINE_S)  # returns once the server has closed it
    sock.close()
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and "did not arrive within 3 s" in error["message"]


def test_a_keep_alive_connection_is_closed_after_the_keep_alive_timeout(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/v1/models")
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Connection", "keep-alive") != "close"
    response.read()
    assert _read_until_closed(conn.sock, CLOSE_DEADLINE_S) == b""  # no byte, then the server's close
    conn.close()


def _start_stream(port: int) -> socket.socket:
    sock = _connect(port)
    body = json.dumps(
        {"model": "tiny", "prompt": "Hello", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    ).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert sock.recv(15) == b"HTTP/1.1 200 OK"  # streaming: the connection is busy until the end
    return sock


@pytest.mark.slow
def test_past_the_cap_with_every_connection_busy_a_new_one_gets_503(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--max-connections", "2"
    ) as remote:
        busy = [_start_stream(remote.port) for _ in range(2)]
        try:
            sock = _connect(remote.port)
            response = _read_until_closed(sock, CLOSE_DEADLINE_S)
            sock.close()
            assert response.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "overloaded"
        finally:
            for sock in busy:
                sock.close()  # the client leaves: the streams are aborted, the slots free
        assert wait_for(lambda: remote.get("/health")[0] == 200, 30)


def test_an_idle_connection_past_the_cap_makes_room_for_a_probe(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--max-connections",
        "2",
        "--keep-alive-timeout",
        "600",
        "--header-timeout",
        "600",
    ) as remote:
        idle = [_connect(remote.port) for _ in range(2)]
        assert remote.get("/health")[0] == 200  # its connection evicted the longest-idle one ...
        assert wait_for(lambda: _closed_by_server(idle[0]), CLOSE_DEADLINE_S)
        assert remote.get("/health")[0] == 200  # ... which made room: the other one stays
        assert not _closed_by_server(idle[1])
        for sock in idle:
            sock.close()


def test_connection_flags_are_validated():
    out = subprocess.run(
        RemoteServer("x", "--header-timeout", "0").argv,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0 and "header_timeout_s must be > 0" in out.stderr and "Traceback" not in out.stderr


def _accept_queue(port: int) -> int:
    """Connections waiting in the listener's accept queue (/proc/net/tcp: a LISTEN socket's
    rx_queue is its count of completed handshakes not yet accepted)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"no listener on port {port}")


def test_a_burst_of_connections_waits_in_the_accept_queue(server):
    """A server too busy to accept for a moment (stopped here) keeps every handshake of a burst:
    past a full queue the kernel drops the handshake's last ACK, and those clients' requests then
    wait on TCP retransmission for seconds (or meet the keep-alive timeout unread)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    socks = []
    try:
        for _ in range(NUM_BURST):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", server.port))
            socks.append(sock)
        assert wait_for(lambda: _accept_queue(server.port) == NUM_BURST, 30), _accept_queue(server.port)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        for sock in socks:
            sock.close()
    assert wait_for(lambda: server.get("/health")[0] == 200, 30)
