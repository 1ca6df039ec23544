"""Serving, structured scenario: json_schema requests beside the same load unconstrained.

    ringllm bench serving --scenario structured [--concurrency 64] [--rounds 1] [--output-tokens 64]

One ``ringllm serve`` (shm) on the default model; closed-loop streaming clients as in the
streams scenario (benchmarks/serving.py). Methods, alternated within each round:

- ``unconstrained``: C clients, plain completions of ``--output-tokens`` tokens (ignore_eos);
- ``json_schema shared``: the same clients, every request constrained by one 5-field schema
  (compiled once, in the warm-up);
- ``json_schema distinct``: every client its own 5-field schema, new in every round (field names
  carry a fresh suffix), so each of the C schemas compiles while the load runs;
- ``unconstrained + C new schemas``: C unconstrained clients while a burst of C one-token
  requests with C new schemas arrives (their grammars compile in the core's pool), against
  ``unconstrained + C plain 1-token``: the same burst without schemas. Only the unconstrained
  streams are measured: the ITL p99 ratio of the two is what compiling costs the running streams;
- ``c=1 pairs``: 8 pairs of requests one at a time, a new schema then the same request
  unconstrained, each under its own ``cache_salt`` (no prefix-cache hit between them): the median
  over pairs of the TTFT difference is what a new schema adds, with no queueing in the way and the
  machine's drifting load cancelled pair by pair.

``--peer-url URL`` adds a running OpenAI-compatible server (vLLM's, with its xgrammar backend) as
three more methods, ``PEER unconstrained``, ``PEER json_schema shared`` and ``PEER json_schema
distinct``, sent the same requests (``response_format`` json_schema on /v1/completions) and
interleaved with ringllm's, so the constrained throughput ratio against it is a same-run figure.

The constrained requests end where their JSON ends (grammar end = stop), so throughput is output
tokens per second, not requests per second. The schemas bound their strings (maxLength) so a
record is ~40-60 tokens of the default tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import tempfile
import time
from typing import Optional

import aiohttp

from benchmarks.harness import OUT_DIR, Bench, Column
from benchmarks.serving import (
    RequestStats,
    Server,
    make_prompts,
    model_under_test,
    peer_model,
    percentile,
    stream_completion,
)

UNCONSTRAINED = "unconstrained"
SHARED, DISTINCT = "json_schema shared", "json_schema distinct"
BURST_SCHEMAS, BURST_PLAIN = "unconstrained + {c} new schemas", "unconstrained + {c} plain 1-token"
PAIRS = "c=1 pairs"


def five_field_schema(suffix: str = "") -> dict:
    props = {
        f"name{suffix}": {"type": "string", "maxLength": 24},
        f"age{suffix}": {"type": "integer"},
        f"city{suffix}": {"type": "string", "maxLength": 24},
        f"email{suffix}": {"type": "string", "maxLength": 32},
        f"active{suffix}": {"type": "boolean"},
    }
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    schema: Optional[dict],
    **fields: object,
) -> RequestStats:
    """Unconstrained requests run to max_tokens; constrained ones end where their JSON ends."""
    if schema is None:
        return await stream_completion(session, url, model, prompt, max_tokens, **fields)
    return await stream_completion(
        session,
        url,
        model,
        prompt,
        max_tokens,
        ignore_eos=False,
        response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": schema}},
        **fields,
    )


def summarize(results: list[RequestStats], duration: float) -> dict:
    ttfts = [r.ttft * 1e3 for r in results]
    gaps = [g * 1e3 for r in results for g in r.gaps]
    return {
        "output_tokens_per_s": sum(r.output_tokens for r in results) / duration,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p99_ms": percentile(gaps, 99),
        "mean_output_tokens": sum(r.output_tokens for r in results) / len(results),
    }


class Load:
    def __init__(self, url: str, model: str, concurrency: int, per_client: int, max_tokens: int) -> None:
        self.url, self.model, self.c, self.per_client, self.max_tokens = url, model, concurrency, per_client, max_tokens
        self.seeds = itertools.count(1)
        self.fresh = itertools.count()

    def _session(self, limit: int) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit), timeout=aiohttp.ClientTimeout(total=3600)
        )

    async def clients(self, schemas: list[Optional[dict]], burst: Optional[list[Optional[dict]]] = None) -> dict:
        """len(schemas) closed-loop clients (client i constrained by schemas[i]); ``burst``: one
        1-token request per entry, sent at once alongside and not measured."""
        prompts = make_prompts(len(schemas) * self.per_client, next(self.seeds))
        results: list[RequestStats] = []
        async with self._session(len(schemas) + len(burst or ())) as session:

            async def client(i: int) -> None:
                for prompt in prompts[i :: len(schemas)]:
                    results.append(await stream(session, self.url, self.model, prompt, self.max_tokens, schemas[i]))

            async def one_token(schema: Optional[dict], prompt: str) -> None:
                await stream(session, self.url, self.model, prompt, 1, schema)

            start = time.perf_counter()
            tasks = [client(i) for i in range(len(schemas))]
            if burst:
                await asyncio.sleep(0)  # the streams go first; the burst lands while they decode
                extra = make_prompts(len(burst), next(self.seeds))
                tasks += [one_token(s, p) for s, p in zip(burst, extra)]
            await asyncio.gather(*tasks)
            return summarize(results, time.perf_counter() - start)

    def new_schemas(self, n: int) -> list[dict]:
        return [five_field_schema(f"_{next(self.fresh)}") for _ in range(n)]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="The tiny dummy-weight model instead of the default.")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backend", default="auto", choices=["auto", "xgrammar", "guidance"])
    parser.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=512 << 20,
        help="The server's KV cache (64 streams of ~130 tokens need ~0.2 GiB on the default model).",
    )
    parser.add_argument("--out", default=OUT_DIR)
    parser.add_argument("--peer-url", default=None, help="Also measure this running OpenAI-compatible server.")
    parser.add_argument("--peer-name", default="peer", help="The peer's method prefix in the tables.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    c = args.concurrency
    os.makedirs(args.out, exist_ok=True)
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="ringllm-structured-") as tmp:
        model_args, name, description = model_under_test(args.tiny, tmp)
        bench = Bench("serving-structured", model=description)
        bench.notes.append(
            f"{c} clients x {args.requests_per_client} streaming requests, up to {args.output_tokens} "
            f"output tokens (greedy); structured_outputs_config backend {args.backend}; "
            "load generator on the same machine"
        )
        server = Server(
            [
                *model_args,
                "--transport",
                "shm",
                "--served-model-name",
                name,
                "--kv-cache-memory-bytes",
                str(args.kv_cache_memory_bytes),
                "--structured-outputs-config",
                json.dumps({"backend": args.backend}),
            ],
            os.path.join(args.out, "serving-structured-server.log"),
        )
        try:
            server.wait_ready()
            load = Load(server.url, name, c, args.requests_per_client, args.output_tokens)
            shared = five_field_schema()
            run = loop.run_until_complete
            run(load.clients([None, shared]))  # warm-up: first requests, the backends, the shared grammar
            burst_schemas, burst_plain = BURST_SCHEMAS.format(c=c), BURST_PLAIN.format(c=c)
            cases = {
                UNCONSTRAINED: lambda: load.clients([None] * c),
                SHARED: lambda: load.clients([shared] * c),
                DISTINCT: lambda: load.clients(load.new_schemas(c)),
                burst_schemas: lambda: load.clients([None] * c, burst=load.new_schemas(c)),
                burst_plain: lambda: load.clients([None] * c, burst=[None] * c),
                PAIRS: lambda: pairs(load, 8),
            }
            if args.peer_url:
                peer_url = args.peer_url.rstrip("/")
                peer = Load(peer_url, peer_model(peer_url), c, args.requests_per_client, args.output_tokens)
                run(peer.clients([None, shared]))  # the same warm-up
                cases[f"{args.peer_name} {UNCONSTRAINED}"] = lambda: peer.clients([None] * c)
                cases[f"{args.peer_name} {SHARED}"] = lambda: peer.clients([shared] * c)
                cases[f"{args.peer_name} {DISTINCT}"] = lambda: peer.clients(peer.new_schemas(c))
                bench.notes.append(f"{args.peer_name}: {peer_url}, model {peer.model!r}")
            for method, fn in cases.items():
                bench.add("structured", method, lambda fn=fn: run(fn()))
            bench.run(rounds=args.rounds)
        finally:
            server.stop()
    s = "structured"
    columns = [
        Column("output tok/s", s, "output_tokens_per_s", "{:.0f}", higher_is_better=True),
        Column("tok/s vs unconstrained", s, "output_tokens_per_s", ratio_to=UNCONSTRAINED),
        Column("tokens/request", s, "mean_output_tokens", "{:.0f}"),
        Column("TTFT p50 ms", s, "ttft_p50_ms", "{:.0f}"),
        Column("TTFT p99 ms", s, "ttft_p99_ms", "{:.0f}"),
        Column("ITL p50 ms", s, "itl_p50_ms", "{:.1f}"),
        Column("ITL p99 ms", s, "itl_p99_ms", "{:.1f}"),
    ]
    print(f"\n{bench.table('json_schema beside unconstrained', columns)}\n")
    ttft_delta = bench.stat(s, PAIRS, "ttft_delta_p50_ms").median
    itl_ratio = bench.ratio(s, "itl_p99_ms", burst_schemas, burst_plain)
    for line in (
        "constrained/unconstrained throughput: shared "
        f"{bench.ratio(s, 'output_tokens_per_s', SHARED, UNCONSTRAINED):.2f}x, "
        f"distinct {bench.ratio(s, 'output_tokens_per_s', DISTINCT, UNCONSTRAINED):.2f}x",
        f"TTFT p50 a new schema adds (one request at a time): {ttft_delta:+.1f} ms",
        f"ITL p99 of {c} unconstrained streams while {c} new schemas compile, against the same "
        f"burst without schemas: {itl_ratio:.2f}x",
        *peer_lines(bench, args),
        *bench.notes,
    ):
        print(f"- {line}")
    for path in bench.save(extra={"ttft_p50_delta_ms": ttft_delta, "itl_p99_ratio": itl_ratio}, out_dir=args.out):
        print(f"wrote {os.path.relpath(path)}")


def peer_lines(bench: Bench, args: argparse.Namespace) -> list[str]:
    """The same-run ratios against the peer, when there is one."""
    if not args.peer_url:
        return []
    s, p = "structured", args.peer_name
    return [
        f"constrained throughput against {p}: shared "
        f"{bench.ratio(s, 'output_tokens_per_s', SHARED, f'{p} {SHARED}'):.2f}x, distinct "
        f"{bench.ratio(s, 'output_tokens_per_s', DISTINCT, f'{p} {DISTINCT}'):.2f}x; unconstrained "
        f"{bench.ratio(s, 'output_tokens_per_s', UNCONSTRAINED, f'{p} {UNCONSTRAINED}'):.2f}x"
    ]


async def pairs(load: Load, n: int) -> dict:
    """n times: a request with a new schema, then the same prompt unconstrained, one at a time.
    Each request has a cache_salt of its own, so the second never reads the prefix cache the first
    filled (that would shorten its prefill and inflate the difference)."""
    deltas, constrained = [], []
    async with load._session(1) as session:
        start = time.perf_counter()
        for schema, prompt in zip(load.new_schemas(n), make_prompts(n, next(load.seeds))):
            new = await stream(
                session, load.url, load.model, prompt, load.max_tokens, schema, cache_salt=f"pair-{next(load.fresh)}"
            )
            plain = await stream(
                session, load.url, load.model, prompt, load.max_tokens, None, cache_salt=f"pair-{next(load.fresh)}"
            )
            deltas.append((new.ttft - plain.ttft) * 1e3)
            constrained.append(new)
        out = summarize(constrained, time.perf_counter() - start)
    return {**out, "ttft_delta_p50_ms": percentile(deltas, 50)}


if __name__ == "__main__":
    main()
