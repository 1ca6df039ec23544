"""A bounded load generator for the router tests, run in the client's network namespace.

``python tests/helpers/router_workload.py`` reads one JSON job on stdin and prints one JSON result. It
first waits (with a deadline) until every replica's /health and the router answer, scrapes each
replica's prefix-cache counters, sends every prompt through the router with a bounded number in
flight (each request with its own timeout: a hang is counted as such, never waited out), and
scrapes again. With ``kill_pid`` it SIGKILLs that replica once ``kill_after`` requests have been
answered (pids are not namespaced: the test runner's pid is the one seen here).

Job: {"router": url, "replicas": [url...], "model": name, "prompts": [...], "max_tokens": n,
      "concurrency": c, "request_timeout_s": s, "ready_timeout_s": s,
      "kill_pid": pid or null, "kill_after": n}
Result: {"answered": n, "errors": [text...], "hung": n, "killed": bool,
         "before": {url: {"hits": x, "queries": y}}, "after": {...}}
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {"vllm:prefix_cache_hits": "hits", "vllm:prefix_cache_queries": "queries"}


async def _ready(session: aiohttp.ClientSession, url: str, deadline: float) -> None:
    while True:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 in time")
        await asyncio.sleep(0.2)


async def _cache_counters(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as r:
        text = await r.text()
    found = {"hits": 0.0, "queries": 0.0}
    for family in text_string_to_metric_families(text):
        key = COUNTERS.get(family.name)
        if key:
            found[key] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return found


async def main() -> dict:
    job = json.load(sys.stdin)
    result = {"answered": 0, "errors": [], "hung": 0, "killed": False}
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + job["ready_timeout_s"]
        for replica in job["replicas"]:
            await _ready(session, replica + "/health", deadline)
        await _ready(session, job["router"] + "/v1/models", deadline)
        result["before"] = {u: await _cache_counters(session, u) for u in job["replicas"]}
        gate = asyncio.Semaphore(job["concurrency"])
        timeout = aiohttp.ClientTimeout(total=job["request_timeout_s"])

        async def one(prompt: str) -> None:
            async with gate:
                body = {"model": job["model"], "prompt": prompt, "max_tokens": job["max_tokens"], "temperature": 0.0}
                try:
                    async with session.post(job["router"] + "/v1/completions", json=body, timeout=timeout) as r:
                        text = await r.text()
                        if r.status == 200 and json.loads(text).get("choices"):
                            result["answered"] += 1
                        else:  # the router's own errors need not be JSON
                            result["errors"].append(f"HTTP {r.status}: {text[:200]}")
                except asyncio.TimeoutError:
                    result["hung"] += 1
                except aiohttp.ClientError as e:
                    result["errors"].append(f"{type(e).__name__}: {e}")
            if job.get("kill_pid") and not result["killed"] and result["answered"] >= job["kill_after"]:
                os.kill(job["kill_pid"], signal.SIGKILL)
                result["killed"] = True

        await asyncio.gather(*(one(p) for p in job["prompts"]))
        alive = []
        for replica in job["replicas"]:
            try:
                alive.append((replica, await _cache_counters(session, replica)))
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass  # the replica the job killed
        result["after"] = dict(alive)
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
