"""What admission sends to the renderer pool: requests whose text or params need input-sized work
(tokenizing, grammars), and nothing else.

Checking token ids is Python work that holds the GIL on any thread, so a token-id prompt is
admitted inline: it never waits for, or is refused by, a full pool. A chat is rendered and
tokenized in one pool job, its ids then admitted inline; echoing a token-id prompt decodes
its ids on the pool, not on the event loop. One AsyncLLM serves the module, built outside the
loop (its output handler starts with the first request).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import aiohttp
import pytest

from engine import AsyncEngineArgs, AsyncLLM, SamplingParams
from engine.sampling_params import StructuredOutputsParams
from engine.frontend import renderer as renderer_module
from engine.frontend.renderer import INLINE_MAX_BYTES, Renderer, RendererBusyError
from tests.helpers.engine_utils import TINY

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY))
    yield llm
    llm.shutdown()


async def collect(engine, prompt, params, request_id) -> list:
    return [out async for out in engine.generate(prompt, params, request_id)]


async def test_a_token_id_prompt_is_admitted_while_the_pool_is_full(engine):
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, truncate_prompt_tokens=8)
    shared, full = engine.renderer, Renderer(1, max_pending_jobs=1)
    release = threading.Event()
    engine.renderer = full
    blocker = asyncio.ensure_future(full.run(INLINE_MAX_BYTES, release.wait))
    try:
        while full.pending[0] < 1:
            await asyncio.sleep(0)
        with pytest.raises(RendererBusyError):  # text this long is tokenized on the pool
            await collect(engine, "word " * INLINE_MAX_BYTES, params, "text")
        outs = await collect(engine, [5] * (2 * INLINE_MAX_BYTES), params, "ids")
        assert outs[-1].finished and len(outs[-1].prompt_token_ids) == 8
    finally:
        release.set()
        await blocker
        engine.renderer = shared
        full.shutdown()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=2, bad_words=[f"word{i}" for i in range(1000)]),
        SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(choice=[f"c{i}" for i in range(4000)])),
        SamplingParams(
            max_tokens=2,
            structured_outputs=StructuredOutputsParams(
                json={"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
            ),
        ),
    ],
    ids=["bad_words", "choice", "json"],
)
async def test_a_short_prompt_with_long_params_is_admitted_on_the_pool(engine, params):
    shared, full = engine.renderer, Renderer(1, max_pending_jobs=1)
    release = threading.Event()
    engine.renderer = full
    blocker = asyncio.ensure_future(full.run(INLINE_MAX_BYTES, release.wait))
    try:
        while full.pending[0] < 1:
            await asyncio.sleep(0)
        with pytest.raises(RendererBusyError):  # its tokenizing or grammar work would run on the pool
            await collect(engine, "Hi", params, "long-params")
        outs = await collect(engine, "Hi", SamplingParams(max_tokens=2), "short")  # nothing to weigh: inline
        assert outs[-1].finished
    finally:
        release.set()
        await blocker
        engine.renderer = shared
        full.shutdown()


async def test_a_chat_and_an_echoed_token_id_prompt_take_one_pool_job_each(engine, monkeypatch):
    from aiohttp.test_utils import TestServer

    from engine.entrypoints.openai.server import ServerSettings, build_app

    # Prompts of this test are long enough to go to the pool (a few hundred bytes, not KBs).
    monkeypatch.setattr(renderer_module, "INLINE_MAX_BYTES", 64)
    jobs: list[str] = []
    executor = engine.renderer._executor
    submit = executor.submit
    monkeypatch.setattr(executor, "submit", lambda fn, *args: jobs.append(fn.__name__) or submit(fn, *args))

    @contextlib.asynccontextmanager
    async def shared_engine():
        yield engine

    app = build_app(shared_engine(), ServerSettings())
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        chat = {"messages": [{"role": "user", "content": "Tell me about the sea. " * 20}], "max_tokens": 2}
        async with session.post(str(server.make_url("/v1/chat/completions")), json=chat) as resp:
            assert resp.status == 200, await resp.text()
        # The body parsed (past the test's 64 bytes), then rendered and tokenized at once; its ids
        # admitted inline.
        assert jobs == ["_parse", "_render"]

        jobs.clear()
        ids = list(range(300, 400))
        echo = {"prompt": ids, "echo": True, "max_tokens": 2, "temperature": 0.0}
        async with session.post(str(server.make_url("/v1/completions")), json=echo) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        assert jobs == ["_parse", "decode"]  # admitted inline; the echo decoded on the pool
        assert body["choices"][0]["text"].startswith(engine.tokenizer.decode(ids))
