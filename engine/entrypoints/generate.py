"""``ringllm generate "prompt" ...``: offline generation with ``LLM``, printing the text and the
speed. Generation is timed apart from start-up (loading the model and starting the core),
so tokens/s measures the engine, not the import of torch."""

from __future__ import annotations

import argparse
import sys
import time

import msgspec

from engine.config import EngineArgs
from engine.entrypoints.cli_args import add_engine_args, engine_args_from
from engine.exceptions import EngineStartupError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="Generate offline from one or more prompts and print tokens/s.",
        description="Load the model with LLM (the offline entry point), generate a completion for each "
        "PROMPT (or a chat reply, with --chat) and print the text and the generation speed.",
    )
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="Prompt text; several run as one batch.")
    sampling = parser.add_argument_group(
        "sampling (unset: the model's generation config, then SamplingParams' defaults)"
    )
    sampling.add_argument(
        "--max-tokens", type=int, default=128, help="Tokens to generate per prompt (default: %(default)s)."
    )
    sampling.add_argument("--temperature", type=float, help="0 for greedy.")
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--ignore-eos", action="store_true", help="Always generate --max-tokens tokens.")
    sampling.add_argument(
        "--chat", action="store_true", help="Send each prompt as a user message through the chat template."
    )
    add_engine_args(parser, EngineArgs)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    try:
        outputs, elapsed = _generate(args)
    except (ValueError, EngineStartupError) as exc:  # a bad flag value or a model that cannot load
        sys.exit(f"ringllm generate: error: {exc}")
    generated = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    for prompt, out in zip(args.prompts, outputs):
        sys.stdout.write(f"--- {prompt!r}\n{out.outputs[0].text}\n")
    prompt_tokens = sum(len(out.prompt_token_ids or ()) for out in outputs)
    sys.stdout.write(
        f"--- {len(outputs)} prompt(s), {prompt_tokens} prompt tokens, {generated} generated tokens "
        f"in {elapsed:.2f} s: {generated / elapsed:.1f} tokens/s\n"
    )


def _generate(args: argparse.Namespace) -> tuple[list[RequestOutput], float]:
    from engine.llm import LLM

    llm = LLM.from_engine_args(engine_args_from(args, EngineArgs))
    try:
        chosen = {
            name: getattr(args, name)
            for name in ("max_tokens", "temperature", "top_p", "top_k")
            if getattr(args, name) is not None
        }
        defaults = msgspec.structs.asdict(llm.get_default_sampling_params())
        params = SamplingParams(**{**defaults, **chosen, "ignore_eos": args.ignore_eos})
        start = time.perf_counter()
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=False)
        else:
            outputs = llm.generate(args.prompts, params, use_tqdm=False)
        return outputs, time.perf_counter() - start
    finally:
        llm.shutdown()
