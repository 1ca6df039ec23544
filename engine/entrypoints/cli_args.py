"""Command-line flags generated from the ``EngineArgs`` dataclass, plus the server's own.

Every EngineArgs field becomes ``--field-name`` with its type, default and allowed values
read from the dataclass, so the CLI cannot drift from the Python API: a new field is a new
flag (the one thing to add by hand is its help line below, which a test checks).
``AsyncEngineArgs.from_cli_args`` reads the parsed namespace back into the dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import stat
import typing
from typing import Any, Callable, Literal, Optional, Union

from engine import envs
from engine.config import DEFAULT_MODEL, AsyncEngineArgs, EngineArgs
from engine.entrypoints.openai.responses_store import StoreLimits
from engine.entrypoints.openai.server import ServerSettings
from engine.entrypoints.openai.serving_lora import parse_lora_module

logger = logging.getLogger(__name__)

# `ringllm serve` on CPU paces the prompt tokens of a step unless --max-num-prefill-tokens is given
# (engine/entrypoints/serve.py says why).
SERVE_CPU_MAX_NUM_PREFILL_TOKENS = "auto"

ENGINE_ARG_HELP = {
    "model": "Model to serve: a local HF directory or a .gguf file (default: the embedded "
    "SmolLM2-135M-Instruct; nothing is ever downloaded).",
    "tokenizer": "Tokenizer directory, if not the model's own.",
    "trust_remote_code": "Allow custom code shipped with a model's config.",
    "dtype": "Model dtype: auto (bfloat16 on CPUs with AVX-512 BF16, else float32), float32, bfloat16 or float16.",
    "seed": "Random seed of the engine (per-request seeds are set in the request).",
    "max_model_len": "Context length (prompt + output); default: the model's max_position_embeddings.",
    "block_size": "Tokens per KV-cache block (a power of two).",
    "max_num_seqs": "Most sequences in one step (default 256).",
    "max_num_batched_tokens": "Token budget of one step (default 2048 with chunked prefill).",
    "max_num_prefill_tokens": "Most prompt tokens computed in one step, over all requests (decodes do not "
    "count; 0: no cap; auto: as many as keep a step near 0.5 s on this machine, "
    "as measured). A burst of new requests then gets first tokens over several "
    "steps, in arrival order, while running streams keep their pace; a prompt longer "
    "than the cap is computed in chunks. Default: "
    f"{SERVE_CPU_MAX_NUM_PREFILL_TOKENS} for `ringllm serve` on CPU, else no cap.",
    "enable_prefix_caching": "Reuse KV blocks of shared prompt prefixes.",
    "enable_chunked_prefill": "Split long prefills across steps and mix them with decodes.",
    "scheduling_policy": "fcfs, or priority (lower value first, then arrival).",
    "load_format": "auto, safetensors, gguf, or dummy (random weights: overhead tests).",
    "device": "auto (cuda when available), cpu or cuda.",
    "kv_cache_memory_bytes": "Bytes for the KV cache on CPU (default 2 GiB).",
    "kv_cache_memory": "Alias of --kv-cache-memory-bytes.",
    "gpu_memory_utilization": "Fraction of GPU memory the engine may use (CUDA), in (0, 1].",
    "max_logprobs": "Most logprobs a request may ask for.",
    "max_prompt_logprobs_entries": "Most prompt logprobs one request may ask for, counted as prompt tokens x "
    "(prompt_logprobs + 1) x n (echo with logprobs asks for them too; -1 counts "
    "the vocabulary): they are computed for every prompt position and answered in "
    "one body, ~70 bytes each in JSON. Beyond it, a 400.",
    "num_threads": "torch (and kernel) threads in the EngineCore process (default: every core for a model "
    "of 600 MiB of weights or more, else all cores but one; engine/thread_policy.py).",
    "enforce_eager": "Never run the model through torch.compile.",
    "compilation_config": "torch.compile mode as an int (0 = eager) or a JSON object.",
    "data_parallel_size": "Number of EngineCore processes, requests balanced over them.",
    "data_parallel_rank": "This frontend's rank, with --data-parallel-external-lb.",
    "data_parallel_external_lb": "Serve one data-parallel rank behind an external load balancer.",
    "transport": "Frontend <-> EngineCore transport: shm (shared-memory rings) or zmq (baseline).",
    "ring_capacity": "Bytes per ring direction (a power of two).",
    "skip_tokenizer_init": "Do not load a tokenizer (token-id prompts only).",
    "disable_log_stats": "Do not collect per-step scheduler stats.",
    "renderer_num_workers": "Threads that tokenize prompts, render chat templates and detokenize off the event "
    "loop (short inputs stay on it).",
    "served_model_name": "The model name clients send and see (default: --model).",
    "hf_overrides": "JSON object of HF config fields to override.",
    "tensor_parallel_size": "Must be 1: each EngineCore runs the whole model on one device.",
    "pipeline_parallel_size": "Must be 1: each EngineCore runs the whole model on one device.",
    "quantization": "unset (weights in --dtype), gguf (a .gguf model runs its own blocks; its default) or int8 "
    "(dynamic W8A8 from a float checkpoint, CPU).",
    "shutdown_timeout": "Seconds the EngineCore processes get to exit at shutdown before they are killed.",
    "worker_cls": "The EngineCore's worker: auto, or the dotted path (module.Class) of an "
    "engine.worker.Worker subclass.",
    "kv_transfer_config": "KV connector as a JSON object with vLLM's fields, e.g. "
    '\'{"kv_connector": "SharedStorageConnector", "kv_role": "kv_both", '
    '"kv_connector_extra_config": {"shared_storage_path": "/dev/shm/kv-$USER"}}\' '
    "(kv_role: kv_producer, kv_consumer or kv_both). The directory must be this user's and "
    "not writable by others (created 0700 when missing): a store is shared by one user's "
    "processes only.",
    "kv_events_config": "KV-cache events as a JSON object with vLLM's fields, e.g. "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", "topic": ""}\' (also endpoint, '
    "replay_endpoint, buffer_steps, hwm, max_queue_size): BlockStored, BlockRemoved and "
    "AllBlocksCleared in vLLM's msgpack format over a ZMQ PUB socket. Without endpoint: an "
    "ipc socket in a private directory, its path logged. An address other hosts can reach "
    '(tcp://*:P) needs "allow_remote": true; token ids are sent only with '
    '"include_token_ids": true.',
    "runner": "auto (generate for the *ForCausalLM models here), generate, or pooling (an embedding model: "
    "LLM.embed, /v1/embeddings).",
    "convert": "auto, none, or embed: how a *ForCausalLM becomes a pooling model (runner pooling).",
    "pooler_config": 'Pooling model: JSON object, e.g. \'{"pooling_type": "MEAN", "normalize": true}\' '
    "(pooling_type LAST, the default, or MEAN).",
    "deterministic": "Greedy output (tokens and logprobs) the same at any batch size and with or without "
    "prefix-cache hits: one kernel path per op whatever the row count (vLLM's batch "
    "invariance). CPU, eager forward; slower (README, Determinism).",
    "structured_outputs_config": 'Structured outputs as a JSON object, e.g. \'{"backend": "auto"}\' (backend: auto '
    "= xgrammar, and guidance for what xgrammar cannot compile; xgrammar; guidance; "
    "compile_timeout_s: how long a request waits for its grammar, default 10).",
    "speculative_config": 'Speculative decoding as a JSON object with vLLM\'s keys, e.g. \'{"method": "ngram", '
    '"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}\' (n-gram '
    "prompt lookup; also disable_by_batch_size). Greedy output is unchanged; a draft model "
    "is not yet supported.",
    "enable_log_requests": "Log every request as it is added and aborted.",
    "enable_lora": "Serve LoRA adapters (PEFT directories or llama.cpp GGUF adapters): lora_request in Python, "
    "--lora-modules and model=<adapter> over HTTP.",
    "max_loras": "Most LoRA adapters running in one step (requests of further adapters wait for one to finish).",
    "max_lora_rank": "Largest LoRA rank served (1, 8, 16, 32, 64, 128, 256, 320 or 512).",
    "max_cpu_loras": "LoRA adapters kept loaded in memory, least recently used dropped first (default: --max-loras).",
}


def _json_or_int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected an int or a JSON object, got {text!r}") from None


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _int_or_name(names: list[str]) -> Callable[[str], Union[int, str]]:
    def int_or_name(text: str) -> Union[int, str]:
        if text in names:
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer or one of {names}, got {text!r}") from None

    return int_or_name


def _flag_kwargs(hint: Any) -> dict[str, Any]:
    """argparse keywords for a field's type: bools get --x/--no-x, Literals their choices."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Union and len(args) == 1:
        hint = args[0]  # Optional[X] -> X
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(hint) is Literal:
        return {"choices": list(typing.get_args(hint))}
    names = [v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a)]
    if int in args and names:  # an int or a named setting (max_num_prefill_tokens: "auto")
        return {"type": _int_or_name(names), "metavar": "|".join(["INT", *names])}
    if hint in (int, float, str):
        return {"type": hint}
    if str in args:  # a name on the command line, an object in Python (worker_cls)
        return {"type": str}
    if hint is dict or (dict in args and int not in args):  # a dict, or a config given as one
        return {"type": _json_object, "metavar": "JSON"}
    return {"type": _json_or_int, "metavar": "INT|JSON"}  # compilation_config


def add_engine_args(parser: argparse.ArgumentParser, cls: type[EngineArgs] = AsyncEngineArgs) -> None:
    group = parser.add_argument_group("engine arguments (the EngineArgs fields)")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint, default = hints[field.name], field.default
        # A None default means "derived", which the help line explains.
        shown = "" if default is None or "default" in ENGINE_ARG_HELP[field.name] else " (default: %(default)s)"
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=field.name,
            default=default,
            help=ENGINE_ARG_HELP[field.name] + shown,
            **_flag_kwargs(hint),
        )


def engine_args_from(args: argparse.Namespace, cls: type[EngineArgs] = AsyncEngineArgs) -> EngineArgs:
    """The dataclass from parsed flags; a positional MODEL, when given, wins over --model."""
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    return cls.from_cli_args(args)


def add_model_positional(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help=f"Model to serve (same as --model; default: {DEFAULT_MODEL}, embedded).",
    )


def add_server_args(parser: argparse.ArgumentParser) -> None:
    d = ServerSettings()
    group = parser.add_argument_group("server arguments")
    group.add_argument("--host", default=d.host, help="Address to bind (default: %(default)s, this host only).")
    group.add_argument("--port", type=int, default=d.port, help="Port (default: %(default)s).")
    group.add_argument(
        "--api-key",
        default=d.api_key,
        help="Require 'Authorization: Bearer KEY' on every route but the probes /health, /metrics "
        "and /version (default: no key). Any local user can read a command line: prefer "
        "--api-key-file or the VLLM_API_KEY environment variable.",
    )
    group.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="Read the API key from this file (its first line), which only its owner may read or "
        "write (mode 0600 or stricter).",
    )
    group.add_argument(
        "--max-waiting-requests",
        type=int,
        default=d.max_waiting_requests,
        help="Most sequences (prompts x n) waiting for their first token; more get 503 with "
        "Retry-After (default: unbounded). A request of more sequences than 8 scheduler batches "
        "(8 x --max-num-seqs) is refused with 400 whatever this is.",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout_s,
        metavar="SECONDS",
        help="Abort a request still running after this long (default: no timeout).",
    )
    group.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=d.max_request_body_bytes,
        help="Larger request bodies get 413 (default: %(default)s).",
    )
    group.add_argument(
        "--drain-timeout",
        type=float,
        default=d.drain_timeout_s,
        metavar="SECONDS",
        help="On SIGTERM, how long in-flight requests may finish; then each stream still running "
        "gets an error event and [DONE], other requests a 503, and all are aborted "
        "(default: %(default)s).",
    )
    group.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        metavar="SECONDS",
        help="Close a connection whose request head is not complete this long after it began "
        "waiting for it (default: %(default)s).",
    )
    group.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        metavar="SECONDS",
        help="A request body not received whole this long after its head is a 408, and the "
        "connection is closed (default: %(default)s).",
    )
    group.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=d.keep_alive_timeout_s,
        metavar="SECONDS",
        help="Close a connection that sends no byte of a next request for this long (default: %(default)s).",
    )
    group.add_argument(
        "--enable-request-id-headers",
        action="store_true",
        default=d.enable_request_id_headers,
        help="Answer every request with an X-Request-Id header: the request's own, or the id it "
        "was served under (vLLM's flag).",
    )
    group.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help="Most open connections. One more closes the longest idle one, or gets 503 when all "
        "are busy (default: 1024, or half the open-file limit when lower; the limit is "
        "raised to its hard limit at start).",
    )
    group.add_argument(
        "--health-busy-timeout",
        type=float,
        default=d.health_busy_timeout_s,
        metavar="SECONDS",
        help="/health answers 503 once the EngineCore leaves a liveness probe (a round trip between "
        "two steps) unanswered this long while requests are in flight; raise it if one step "
        "can take longer (default: %(default)s).",
    )
    group.add_argument(
        "--health-idle-timeout",
        type=float,
        default=d.health_idle_timeout_s,
        metavar="SECONDS",
        help="The same bound while no request is in flight (default: %(default)s).",
    )
    group.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters served from the start (with --enable-lora), each as name=path or a JSON "
        'object {"name": ..., "path": ..., "base_model_name": ...}; a request selects one with '
        "model=<name>.",
    )
    store = d.responses_store
    group.add_argument(
        "--responses-store-max-entries",
        type=int,
        default=store.max_entries,
        help="/v1/responses keeps at most this many responses (store=true, the default) for "
        "previous_response_id and GET; the oldest go first (default: %(default)s).",
    )
    group.add_argument(
        "--responses-store-max-bytes",
        type=int,
        default=store.max_bytes,
        help="... and at most this many bytes of them, as JSON (default: %(default)s).",
    )
    group.add_argument(
        "--responses-store-max-age",
        type=float,
        default=store.max_age_s,
        metavar="SECONDS",
        help="... each for at most this long; a background response still running then is "
        "cancelled (default: %(default)s).",
    )


def api_key_from(args: argparse.Namespace) -> Optional[str]:
    """The key from --api-key, --api-key-file or VLLM_API_KEY, in that order (at most one of the
    flags). A key given on the command line is warned about: /proc/PID/cmdline is world-readable."""
    if args.api_key is not None and getattr(args, "api_key_file", None) is not None:
        raise ValueError("give --api-key or --api-key-file, not both")
    if args.api_key is not None:
        logger.warning(
            "--api-key puts the key on the command line, which every local user can read "
            "(/proc/PID/cmdline); use --api-key-file or VLLM_API_KEY instead"
        )
        return args.api_key
    if getattr(args, "api_key_file", None) is not None:
        return read_api_key_file(args.api_key_file)
    return envs.VLLM_API_KEY


def read_api_key_file(path: str) -> str:
    """The first line of ``path``, refused unless only its owner can read or write it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ValueError(f"--api-key-file {path}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"--api-key-file {path}: not a regular file")
        if mode & 0o077:
            raise ValueError(
                f"--api-key-file {path}: mode {stat.S_IMODE(mode):04o} lets others read or write "
                f"it; make it private (chmod 600 {path})"
            )
        key = f.readline().strip()
    if not key:
        raise ValueError(f"--api-key-file {path}: the file holds no key")
    return key


def server_settings_from(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=args.host,
        port=args.port,
        api_key=api_key_from(args),
        max_request_body_bytes=args.max_request_body_bytes,
        max_waiting_requests=args.max_waiting_requests,
        request_timeout_s=args.request_timeout,
        drain_timeout_s=args.drain_timeout,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_timeout_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
        health_busy_timeout_s=args.health_busy_timeout,
        health_idle_timeout_s=args.health_idle_timeout,
        enable_request_id_headers=args.enable_request_id_headers,
        responses_store=StoreLimits(
            args.responses_store_max_entries, args.responses_store_max_bytes, args.responses_store_max_age
        ),
        lora_modules=tuple(parse_lora_module(m) for m in getattr(args, "lora_modules", None) or ()),
    )


def add_tool_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's tool-calling flags (``tool_choice="auto"`` needs the first two)."""
    group = parser.add_argument_group("tool calling")
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='Let the model decide when to call tools (tool_choice="auto", the default of a request '
        "with tools); needs --tool-call-parser. Without it such a request is a 400; "
        '"required" and a named function work either way.',
    )
    group.add_argument(
        "--tool-call-parser",
        metavar="NAME",
        help="How the model writes its calls: hermes (<tool_call>{...}</tool_call>), llama3_json, "
        "mistral ([TOOL_CALLS][...]), pythonic ([f(a=1)]), or one a --tool-parser-plugin "
        "registers.",
    )
    group.add_argument(
        "--tool-parser-plugin",
        metavar="PATH",
        help="A Python file that registers a tool parser with "
        '@ToolParserManager.register_module("name") (engine.entrypoints.openai.tool_parsers).',
    )
    group.add_argument(
        "--reasoning-parser",
        metavar="NAME",
        help="How the model writes its reasoning: deepseek_r1 or qwen3 (<think>...</think>). The "
        "reasoning is answered as reasoning_content (chat) or a reasoning item (responses), tool "
        "calls are read after it, and a structured-outputs grammar applies only after it.",
    )


def tool_serving_from(args: argparse.Namespace):
    """The server's tool settings, the plugin file run first; a ValueError says what is wrong
    (as vLLM checks at start: the flag pair, the parser's name)."""
    from engine.entrypoints.openai.tool_parsers import ToolParserManager
    from engine.entrypoints.openai.tool_parsers.tool_choice import ToolServing

    if args.tool_parser_plugin:
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    parser_cls = ToolParserManager.get_tool_parser(args.tool_call_parser) if args.tool_call_parser else None
    return ToolServing(args.enable_auto_tool_choice, parser_cls, reasoning_parser_from(args))


def reasoning_parser_from(args: argparse.Namespace):
    """The ``--reasoning-parser`` class, or None; a ValueError lists the known names."""
    from engine.entrypoints.openai.reasoning_parsers import ReasoningParserManager

    name = getattr(args, "reasoning_parser", None)
    return ReasoningParserManager.get_reasoning_parser(name) if name else None


def with_reasoning_markers(engine_args: EngineArgs, args: argparse.Namespace) -> None:
    """Tell the core the ``--reasoning-parser``'s markers, so that a grammar starts after the
    reasoning (engine/structured_output/reasoning.py): they join ``--structured-outputs-config``'s
    JSON object (``engine_args`` holds it as parsed, or None), the parser's markers over any given
    there, and ``create_engine_config`` checks and resolves the whole once, with its other fields."""
    parser_cls = reasoning_parser_from(args)
    if parser_cls is None:
        return
    engine_args.structured_outputs_config = {
        **(engine_args.structured_outputs_config or {}),
        "reasoning_start": parser_cls.start,
        "reasoning_end": parser_cls.end,
    }
