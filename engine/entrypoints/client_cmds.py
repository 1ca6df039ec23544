"""``ringllm chat`` and ``ringllm complete``: interactive clients of a running server.

They speak to the server through the ``openai`` package, as users' programs do, and stream
every answer. Ctrl-C during an answer closes its stream (the server then aborts the request)
and returns to the prompt; Ctrl-D or Ctrl-C at the prompt quits.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Iterable, Optional


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    chat = subparsers.add_parser(
        "chat",
        help="Chat with a running server (interactive, streamed).",
        description="Chat with a running ringllm (or any OpenAI-compatible) server. The conversation is "
        "kept and resent each turn.",
    )
    _add_client_args(chat)
    chat.add_argument("--system-prompt", help="A system message to open the conversation with.")
    chat.set_defaults(func=run_chat)
    complete = subparsers.add_parser(
        "complete",
        help="Complete prompts with a running server (interactive, streamed).",
        description="Send each line read as a prompt to /v1/completions of a running server and stream the completion.",
    )
    _add_client_args(complete)
    complete.set_defaults(func=run_complete)


def _add_client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default="http://127.0.0.1:8000/v1", help="The server's OpenAI base URL (default: %(default)s)."
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "EMPTY"),
        help="API key, if the server needs one (default: $OPENAI_API_KEY).",
    )
    parser.add_argument("--model", help="Model name (default: the first model the server lists).")
    parser.add_argument("--max-tokens", type=int, default=256, help="Most tokens per answer (default: %(default)s).")
    parser.add_argument("--temperature", type=float, help="Sampling temperature (default: the server's).")
    parser.add_argument("--quick", metavar="TEXT", help="Send TEXT once, print the answer and exit.")


def _client(args: argparse.Namespace):
    from openai import OpenAI

    client = OpenAI(base_url=args.url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    return client, model


def _print_stream(pieces: Iterable[Optional[str]]) -> str:
    text = []
    for piece in pieces:
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()
            text.append(piece)
    sys.stdout.write("\n")
    return "".join(text)


def _loop(ask: Callable[[str], str], quick: Optional[str]) -> None:
    if quick is not None:
        ask(quick)
        return
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            sys.stdout.write("\n")
            return
        if not line.strip():
            continue
        try:
            ask(line)
        except KeyboardInterrupt:
            sys.stdout.write("\n[interrupted]\n")


def _sampling(args: argparse.Namespace) -> dict:
    return {
        "max_tokens": args.max_tokens,
        **({"temperature": args.temperature} if args.temperature is not None else {}),
    }


def run_chat(args: argparse.Namespace) -> None:
    client, model = _client(args)
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []

    def ask(text: str) -> str:
        messages.append({"role": "user", "content": text})
        with client.chat.completions.create(model=model, messages=messages, stream=True, **_sampling(args)) as stream:
            try:
                reply = _print_stream(c.choices[0].delta.content for c in stream if c.choices)
            except KeyboardInterrupt:
                messages.pop()  # the turn did not happen
                raise
        messages.append({"role": "assistant", "content": reply})
        return reply

    _loop(ask, args.quick)


def run_complete(args: argparse.Namespace) -> None:
    client, model = _client(args)

    def ask(text: str) -> str:
        with client.completions.create(model=model, prompt=text, stream=True, **_sampling(args)) as stream:
            return _print_stream(c.choices[0].text for c in stream if c.choices)

    _loop(ask, args.quick)
