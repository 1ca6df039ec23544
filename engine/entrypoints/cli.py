"""The ``ringllm`` command: ``serve``, ``generate``, ``chat``, ``complete`` and ``bench``.

Each subcommand lives in its own module with an ``add_parser(subparsers)`` (or
``add_parsers``) that registers it and sets ``func``; add one by listing its module in
``COMMAND_MODULES``. Benchmark scenarios are modules with ``main(argv)``, listed in
``BENCH_SCENARIOS``; ``ringllm bench NAME ARGS...`` hands them ARGS untouched.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

from engine.logging_setup import configure_logging

COMMAND_MODULES = (
    "engine.entrypoints.serve",
    "engine.entrypoints.generate",
    "engine.entrypoints.client_cmds",
)

BENCH_SCENARIOS = {
    "transport": (
        "benchmarks.transport",
        "the ring vs pyzmq and multiprocessing.Pipe: latency, CPU per round trip, streaming, bandwidth",
    ),
    "engine-overhead": ("benchmarks.engine_overhead", "engine overhead per step, ring vs zmq"),
    "offline": ("benchmarks.offline", "offline batch throughput with LLM.generate"),
    "serving": ("benchmarks.serving", "the OpenAI server under concurrent streams"),
    "api-servers": (
        "benchmarks.api_servers",
        "streaming tokens/s and frontend CPU per token over a mock core (no model), for --api-server-count 1 and 2",
    ),
    "kv-transfer": (
        "benchmarks.kv_transfer",
        "time to first token of a long prompt, computed vs loaded through the SharedStorageConnector",
    ),
    "realistic": (
        "benchmarks.realistic",
        "a 1.56B Llama (Q4_0 or Q4_K_M GGUF, built once): ringllm vs "
        "llama-server at -t 1 and -t 2, one stream, prefill, 16/64 clients, RSS",
    ),
    "perplexity": (
        "benchmarks.perplexity",
        "perplexity of each weight format (bf16, int8, GGUF blocks) on a fixed "
        "public-domain text, against transformers on the same weights",
    ),
}


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="Run a benchmark scenario (tables, JSON and PNG under benchmarks/out/).",
        description="Run a benchmark scenario. Arguments after the scenario name go to it "
        "(try: ringllm bench transport --help).",
    )
    parser.add_argument(
        "scenario",
        choices=sorted(BENCH_SCENARIOS),
        help="; ".join(f"{k}: {v[1]}" for k, v in sorted(BENCH_SCENARIOS.items())),
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the scenario")
    parser.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    module = importlib.import_module(BENCH_SCENARIOS[args.scenario][0])
    return module.main(args.args) or 0


def build_parser(commands: Optional[tuple[str, ...]] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringllm", description="ringllm: LLM serving over a shared-memory ring (vLLM's entry points)."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES if commands is None else commands:
        module = importlib.import_module(name)
        (getattr(module, "add_parser", None) or module.add_parsers)(subparsers)
    add_bench_parser(subparsers)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    configure_logging()
    # `ringllm bench ...` does not import the engine (torch, the server) just to build --help.
    parser = build_parser(() if argv[:1] == ["bench"] else None)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
