"""Serving scenario: an aiohttp load generator against running ``ringllm serve``s.

    python -m benchmarks.serving [--rounds 3] [--tiny] [--levels 1 8 32 64]
    (or: ringllm bench serving)

One server per transport (``shm`` ring, ``zmq`` baseline), both up for the whole run, on the
default model (``--tiny``: the tiny dummy-weight model, where the model costs almost nothing
and the transport's share of the latency shows). At each concurrency level, that many clients
keep one streaming completion each in flight (closed loop: a client sends its next request
when its last one ends), ``--requests-per-client`` each, ``--output-tokens`` long with
ignore_eos, greedy, on seeded prompts of ~30 tokens. Measured per run: requests/s, output
tokens/s, time to first token and inter-token latency (the gaps between streamed chunks),
p50 and p99, and the mean time to first token (with few requests per client the first wave,
which all arrive at once, is half the samples: the mean weighs both waves where p50 falls
on whichever side of the boundary). A third method sends the same requests to an ``AsyncLLM`` on the ring inside the
load generator's process, so what HTTP, JSON and SSE add shows beside it. Methods alternate
within each round (harness.Bench). ``--compare "FLAGS"`` (repeatable) adds a ``shm`` server
started with FLAGS as one more method, for a side-by-side comparison of settings in one run,
e.g. ``--compare "--max-num-prefill-tokens 0"`` (the scheduling before the serving default).

``--peer-url URL`` adds any running OpenAI-compatible server (vLLM's, for one) as one more method,
``--peer-name`` in the tables, measured with the same client and interleaved with ringllm's rounds;
the model name it is sent is the first one its ``GET /v1/models`` lists. Start it yourself on the
same model, with nothing else busy on the host, e.g. with the venv of benchmarks/offline.py's
docstring and ringllm's converted default model (``python -c "from engine.models.default_model import
default_model_path; print(default_model_path())"``):

    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=4 /path/vllm-venv/bin/python \
        -m vllm.entrypoints.openai.api_server --model ~/.cache/ringllm/SmolLM2-135M-Instruct-f32 \
        --port 8100 --dtype float32 --enforce-eager    # (vllm-cpu's `vllm` command fails: no "vllm" dist)
    ringllm bench serving --peer-url http://127.0.0.1:8100 --transports shm --no-in-process
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional

import aiohttp

from benchmarks.harness import OUT_DIR, Bench, Column

LEVELS = (1, 8, 32, 64)
TRANSPORTS = ("shm", "zmq")
IN_PROCESS = "AsyncLLM, no HTTP"
# Prompts are drawn from these words, about 30 tokens each, with a fresh seed for every run, so
# no prompt repeats and prefix caching does not flatter the time to first token.
_WORDS = (
    "river mountain engine quiet yellow garden window silver market rocket planet story "
    "winter coffee letter forest ocean bridge music paper castle thunder candle dragon "
    "harbor meadow pencil lantern violin orchard glacier compass"
).split()


def make_prompts(count: int, seed: int, words: int = 24) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(words)) for _ in range(count)]


@dataclass
class RequestStats:
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)


async def stream_completion(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int, **fields: object
) -> RequestStats:
    """One streamed greedy completion, timed; ``fields`` add to or replace the request's fields."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
    }
    stats = RequestStats()
    start = last = time.perf_counter()
    async with session.post(url + "/v1/completions", json=payload) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            now = time.perf_counter()
            if event["choices"]:
                if stats.ttft == 0.0:
                    stats.ttft = now - start
                else:
                    stats.gaps.append(now - last)
                last = now
            if event.get("usage"):
                stats.output_tokens = event["usage"]["completion_tokens"]
    stats.latency = time.perf_counter() - start
    return stats


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def generate_in_process(llm, prompt: str, max_tokens: int, request_id: str) -> RequestStats:
    """The same request through ``AsyncLLM.generate`` in this process: no HTTP, no JSON."""
    from engine import SamplingParams
    from engine.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    stats = RequestStats()
    start = last = time.perf_counter()
    async for output in llm.generate(prompt, params, request_id):
        now = time.perf_counter()
        if stats.ttft == 0.0:
            stats.ttft = now - start
        else:
            stats.gaps.append(now - last)
        last = now
        stats.output_tokens += len(output.outputs[0].token_ids)
    stats.latency = time.perf_counter() - start
    return stats


async def run_level(
    send: Callable[[str], Awaitable[RequestStats]], concurrency: int, requests_per_client: int, seed: int
) -> dict:
    """``concurrency`` clients, each sending its requests one after another (closed loop)."""
    prompts = make_prompts(concurrency * requests_per_client, seed)
    results: list[RequestStats] = []

    async def client(mine: list[str]) -> None:
        for prompt in mine:
            results.append(await send(prompt))

    start = time.perf_counter()
    await asyncio.gather(*(client(prompts[i::concurrency]) for i in range(concurrency)))
    duration = time.perf_counter() - start
    ttfts = [r.ttft * 1e3 for r in results]
    gaps = [g * 1e3 for r in results for g in r.gaps]
    return {
        "requests_per_s": len(results) / duration,
        "output_tokens_per_s": sum(r.output_tokens for r in results) / duration,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "ttft_mean_ms": sum(ttfts) / len(ttfts),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p99_ms": percentile(gaps, 99),
    }


async def run_http_level(
    url: str,
    model: str,
    concurrency: int,
    requests_per_client: int,
    max_tokens: int,
    seed: int,
    reuse_connections: bool = True,
) -> dict:
    """``run_level`` over HTTP; ``reuse_connections=False`` opens a connection per request (for
    servers that drop idle keep-alive connections, as llama-server does)."""
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=not reuse_connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        return await run_level(
            lambda prompt: stream_completion(session, url, model, prompt, max_tokens),
            concurrency,
            requests_per_client,
            seed,
        )


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (the OS's pick), for a server child to bind."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log_path: str) -> None:
    """Until ``url``/health answers 200; raises if ``proc`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the server did not become healthy in {timeout} s; see {log_path}")


class Server:
    """``ringllm serve`` in a child process on a free loopback port, stopped with SIGTERM."""

    def __init__(self, serve_args: list[str], log_path: str) -> None:
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with open(log_path, "w") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "engine.entrypoints.cli", "serve", *serve_args, "--port", str(self.port)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait_ready(self, timeout: float = 600.0) -> None:
        wait_healthy(self.url, self.proc, timeout, self.log_path)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def peer_model(url: str, timeout: float = 600.0) -> str:
    """The first model a running OpenAI-compatible server lists, once it answers ``/v1/models``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
                return json.load(resp)["data"][0]["id"]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def in_process_engine(model_args: list[str]):
    """An AsyncLLM on the ring built from the same ``serve`` flags the servers get."""
    from engine import AsyncLLM
    from engine.entrypoints.cli import build_parser
    from engine.entrypoints.serve import serving_engine_args

    args = build_parser(("engine.entrypoints.serve",)).parse_args(["serve", *model_args, "--transport", "shm"])
    return AsyncLLM.from_engine_args(serving_engine_args(args))  # what `ringllm serve` would run


def model_under_test(tiny: bool, tmp: str) -> tuple[list[str], str, str]:
    """(serve arguments, served name, description for the tables)."""
    if not tiny:
        return [], "default", "SmolLM2-135M-Instruct (embedded default, dtype auto)"
    from engine.models.default_model import write_tiny_model

    path = write_tiny_model(os.path.join(tmp, "tiny"))
    return (
        [path, "--load-format", "dummy", "--dtype", "float32"],
        "tiny",
        "tiny Llama, dummy weights (2 layers, hidden 64), float32",
    )


SCENARIOS = ("streams", "structured")  # structured: benchmarks/serving_structured.py


def main(argv: Optional[list[str]] = None) -> None:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--scenario", choices=SCENARIOS, default="streams")
    known, rest = first.parse_known_args(argv)
    if known.scenario == "structured":
        from benchmarks.serving_structured import main as structured

        return structured(rest)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="streams",
        help="streams (this sweep) or structured (json_schema beside unconstrained: "
        "benchmarks/serving_structured.py, with its own flags)",
    )
    parser.add_argument("--tiny", action="store_true", help="Sweep the tiny dummy-weight model instead.")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="Concurrency levels.")
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument(
        "--no-in-process",
        action="store_true",
        help=f"Skip the '{IN_PROCESS}' method (AsyncLLM on the ring in this process, no HTTP).",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="FLAGS",
        help="Also run a shm server with these extra serve flags (one quoted string; "
        "repeatable), as a method named 'shm FLAGS'.",
    )
    parser.add_argument(
        "--peer-url",
        default=None,
        metavar="URL",
        help="Also measure this running OpenAI-compatible server (e.g. http://127.0.0.1:8100).",
    )
    parser.add_argument("--peer-name", default="peer", help="The peer's method name in the tables.")
    parser.add_argument("--out", default=OUT_DIR, help="Folder for JSON, PNG and server logs.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.makedirs(args.out, exist_ok=True)
    loop = asyncio.new_event_loop()  # one loop for the run: the in-process AsyncLLM is bound to it
    with tempfile.TemporaryDirectory(prefix="ringllm-serving-") as tmp:
        model_args, name, description = model_under_test(args.tiny, tmp)
        bench = Bench("serving-tiny" if args.tiny else "serving", model=description)
        bench.notes.append(
            f"{args.requests_per_client} streaming requests per client, {args.output_tokens} "
            "output tokens each (ignore_eos, greedy); load generator on the same machine"
        )
        seeds, ids = itertools.count(args.seed * 1_000_000), itertools.count()
        servers = {
            t: Server(
                [*model_args, "--transport", t, "--served-model-name", name],
                os.path.join(args.out, f"{bench.name}-server-{t}.log"),
            )
            for t in args.transports
        }
        for i, flags in enumerate(args.compare):
            servers[f"shm {flags}"] = Server(
                [*model_args, "--transport", "shm", "--served-model-name", name, *shlex.split(flags)],
                os.path.join(args.out, f"{bench.name}-server-compare{i}.log"),
            )
        llm = None if args.no_in_process else in_process_engine(model_args)
        try:
            senders = {}
            for t, server in servers.items():
                server.wait_ready()
                senders[t] = lambda level, url=server.url: run_http_level(
                    url, name, level, args.requests_per_client, args.output_tokens, next(seeds)
                )
            if args.peer_url:
                url = args.peer_url.rstrip("/")
                peer = peer_model(url)
                bench.notes.append(f"{args.peer_name}: {url}, model {peer!r}")
                senders[args.peer_name] = lambda level: run_http_level(
                    url, peer, level, args.requests_per_client, args.output_tokens, next(seeds)
                )
            if llm is not None:
                senders[IN_PROCESS] = lambda level: run_level(
                    lambda prompt: generate_in_process(llm, prompt, args.output_tokens, f"bench-{next(ids)}"),
                    level,
                    args.requests_per_client,
                    next(seeds),
                )
            for method, send in senders.items():  # warm-up: first-request costs
                loop.run_until_complete(send(2))
            for level in args.levels:
                for method, send in senders.items():
                    bench.add(f"c={level}", method, lambda send=send, level=level: loop.run_until_complete(send(level)))
            bench.run(rounds=args.rounds)
        finally:
            for server in servers.values():
                server.stop()
            if llm is not None:
                llm.shutdown()
    baseline = "zmq" if "zmq" in servers and len(bench.methods()) > 1 else None
    if baseline is None and args.compare and "shm" in servers:  # settings compared with the plain server
        baseline = "shm"
    for level in args.levels:
        s = f"c={level}"
        columns = [
            Column("req/s", s, "requests_per_s", "{:.2f}", higher_is_better=True),
            Column("output tok/s", s, "output_tokens_per_s", "{:.0f}", higher_is_better=True),
            Column("TTFT p50 ms", s, "ttft_p50_ms", "{:.0f}"),
            Column("TTFT p99 ms", s, "ttft_p99_ms", "{:.0f}"),
            Column("TTFT mean ms", s, "ttft_mean_ms", "{:.0f}"),
            Column("ITL p50 ms", s, "itl_p50_ms", "{:.1f}"),
            Column("ITL p99 ms", s, "itl_p99_ms", "{:.1f}"),
        ]
        if baseline:
            columns.append(Column(f"tok/s vs {baseline}", s, "output_tokens_per_s", ratio_to=baseline))
        if args.peer_url:
            columns.append(Column(f"tok/s vs {args.peer_name}", s, "output_tokens_per_s", ratio_to=args.peer_name))
        print(f"\n{bench.table(f'{level} concurrent streams', columns)}")
    print()
    for note in bench.notes:
        print(f"- {note}")
    top, one = f"c={max(args.levels)}", f"c={min(args.levels)}"
    plots = [
        Column(f"{top}: output tok/s", top, "output_tokens_per_s", higher_is_better=True),
        Column(f"{top}: TTFT p50 ms", top, "ttft_p50_ms"),
        Column(f"{one}: ITL p50 ms", one, "itl_p50_ms"),
        Column(f"{top}: ITL p50 ms", top, "itl_p50_ms"),
    ]
    for path in bench.save(plots=plots, out_dir=args.out):
        print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
