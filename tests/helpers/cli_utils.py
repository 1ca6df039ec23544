"""``ringllm serve``'s argument parser, built as the command builds it, for the tests that parse
flags without starting a server (test_cli.py, test_prefill_pacer.py)."""

from __future__ import annotations

import argparse

from engine.config import AsyncEngineArgs
from engine.entrypoints.cli_args import add_engine_args, add_model_positional, add_server_args, add_tool_args


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringllm serve", exit_on_error=False)
    add_model_positional(parser)
    add_server_args(parser)
    add_engine_args(parser, AsyncEngineArgs)
    add_tool_args(parser)
    return parser
