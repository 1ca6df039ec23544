"""Soak: thousands of requests with random parameters, random client disconnects and aborts, at
concurrency >= 64, against a real ``ringllm serve`` on the tiny dummy-weight model. Afterwards the
server is back where it started: 0 running and 0 waiting requests, every KV block free, the RSS
of the server and of its EngineCore within 10% of their level after warm-up, /health 200, no
traceback in the server's log, and
(once it has stopped; conftest checks) nothing left in /dev/shm and no process left behind.

Sized by environment variables (small defaults for CI, under a minute):
RINGLLM_SOAK_SECONDS (20), RINGLLM_SOAK_WARMUP_SECONDS (8), RINGLLM_SOAK_CONCURRENCY (64),
RINGLLM_SOAK_SEED (0). The figures to record (requests, disconnects, duration, RSS before and
after) are printed as one JSON line starting ``SOAK`` (``pytest -m slow -s tests/integration/test_soak.py``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time

import aiohttp
import pytest

from engine.core.engine_core_proc import _TRIM_AFTER_IDLE_S
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, wait_for

SECONDS = float(os.environ.get("RINGLLM_SOAK_SECONDS", "20"))
WARMUP_SECONDS = float(os.environ.get("RINGLLM_SOAK_WARMUP_SECONDS", "8"))
CONCURRENCY = int(os.environ.get("RINGLLM_SOAK_CONCURRENCY", "64"))
SEED = int(os.environ.get("RINGLLM_SOAK_SEED", "0"))
RSS_TOLERANCE = 0.10
READ_EVERY_S = 0.25
WORDS = "river mountain engine quiet yellow garden window silver market rocket planet story winter".split()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def random_request(rng: random.Random) -> tuple[str, dict]:
    """A valid request with random parameters (what a varied crowd of clients sends)."""
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    if rng.random() < 0.1:
        return "/tokenize", {"prompt": prompt, "add_special_tokens": rng.random() < 0.5, "stream": False}
    body = {
        "model": "tiny",
        "max_tokens": rng.randint(1, 24),
        "n": rng.choice([1, 1, 1, 1, 2, 3]),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "ignore_eos": rng.random() < 0.5,
        "stream": rng.random() < 0.6,
    }
    if rng.random() < 0.3:
        body["top_p"], body["top_k"] = rng.uniform(0.1, 1.0), rng.randint(-1, 50)
    if rng.random() < 0.2:
        body["seed"] = rng.randint(0, 1 << 30)
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(WORDS)]
    if rng.random() < 0.2:
        body["presence_penalty"], body["frequency_penalty"] = rng.uniform(-1, 1), rng.uniform(-1, 1)
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    if rng.random() < 0.15:
        body["logprobs"] = rng.randint(0, 3)
    prompts = [prompt] if rng.random() < 0.8 else [prompt + f" {i}" for i in range(rng.randint(2, 4))]
    return "/v1/completions", {**body, "prompt": prompts[0] if len(prompts) == 1 else prompts}


async def one_client(
    session: aiohttp.ClientSession, url: str, rng: random.Random, until: float, counts: collections.Counter
) -> None:
    """Closed loop: the next request when the last one ends; some are dropped part-way."""
    while time.monotonic() < until:
        path, body = random_request(rng)
        drop_after = rng.random() * 0.3 if rng.random() < 0.2 else None  # a client that goes away
        counts["requests"] += 1
        try:
            async with asyncio.timeout(drop_after):
                async with session.post(url + path, json=body) as resp:
                    data = await resp.read()
            counts[f"status_{resp.status}"] += 1
            if resp.status == 200 and body["stream"]:
                assert data.endswith(b"data: [DONE]\n\n"), data[-200:]
            elif resp.status not in (200, 503):
                raise AssertionError(f"{path} {body} -> {resp.status} {data[:300]!r}")
        except TimeoutError:
            counts["disconnects"] += 1


async def drive(url: str, seconds: float, rng: random.Random, counts: collections.Counter) -> None:
    until = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(
            *(one_client(session, url, random.Random(rng.random()), until, counts) for _ in range(CONCURRENCY))
        )


def quiet(server: RemoteServer) -> bool:
    m = server.metrics()
    return (
        m["vllm:num_requests_running"] == 0
        and m["vllm:num_requests_waiting"] == 0
        and m["vllm:kv_cache_usage_perc"] == 0
    )


def settled_rss(pids: dict[str, int], timeout: float = 30.0) -> dict[str, int]:
    """Each process's RSS once the idle core has trimmed its heap: every one unchanged over three
    times the core's idle delay before it trims (read together, so the wait is paid once). RSS is
    steady for that delay before the trim too, so a shorter window catches the core before or
    after it by chance (CI once read 425 MiB before and 467 after, all of it heap the trim a moment
    later gave back). The last readings at the deadline otherwise."""
    readings: dict[str, list[int]] = {name: [] for name in pids}
    needed = int(3 * _TRIM_AFTER_IDLE_S / READ_EVERY_S) + 1

    def steady() -> bool:
        for name, pid in pids.items():
            readings[name].append(rss_bytes(pid))
        return all(len(r) >= needed and len(set(r[-needed:])) == 1 for r in readings.values())

    wait_for(steady, timeout=timeout, interval=READ_EVERY_S)
    return {name: r[-1] for name, r in readings.items()}


def soak(model_dir: str, log: str) -> dict:
    rng = random.Random(SEED)
    counts: collections.Counter = collections.Counter()
    # No prefill cap: the tiny model prefills a whole step's prompts in a millisecond or two.
    with RemoteServer(
        model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--max-num-prefill-tokens",
        "0",
        "--max-waiting-requests",
        str(4 * CONCURRENCY),
        log=log,
    ) as server:
        (core,) = server.core_pids()
        asyncio.run(drive(server.url, WARMUP_SECONDS, rng, collections.Counter()))
        assert wait_for(lambda: quiet(server), timeout=30)
        before = settled_rss({"server": server.proc.pid, "core": core})
        start = time.monotonic()
        asyncio.run(drive(server.url, SECONDS, rng, counts))
        duration = time.monotonic() - start
        assert wait_for(lambda: quiet(server), timeout=30), server.metrics()
        after = settled_rss({"server": server.proc.pid, "core": core})
        assert server.get("/health")[0] == 200
        assert server.core_pids() == {core}
    figures = {
        "requests": counts["requests"],
        "disconnects": counts["disconnects"],
        "statuses": {k: v for k, v in counts.items() if k.startswith("status_")},
        "duration_s": round(duration, 1),
        "concurrency": CONCURRENCY,
        "rss_before_mib": {k: round(v / 2**20, 1) for k, v in before.items()},
        "rss_after_mib": {k: round(v / 2**20, 1) for k, v in after.items()},
    }
    print("SOAK " + json.dumps(figures))
    return {"figures": figures, "before": before, "after": after}


@pytest.mark.slow
@pytest.mark.timeout(WARMUP_SECONDS + SECONDS + 240)  # start-up, quiet waits and settling on top
def test_soak_leaves_the_server_as_it_found_it(tiny_model_dir, tmp_path):
    log = tmp_path / "server.log"
    result = soak(tiny_model_dir, str(log))
    figures = result["figures"]
    # A client that hangs up is routine: nothing in the server's log may look like a failure.
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]
    # Every client went round several times (how many in all depends on the machine: ~10 requests/s
    # on a shared 2-core box, so RINGLLM_SOAK_SECONDS=300 for thousands there).
    assert figures["requests"] >= 4 * CONCURRENCY and figures["disconnects"] > 0, figures
    for name in ("server", "core"):
        before, after = result["before"][name], result["after"][name]
        # Growth is what a leak looks like; a shrink (the core returns idle heap to the OS with
        # malloc_trim a second after work stops) is not.
        assert after - before <= RSS_TOLERANCE * before, (name, figures)
