"""API-server scenario: streaming tokens/s and frontend CPU per token against a mock core, for
``ringllm serve --api-server-count N``.

    python -m benchmarks.api_servers [--streams 256 1024] [--counts 1 2] [--duration 5] [--rounds 2]
    (or: ringllm bench api-servers)

The core has no model (``benchmarks.mock_core.MockWorker``: each step answers at once), in its
own process, over the real rings; everything else is ``ringllm serve`` as users run it, with the
tiny dummy-weight Llama's config and the default tokenizer (real detokenizing). One server per N
is started and kept for the run; the cases alternate over rounds (harness.py).

Each case opens ``streams`` concurrent streaming completions (``max_tokens`` each, ignore_eos,
``stream_options.include_usage``) and re-issues each as soon as it ends, for ``duration`` s. The
client is raw asyncio (it counts SSE events and reads the final usage chunk; no JSON per event)
so that it takes as little of the machine as it can. Reported: output tokens/s (completed
requests' ``completion_tokens`` over the wall time), the same per API-server process, the API
servers' CPU time (user + system, all their threads, from /proc) per streamed token, tokens per
SSE event (a core faster than the frontend hands it several tokens per request per message), and
the core's and the client's CPU per token for context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks.harness import Bench, Column

CLK_TCK = os.sysconf("SC_CLK_TCK")
_USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace")


class MockServer:
    """``ringllm serve --api-server-count N`` over the mock core, on a port of its own."""

    def __init__(self, model_dir: str, count: int, max_seqs: int) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.count = count
        argv = [
            sys.executable,
            "-c",
            "import sys; from engine.entrypoints.cli import main; sys.exit(main())",
            "serve",
            model_dir,
            "--served-model-name",
            "mock",
            "--load-format",
            "dummy",
            "--dtype",
            "float32",
            "--num-threads",
            "1",
            "--worker-cls",
            "benchmarks.mock_core.MockWorker",
            "--max-num-seqs",
            str(max_seqs),
            "--max-num-batched-tokens",
            str(max(8192, 4 * max_seqs)),
            "--max-connections",
            str(4 * max_seqs),
            "--port",
            str(self.port),
            "--api-server-count",
            str(count),
        ]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ringllm serve --api-server-count {count} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200 and len(self.api_pids()) == count:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError("the mock server did not start")

    def api_pids(self) -> list[int]:
        if self.count == 1:
            return [self.proc.pid]
        return [p for p in _children(self.proc.pid) if "api_server_proc" in _cmdline(p)]

    def core_pid(self) -> int:
        return next(p for p in _children(self.proc.pid) if "engine.core" in _cmdline(p))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _stream(port: int, body: bytes) -> tuple[int, int]:
    """One streaming completion over a connection of its own: (completion tokens, SSE events)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        events, tail = 0, b""
        while chunk := await reader.read(1 << 16):
            events += chunk.count(b"data: ")
            tail = (tail + chunk)[-4096:]
        found = _USAGE.findall(tail)
        if not found:
            raise RuntimeError(f"a stream ended without its usage: {tail[-300:]!r}")
        return int(found[-1]), events
    finally:
        writer.close()


async def _load(port: int, streams: int, duration: float, max_tokens: int) -> dict:
    body = json.dumps(
        {
            "model": "mock",
            "prompt": "Hello",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    deadline = time.monotonic() + duration
    totals = [0, 0, 0]  # tokens, events, requests

    async def client() -> None:
        while time.monotonic() < deadline:
            tokens, events = await _stream(port, body)
            totals[0] += tokens
            totals[1] += events
            totals[2] += 1

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(streams)))
    return {"tokens": totals[0], "events": totals[1], "requests": totals[2], "wall_s": time.monotonic() - start}


def measure(server: MockServer, streams: int, duration: float, max_tokens: int) -> dict:
    pids, core = server.api_pids(), server.core_pid()
    api0, core0, me0 = sum(map(_cpu_s, pids)), _cpu_s(core), time.process_time()
    r = asyncio.run(_load(server.port, streams, duration, max_tokens))
    api_cpu, core_cpu = sum(map(_cpu_s, pids)) - api0, _cpu_s(core) - core0
    client_cpu = time.process_time() - me0
    rate = r["tokens"] / r["wall_s"]
    return {
        "tok_s": rate,
        "tok_s_per_api": rate / server.count,
        "api_cpu_us_per_tok": 1e6 * api_cpu / r["tokens"],
        "core_cpu_us_per_tok": 1e6 * core_cpu / r["tokens"],
        "client_cpu_us_per_tok": 1e6 * client_cpu / r["tokens"],
        "tok_per_event": r["tokens"] / max(1, r["events"] - r["requests"] * 2),  # minus usage and [DONE]
        "requests": r["requests"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ringllm bench api-servers", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2], help="--api-server-count values")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None, help="directory for JSON/PNG (default benchmarks/out)")
    a = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket per stream
    from engine.models.default_model import write_tiny_model

    bench = Bench("api_servers", model="mock core (no model), SmolLM2 tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_model(os.path.join(tmp, "tiny"))
        servers = []
        try:
            for n in a.counts:
                servers.append(MockServer(model_dir, n, max(a.streams)))
            for s in a.streams:
                for server in servers:
                    bench.add(
                        f"{s} streams",
                        f"N={server.count}",
                        lambda server=server, s=s: measure(server, s, a.duration, a.max_tokens),
                    )
            bench.run(rounds=a.rounds)
        finally:
            for server in servers:
                server.stop()
    bench.notes.append(
        f"{a.max_tokens} tokens per request, re-issued for {a.duration} s per case; client: raw "
        "asyncio in the benchmark process"
    )
    for s in a.streams:
        sc = f"{s} streams"
        cols = [
            Column("tok/s", sc, "tok_s", "{:.0f}"),
            Column("tok/s per API server", sc, "tok_s_per_api", "{:.0f}"),
            Column("API-server CPU us/tok", sc, "api_cpu_us_per_tok", "{:.2f}"),
            Column("core CPU us/tok", sc, "core_cpu_us_per_tok", "{:.2f}"),
            Column("client CPU us/tok", sc, "client_cpu_us_per_tok", "{:.2f}"),
            Column("tok/SSE event", sc, "tok_per_event", "{:.2f}"),
        ]
        print(bench.table(f"Streaming against a mock core, {s} concurrent streams", cols) + "\n")
    print("\n".join(bench.notes))
    kw = {} if a.out is None else {"out_dir": a.out}
    bench.save(extra={"args": vars(a)}, **kw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
