"""``ringllm serve [MODEL]``: the OpenAI-compatible server on an AsyncLLM.

Flags are the server's own plus every ``EngineArgs`` field (see cli_args), parsed into
``AsyncEngineArgs.from_cli_args``, the same schema ``LLM`` takes. With no MODEL the embedded
default model is served (converted once to the cache on first use).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from engine.async_llm import build_async_engine_client_from_engine_args
from engine.config import AsyncEngineArgs, resolve_device
from engine.entrypoints.cli_args import (
    SERVE_CPU_MAX_NUM_PREFILL_TOKENS,
    add_engine_args,
    add_model_positional,
    add_server_args,
    add_tool_args,
    engine_args_from,
    server_settings_from,
    tool_serving_from,
    with_reasoning_markers,
)
from engine.entrypoints.openai.server import run_server
from engine.exceptions import EngineStartupError


def serving_engine_args(args: argparse.Namespace) -> AsyncEngineArgs:
    """The engine arguments `ringllm serve` runs with: the flags, plus the online defaults that
    differ from LLM's (as vLLM's differ by usage context).

    On CPU the prompt tokens of a step are paced ("auto": as many as keep a step near 0.5 s,
    engine/core/prefill_pacer.py) unless --max-num-prefill-tokens is given. Prefill there is
    compute bound, and its speed differs tenfold between CPUs and dtypes (~270 tokens/s for the
    default model in float32 on one AVX2 core, thousands in bfloat16 with AMX): uncapped, a
    burst of 64 prompts is one step of seconds that every first token waits for; paced, first
    tokens go out a few prompts a step, in arrival order, while the running streams keep
    decoding (benchmarks/RESULTS.md, Serving).
    Offline LLM keeps no cap (it wants throughput, not early first tokens), and so does CUDA,
    where the whole 2048-token budget is prefilled in milliseconds.
    With --reasoning-parser, the core is told its markers (cli_args.with_reasoning_markers)."""
    engine_args = engine_args_from(args, AsyncEngineArgs)
    on_cpu = engine_args.device != "cuda" and resolve_device(engine_args.device) == "cpu"
    if engine_args.max_num_prefill_tokens is None and on_cpu:
        engine_args.max_num_prefill_tokens = SERVE_CPU_MAX_NUM_PREFILL_TOKENS
    with_reasoning_markers(engine_args, args)
    return engine_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="Serve a model over an OpenAI-compatible HTTP API.",
        description="Serve MODEL (default: the embedded SmolLM2-135M-Instruct) over an OpenAI-compatible "
        "HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, "
        "/tokenize, /detokenize, /version. SIGTERM or Ctrl-C drains in-flight requests, then "
        "shuts the engine down.",
    )
    add_model_positional(parser)
    add_server_args(parser)
    parser.add_argument(
        "--api-server-count",
        "-asc",
        type=int,
        default=1,
        metavar="N",
        help="Run N API-server processes on the port (SO_REUSEPORT) over one EngineCore, each with "
        "its own ring pair to it; --max-waiting-requests is split between them, /metrics "
        "sums them all (vLLM's flag; default: %(default)s, one process as usual).",
    )
    add_tool_args(parser)
    add_engine_args(parser, AsyncEngineArgs)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT. A configuration the engine refuses (bad model path, invalid
    field) or a core that cannot start ends the command with that one message, no traceback.

    The API key, once read (cli_args.api_key_from), leaves the environment: the EngineCore,
    launched with this process's environment, never holds it (nor its command line: the key
    is no EngineArgs field)."""
    try:
        settings = dataclasses.replace(server_settings_from(args), tool_serving=tool_serving_from(args))
        os.environ.pop("VLLM_API_KEY", None)
        engine_args = serving_engine_args(args)
        if args.api_server_count != 1:
            sys.exit(_run_pool(engine_args, settings, args))
        run_server(build_async_engine_client_from_engine_args(engine_args), settings)
    except (ValueError, EngineStartupError) as exc:
        sys.exit(f"ringllm serve: error: {exc}")


def _run_pool(engine_args: AsyncEngineArgs, settings, args: argparse.Namespace) -> int:
    """--api-server-count N > 1: this process becomes the launcher (openai/api_server_pool.py)."""
    from engine.entrypoints.openai.api_server_pool import ApiServerPool

    tool_args = argparse.Namespace(
        **{
            k: getattr(args, k)
            for k in ("enable_auto_tool_choice", "tool_call_parser", "tool_parser_plugin", "reasoning_parser")
        }
    )
    return ApiServerPool(
        engine_args,
        dataclasses.replace(settings, tool_serving=type(settings.tool_serving)()),
        tool_args,
        args.api_server_count,
    ).run()
