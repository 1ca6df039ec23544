"""AsyncLLM's vLLM surface beyond generate: the EngineClient base the server depends on,
from_vllm_config / start_engine_loop, shutdown's timeout and the shutdown_timeout setting,
data_parallel_rank routing, lora_request / tokenization_kwargs, and an abort seen through the
OpenAI server (the stream ends with a finish_reason "abort" chunk and [DONE])."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest

from engine import AsyncEngineArgs, AsyncLLM, SamplingParams
from engine.server_interface import EngineClient
from tests.helpers.engine_utils import TINY

PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


async def collect(engine: AsyncLLM, prompt, request_id: str, **kwargs):
    return [out async for out in engine.generate(prompt, PARAMS, request_id, **kwargs)]


async def test_from_vllm_config_without_starting_the_loop_is_an_engine_client(tiny_model_dir):
    config = AsyncEngineArgs(model=tiny_model_dir, **TINY).create_engine_config()
    engine = AsyncLLM.from_vllm_config(config, start_engine_loop=False)
    try:
        assert isinstance(engine, EngineClient) and await engine.get_vllm_config() is config
        assert engine.output_handler is None  # left to the first request
        outs = await collect(engine, {"prompt_token_ids": [3, 4]}, "a")
        assert outs[-1].finished and engine.output_handler is not None
    finally:
        engine.shutdown()
    started = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY), start_engine_loop=True)
    try:
        assert started.output_handler is not None  # started at once, inside this loop
    finally:
        started.shutdown()


async def test_lora_request_and_tokenization_kwargs_on_generate(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY))
    try:
        text = "one two three four five six seven eight"
        outs = await collect(
            engine, text, "t", tokenization_kwargs={"truncation": True, "max_length": 4}, lora_request=None
        )
        assert len(outs[-1].prompt_token_ids) == 4 and outs[-1].prompt == text
        with pytest.raises(ValueError, match="LoRA"):
            await collect(engine, text, "l", lora_request=object())
        assert engine.output_processor.get_num_unfinished_requests() == 0
    finally:
        engine.shutdown()


async def test_data_parallel_rank_routes_the_request_to_that_rank(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, data_parallel_size=2, **TINY))
    try:
        for i in range(3):
            await collect(engine, {"prompt_token_ids": [5, 6, i + 7]}, f"r{i}", data_parallel_rank=1)
        rank0, rank1 = await engine.get_stats()
        assert rank0["prefix_cache_queries"] == 0 and rank1["prefix_cache_queries"] > 0
        with pytest.raises(ValueError, match="data_parallel_rank=2"):
            await collect(engine, "x", "bad", data_parallel_rank=2)
    finally:
        engine.shutdown()


def test_shutdown_gives_a_stuck_core_shutdown_timeout_seconds_then_kills_it(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, shutdown_timeout=6.0, **TINY))
    pid = engine.engine_core.ready.pid
    os.kill(pid, signal.SIGSTOP)  # a core that cannot answer SHUTDOWN
    start = time.monotonic()
    engine.shutdown()
    assert time.monotonic() - start >= 6.0  # the setting, not the 5 s default
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped


async def test_an_aborted_request_streams_a_final_abort_chunk_and_done_through_the_server(tiny_model_dir):
    from aiohttp.test_utils import TestServer

    from engine.async_llm import build_async_engine_client_from_engine_args
    from engine.entrypoints.openai.server import SERVING, ServerSettings, build_app

    app = build_app(
        build_async_engine_client_from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY)), ServerSettings()
    )
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        engine = app[SERVING].completion.engine
        for route, body, engine_id in [
            ("/v1/completions", {"prompt": "hello"}, lambda chunk_id: f"{chunk_id}-0"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}, lambda c: c),
        ]:
            payload = {**body, "max_tokens": 200, "ignore_eos": True, "stream": True}
            async with session.post(str(server.make_url(route)), json=payload) as resp:
                assert resp.status == 200
                first = json.loads((await resp.content.readuntil(b"\n\n"))[len(b"data: ") :])
                await engine.abort(engine_id(first["id"]))
                events = [e for e in (await asyncio.wait_for(resp.content.read(), 60)).decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            reasons = [choice["finish_reason"] for e in events[:-1] for choice in json.loads(e[6:])["choices"]]
            assert reasons[-1] == "abort" and reasons.count("abort") == 1, reasons
            assert len(reasons) < 200  # it ended early, not after max_tokens
