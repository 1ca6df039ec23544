"""A short request is not stuck behind a long prefill (red team round 3, finding 9: a 2-token
request sent during a 3,640-token prefill waited 10.6 s), on the default model with
``ringllm serve``'s time-paced prefill cap, through an AsyncLLM over a real core process.

The step time comes from the engine's own output timestamps: a decoding stream gets one token
per step, so the gaps between its outputs are the steps, whatever the machine's load."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_llm import build_async_engine_client_from_engine_args
from engine.config import AsyncEngineArgs
from engine.sampling_params import RequestOutputKind, SamplingParams
from tests.helpers.engine_utils import nothing_left_behind  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.model]

LONG_PROMPT_TOKENS = 3000
STEP_TOKENS = 256  # the paced cap's ceiling: the long prompt is a dozen steps or more on any machine


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA)


async def test_a_short_request_answers_within_two_steps_of_a_long_prefill():
    args = AsyncEngineArgs(
        max_model_len=4096,
        max_num_prefill_tokens="auto",
        max_num_batched_tokens=STEP_TOKENS,
        enable_prefix_caching=False,
    )
    async with build_async_engine_client_from_engine_args(args) as llm:
        ticks: list[float] = []  # when each of the ticker's outputs was made: one per step
        ticking = asyncio.Event()

        async def ticker() -> None:
            async for out in llm.generate({"prompt_token_ids": [1, 9690, 198]}, greedy(4000), "ticker"):
                ticks.append(out.metrics.last_token_ts)
                ticking.set()

        async def one(request_id: str, prompt_token_ids: list[int]):
            return [out async for out in llm.generate({"prompt_token_ids": prompt_token_ids}, greedy(1), request_id)]

        ticker_task = asyncio.create_task(ticker())
        await asyncio.wait_for(ticking.wait(), 60)
        long_task = asyncio.create_task(one("long", [100 + i for i in range(LONG_PROMPT_TOKENS)]))
        ticks_at_long = len(ticks)
        while len(ticks) < ticks_at_long + 2:  # the long prompt's first chunk is computed
            await asyncio.sleep(0.01)
        short = (await asyncio.wait_for(one("short", [1, 9690]), 120))[-1]
        long_was_running = not long_task.done()
        await llm.abort(["ticker", "long"])  # what is left of its prefill is not this test's
        await asyncio.gather(ticker_task, long_task, return_exceptions=True)

    assert short.finished and long_was_running
    steps = [b - a for a, b in zip(ticks[ticks_at_long:], ticks[ticks_at_long + 1 :])]
    waited = short.metrics.first_token_ts - short.metrics.arrival_time
    assert waited <= sum(sorted(steps)[-2:]), (waited, steps)
