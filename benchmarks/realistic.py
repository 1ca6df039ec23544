"""A 1.56B Llama served by ringllm and by llama.cpp's ``llama-server``: the realistic-size table.

    python -m benchmarks.realistic [--quant Q4_0] [--rounds 2] [--levels 16 64]
    (or: ringllm bench realistic)

Both engines serve the very same GGUF (benchmarks/realistic_models.py: random weights, converted
and quantized by llama.cpp's own tools) on loopback, up for the whole run; llama.cpp at ``-t 1``
and ``-t 2`` (its best thread count depends on the host: both are measured), 64 slots on one
unified KV cache. Every method gets the same client (benchmarks/serving.py's closed loop,
greedy, ignore_eos) and the harness alternates them within each round. Scenarios:

- single: one stream of ``--output-tokens``: output tokens/s and the inter-token latency;
- prefill: ``--prefill-requests`` prompts of ``--prefill-tokens`` random token ids, one at a
  time, one output token each: prompt tokens/s (the time to first token);
- c=N: N closed-loop clients (``--levels``), ``--requests-per-client`` each: output tokens/s,
  time to first token p99.

Then each server's peak RSS (its process tree). ``--compare "FLAGS"`` adds a ringllm server with
extra ``serve`` flags (e.g. ``--num-threads 2``). ``--peer-url URL`` adds any running
OpenAI-compatible server as one more method, for vLLM, which cannot serve the GGUF on a CPU: its
server on ``realistic_models.hf_model_path()`` (the same random weights, unquantized; its own
dtype), with its own ratio column; its RSS is not measured from here. A host with other work on it slows llama.cpp
at ``-t 2`` most (FACTS.md): say how loaded the host was, which the table's notes record.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import random
import shlex
from typing import Callable, Optional

import aiohttp

from benchmarks.harness import OUT_DIR, Bench, Column
from benchmarks.peer_llama_server import start_llama_server, stop_server
from benchmarks.peer_vllm import peak_rss_kib, process_tree
from benchmarks.realistic_models import NAME, QUANTS, gguf_path, hf_model_path, parameter_count
from benchmarks.serving import Server, peer_model, run_http_level, stream_completion

RINGLLM = "ringllm"
SERVED_NAME = "realistic"


def llama_method(threads: int) -> str:
    return f"llama.cpp -t {threads}"


async def prefill(
    url: str, model: str, requests: int, tokens: int, vocab: int, seed: int, reuse_connections: bool
) -> dict:
    """``requests`` prompts of ``tokens`` random ids, one after another, one output token each:
    prompt tokens per second of time to first token (no prefix is shared, none is cached)."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=1, force_close=not reuse_connections)
    seconds = 0.0
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        for _ in range(requests):
            ids = [rng.randrange(3, vocab) for _ in range(tokens)]
            seconds += (await stream_completion(session, url, model, ids, 1)).ttft
    return {"prefill_tok_s": requests * tokens / seconds, "prefill_s": seconds}


def add_cases(
    bench: Bench,
    method: str,
    url: str,
    model: str,
    args: argparse.Namespace,
    seeds: itertools.count,
    run: Callable,
    reuse_connections: bool,
) -> None:
    def level(c: int, per_client: int) -> dict:
        return run(run_http_level(url, model, c, per_client, args.output_tokens, next(seeds), reuse_connections))

    def single() -> dict:
        out = level(1, 1)
        return {"output_tokens_per_s": out["output_tokens_per_s"], "itl_p50_ms": out["itl_p50_ms"]}

    bench.add("single", method, single)
    bench.add(
        "prefill",
        method,
        lambda: run(
            prefill(url, model, args.prefill_requests, args.prefill_tokens, args.vocab, next(seeds), reuse_connections)
        ),
    )
    for c in args.levels:
        bench.add(f"c={c}", method, lambda c=c: level(c, args.requests_per_client))


def tree_peak_rss_mib(pid: int) -> float:
    return sum(peak_rss_kib(p) for p in process_tree(pid)) / 1024


def best_peer(bench: Bench, scenario: str, metric: str, peers: list[str]) -> Optional[str]:
    measured = [m for m in peers if bench.stat(scenario, m, metric).n]
    return max(measured, key=lambda m: bench.stat(scenario, m, metric).median) if measured else None


def print_tables(bench: Bench, args: argparse.Namespace, label: str, peers: list[str], rss: dict) -> None:
    columns = [
        Column("1 stream tok/s", "single", "output_tokens_per_s", "{:.1f}", higher_is_better=True),
        Column("1 stream ITL p50 ms", "single", "itl_p50_ms", "{:.0f}"),
        Column(f"prefill {args.prefill_tokens} tok/s", "prefill", "prefill_tok_s", "{:.0f}", higher_is_better=True),
    ]
    for c in args.levels:
        columns += [
            Column(f"{c} clients tok/s", f"c={c}", "output_tokens_per_s", "{:.1f}", higher_is_better=True),
            Column(f"{c} clients TTFT p99 ms", f"c={c}", "ttft_p99_ms", "{:.0f}"),
        ]
    print(bench.table(f"{label}: ringllm vs llama-server", columns))
    other = f" | ringllm / {args.peer_name}" if args.peer_url else ""
    print(f"\n| scenario | ringllm / best llama.cpp | best llama.cpp{other} |\n|---|---|---{'|---' if other else ''}|")
    for column in columns:
        if not column.higher_is_better or not bench.stat(column.scenario, RINGLLM, column.metric).n:
            continue
        best = best_peer(bench, column.scenario, column.metric, peers)
        cells = [f"{bench.ratio(column.scenario, column.metric, RINGLLM, best):.2f}x", best] if best else ["-", "-"]
        if other:
            measured = bench.stat(column.scenario, args.peer_name, column.metric).n
            ratio = bench.ratio(column.scenario, column.metric, RINGLLM, args.peer_name) if measured else None
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
        print(f"| {column.header} | {' | '.join(cells)} |")
    print("\n| server | peak RSS MiB |\n|---|---|")
    for method, mib in rss.items():
        print(f"| {method} | {mib:.0f} |")
    print()
    for note in bench.notes:
        print(f"- {note}")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quant", choices=QUANTS, default="Q4_0")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="*", default=[16, 64], help="Concurrent clients.")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--prefill-requests", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=49152, help="Prompt ids are drawn below this.")
    parser.add_argument("--llama-threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--ctx", type=int, default=8192, help="llama-server's KV cache, tokens (all slots).")
    parser.add_argument("--kv-bytes", type=int, default=2**30, help="ringllm's KV cache, bytes.")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="FLAGS",
        help="Also run a ringllm server with these extra serve flags (repeatable).",
    )
    parser.add_argument(
        "--gguf",
        help="Serve this GGUF file instead of the 1.56B Llama (e.g. benchmarks.moe_model's MoE); "
        "its tokenizer is the Llama's HF directory's, so it must share SmolLM2's vocabulary.",
    )
    parser.add_argument("--peer-url", help="A running OpenAI-compatible server to measure too (e.g. vLLM's).")
    parser.add_argument("--peer-name", default="peer", help="The peer's method name in the tables.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=OUT_DIR, help="Folder for JSON and server logs.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.makedirs(args.out, exist_ok=True)
    gguf, tokenizer = args.gguf or gguf_path(args.quant), hf_model_path()
    label = os.path.basename(args.gguf) if args.gguf else args.quant
    described = (
        f"{os.path.basename(args.gguf)}, "
        if args.gguf
        else f"{NAME} ({parameter_count() / 1e9:.2f} B, random weights) {args.quant}, "
    )
    bench = Bench(f"realistic-{label}", model=f"{described}{os.path.getsize(gguf) / 2**20:.0f} MiB")
    bench.notes.append(
        f"{args.output_tokens} output tokens (greedy, ignore_eos), {args.requests_per_client} requests "
        f"per client; prefill {args.prefill_requests} x {args.prefill_tokens} random ids; client on "
        "the same host; llama-server -np 64 --kv-unified -c " + str(args.ctx) + f"; ringllm KV cache "
        f"{args.kv_bytes / 2**30:.2f} GiB, max_model_len 2048"
    )
    loop = asyncio.new_event_loop()
    seeds = itertools.count(args.seed * 1_000_000)
    serve = [
        gguf,
        "--tokenizer",
        tokenizer,
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        "2048",
        "--kv-cache-memory-bytes",
        str(args.kv_bytes),
    ]
    servers = {RINGLLM: Server(serve, os.path.join(args.out, f"{bench.name}-ringllm.log"))}
    for i, flags in enumerate(args.compare):
        servers[f"{RINGLLM} {flags}"] = Server(
            [*serve, *shlex.split(flags)], os.path.join(args.out, f"{bench.name}-ringllm-compare{i}.log")
        )
    llamas: dict = {}
    try:
        for threads in args.llama_threads:
            llamas[llama_method(threads)] = start_llama_server(
                gguf,
                threads,
                parallel=64,
                ctx=args.ctx,
                log_path=os.path.join(args.out, f"{bench.name}-llama-t{threads}.log"),
            )
        for method, server in servers.items():
            server.wait_ready()
            add_cases(bench, method, server.url, SERVED_NAME, args, seeds, loop.run_until_complete, True)
        for method, (url, _) in llamas.items():
            add_cases(bench, method, url, peer_model(url), args, seeds, loop.run_until_complete, False)
        if args.peer_url:
            url = args.peer_url.rstrip("/")
            model = peer_model(url)
            bench.notes.append(f"{args.peer_name}: {url}, model {model!r}")
            add_cases(bench, args.peer_name, url, model, args, seeds, loop.run_until_complete, True)
        for method, case in [(m, fn) for s, m, fn in bench.cases if s == "single"]:
            case()  # warm-up: first-request costs
        bench.run(rounds=args.rounds)
        rss = {m: tree_peak_rss_mib(s.proc.pid) for m, s in servers.items()}
        rss.update({m: tree_peak_rss_mib(p.pid) for m, (_, p) in llamas.items()})
    finally:
        for server in servers.values():
            server.stop()
        for _, process in llamas.values():
            stop_server(process)
    paths = bench.save(extra={"peak_rss_mib": rss}, out_dir=args.out)
    print_tables(bench, args, label, list(llamas), rss)
    for path in paths:
        print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
