"""The ``ringllm`` command line: flags generated from EngineArgs, complete help on every
command, and ``ringllm generate`` end to end on the tiny model."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess

import pytest

from engine.config import AsyncEngineArgs
from engine.entrypoints.cli_args import ENGINE_ARG_HELP, engine_args_from, server_settings_from
from engine.entrypoints.openai.server import ServerSettings
from tests.helpers.cli_utils import serve_parser
from tests.helpers.openai_server_utils import RINGLLM


def test_every_engine_arg_has_a_flag_with_help_and_defaults_round_trip():
    assert set(ENGINE_ARG_HELP) == {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    args = serve_parser().parse_args([])
    assert engine_args_from(args, AsyncEngineArgs) == AsyncEngineArgs()
    assert server_settings_from(args) == ServerSettings()


def test_flags_parse_into_the_same_schema_as_llm():
    args = serve_parser().parse_args(
        [
            "/models/x",
            "--no-enable-prefix-caching",
            "--transport",
            "zmq",
            "--max-num-seqs",
            "8",
            "--gpu-memory-utilization",
            "0.5",
            "--compilation-config",
            '{"mode": 1}',
            "--hf-overrides",
            '{"a": 1}',
            "--data-parallel-size",
            "2",
            "--enable-log-requests",
            "--api-key",
            "k",
            "--max-waiting-requests",
            "3",
            "--request-timeout",
            "2.5",
            "--host",
            "0.0.0.0",
        ]
    )
    assert engine_args_from(args, AsyncEngineArgs) == AsyncEngineArgs(
        model="/models/x",
        enable_prefix_caching=False,
        transport="zmq",
        max_num_seqs=8,
        gpu_memory_utilization=0.5,
        compilation_config={"mode": 1},
        hf_overrides={"a": 1},
        data_parallel_size=2,
        enable_log_requests=True,
    )
    assert server_settings_from(args) == ServerSettings(
        host="0.0.0.0", api_key="k", max_waiting_requests=3, request_timeout_s=2.5
    )
    assert serve_parser().parse_args(["--compilation-config", "2"]).compilation_config == 2


@pytest.mark.parametrize(
    "flags",
    [["--transport", "tcp"], ["--hf-overrides", "[1]"], ["--max-num-seqs", "many"], ["--scheduling-policy", "lifo"]],
)
def test_bad_flag_values_are_refused_by_the_parser(flags):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        serve_parser().parse_args(flags)


def test_bad_server_settings_name_the_field():
    with pytest.raises(ValueError, match="request_timeout_s"):
        ServerSettings(request_timeout_s=0)
    with pytest.raises(ValueError, match="max_waiting_requests"):
        ServerSettings(max_waiting_requests=-1)


@pytest.mark.parametrize(
    "command,expected",
    [
        (
            "serve",
            [
                "MODEL",
                "--host",
                "--port",
                "--api-key",
                "--max-waiting-requests",
                "--request-timeout",
                "--drain-timeout",
                "--api-key-file",
                "--header-timeout",
                "--body-timeout",
                "--keep-alive-timeout",
                "--max-connections",
                "--health-busy-timeout",
                "--health-idle-timeout",
                *(f"--{f.replace('_', '-')}" for f in ENGINE_ARG_HELP),
            ],
        ),
        ("generate", ["PROMPT", "--max-tokens", "--chat", "--model", "--transport"]),
        ("chat", ["--url", "--api-key", "--model", "--system-prompt", "--quick"]),
        ("complete", ["--url", "--api-key", "--model", "--quick"]),
    ],
)
def test_help_of_every_command_lists_its_options(command, expected):
    out = subprocess.run([*RINGLLM, command, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    missing = [flag for flag in expected if flag not in out.stdout]
    assert not missing
    top = subprocess.run([*RINGLLM, "--help"], capture_output=True, text=True, timeout=60)
    assert command in top.stdout


def test_generate_prints_the_text_and_the_speed(tiny_model_dir):
    out = subprocess.run(
        [
            *RINGLLM,
            "generate",
            "Hello there",
            "Once upon a time",
            "--model",
            tiny_model_dir,
            "--load-format",
            "dummy",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--kv-cache-memory",
            str(16 << 20),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert "--- 'Hello there'" in out.stdout and "--- 'Once upon a time'" in out.stdout
    assert "2 prompt(s)" in out.stdout and "12 generated tokens" in out.stdout and "tokens/s" in out.stdout


def test_serve_on_cpu_caps_prompt_tokens_per_step_unless_told_otherwise(monkeypatch):
    import torch

    from engine.entrypoints.serve import SERVE_CPU_MAX_NUM_PREFILL_TOKENS, serving_engine_args

    def cap(*flags: str):
        return serving_engine_args(serve_parser().parse_args(list(flags))).max_num_prefill_tokens

    assert cap("--device", "cpu") == SERVE_CPU_MAX_NUM_PREFILL_TOKENS
    assert cap("--device", "cpu", "--max-num-prefill-tokens", "0") == 0  # 0: no cap, as asked
    assert cap("--device", "cpu", "--max-num-prefill-tokens", "512") == 512
    assert cap("--device", "cuda") is None  # a GPU prefills the whole budget in milliseconds
    assert SERVE_CPU_MAX_NUM_PREFILL_TOKENS == "auto"  # paced by time (engine/core/prefill_pacer.py)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cap() == SERVE_CPU_MAX_NUM_PREFILL_TOKENS
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("engine.config.device_config.torch_built_for_gpu", lambda: True)  # as a CUDA build of torch
    assert cap() is None


def test_reasoning_parser_markers_join_the_structured_outputs_flag_and_are_resolved_with_it(tiny_model_dir):
    """--reasoning-parser adds its markers to --structured-outputs-config's object as given;
    create_engine_config resolves the whole once (a bad field is still its error, naming it)."""
    from engine.entrypoints.serve import serving_engine_args

    def serving(*flags: str):
        return serving_engine_args(serve_parser().parse_args([tiny_model_dir, "--load-format", "dummy", *flags]))

    args = serving("--reasoning-parser", "qwen3", "--structured-outputs-config", '{"disable_any_whitespace": true}')
    assert args.structured_outputs_config == {
        "disable_any_whitespace": True,
        "reasoning_start": "<think>",
        "reasoning_end": "</think>",
    }
    so = args.create_engine_config().structured_outputs_config
    assert (so.reasoning_start, so.reasoning_end, so.disable_any_whitespace) == ("<think>", "</think>", True)
    assert serving().structured_outputs_config is None  # no parser: no markers
    bad = serving("--reasoning-parser", "qwen3", "--structured-outputs-config", '{"backend": "nope"}')
    with pytest.raises(ValueError, match="structured_outputs_config.backend"):
        bad.create_engine_config()


def test_llm_keeps_no_prefill_cap_and_a_bad_cap_names_the_field(tiny_model_dir):
    from engine.config import EngineArgs

    args = dict(model=tiny_model_dir, load_format="dummy", device="cpu")
    assert EngineArgs(**args).create_engine_config().scheduler_config.max_num_prefill_tokens == 0
    config = EngineArgs(**args, max_num_prefill_tokens=128).create_engine_config()
    assert config.scheduler_config.max_num_prefill_tokens == 128
    with pytest.raises(ValueError, match="max_num_prefill_tokens"):
        EngineArgs(**args, max_num_prefill_tokens=-1).create_engine_config()
