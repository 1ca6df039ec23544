"""The renderer pool and its tokenizer calls (engine/frontend/renderer.py), on the real tokenizer
of the tiny model: same ids as ``transformers``, a byte bound no token exceeds, and a pool bounded
in work that refuses rather than queues without end."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.exceptions import ParameterError
from engine.frontend.renderer import INLINE_MAX_BYTES, Renderer, RendererBusyError, decode, encode, max_token_bytes

SAMPLES = [
    "Hello , world . it's",
    "<|im_start|>user\nhi<|im_end|>",
    "  spaces\tand\nlines  ",
    "é漢字🙂 mixed",
    "x" * 5000,
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_encode_and_decode_match_transformers(tokenizer):
    for text in SAMPLES:
        for special in (True, False):
            assert encode(tokenizer, text, special) == tokenizer.encode(text, add_special_tokens=special)
        ids = tokenizer.encode(text)
        assert decode(tokenizer, ids) == tokenizer.decode(ids)


def test_no_token_covers_more_text_than_max_token_bytes(tokenizer):
    bound = max_token_bytes(tokenizer)
    longest = max(len(tokenizer.decode([i]).encode()) for i in range(len(tokenizer)))
    assert longest <= bound <= 2 * longest  # a bound, and a tight one


def test_a_text_longer_than_the_context_can_hold_is_refused_before_tokenizing(tiny_model_dir, tokenizer):
    from engine.config import EngineArgs
    from engine.frontend.input_processor import InputProcessor

    processor = InputProcessor(EngineArgs(model=tiny_model_dir, load_format="dummy").create_engine_config(), tokenizer)
    limit = processor.max_prompt_bytes
    assert limit == processor.max_model_len * max_token_bytes(tokenizer)
    processor.check_text_fits("a" * limit)
    with pytest.raises(ParameterError, match=r"bytes") as refused:
        processor.check_text_fits("a" * (limit + 1))
    assert refused.value.parameter == "prompt"
    with pytest.raises(ParameterError) as refused:
        processor.check_text_fits("é" * limit, param="messages")  # 2 bytes a character
    assert refused.value.parameter == "messages"


async def test_small_work_runs_inline_and_large_work_on_the_pool():
    renderer = Renderer(1)
    try:
        assert await renderer.run(INLINE_MAX_BYTES - 1, lambda: threading.current_thread().name) == "MainThread"
        assert (await renderer.run(INLINE_MAX_BYTES, lambda: threading.current_thread().name)).startswith("renderer")
    finally:
        renderer.shutdown()


async def test_the_pool_refuses_work_past_its_bounds_and_frees_it_when_done():
    release = threading.Event()
    renderer = Renderer(1, max_pending_jobs=2, max_pending_bytes=3 * INLINE_MAX_BYTES)
    try:
        jobs = [asyncio.ensure_future(renderer.run(INLINE_MAX_BYTES, release.wait)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(RendererBusyError):  # a third job
            await renderer.run(INLINE_MAX_BYTES, release.wait)
        jobs[0].cancel()  # a running job whose caller is gone still holds its place until it ends
        jobs[1].cancel()  # a queued one is dropped, and frees its place at once
        await asyncio.sleep(0.05)
        assert renderer.pending == (1, INLINE_MAX_BYTES)
        release.set()
        for _ in range(100):
            if renderer.pending == (0, 0):
                break
            await asyncio.sleep(0.01)
        assert renderer.pending == (0, 0)
        big = Renderer(1, max_pending_bytes=2 * INLINE_MAX_BYTES)
        with pytest.raises(RendererBusyError):  # too many bytes at once
            await big.run(3 * INLINE_MAX_BYTES, len, "")
        big.shutdown()
    finally:
        release.set()
        renderer.shutdown()
