"""Aborting through AsyncLLM: a consumer waiting on an aborted request ends with an "abort"
output, and a thousand aborts made at once reach the core as one message."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_llm import AsyncLLM
from engine.config import AsyncEngineArgs
from engine.sampling_params import RequestOutputKind, SamplingParams
from tests.helpers.engine_utils import TINY, nothing_left_behind  # noqa: F401 (a fixture)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # One sequence at a time: every other request waits in the core, unfinished, until aborted.
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **{**TINY, "max_num_seqs": 1}))
    yield llm
    llm.shutdown()


async def core_stats(engine) -> dict:
    return await engine.engine_core.call_utility_async("get_stats")


async def until(cond, timeout: float = 60.0) -> None:
    """Poll an async condition, letting the loop run in between."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    "kind,n",
    [
        (RequestOutputKind.DELTA, 1),
        (RequestOutputKind.FINAL_ONLY, 1),
        (RequestOutputKind.FINAL_ONLY, 2),
        (RequestOutputKind.CUMULATIVE, 1),
    ],
)
async def test_abort_ends_the_waiting_consumer_with_an_abort_output(engine, kind, n):
    params = SamplingParams(max_tokens=240, temperature=0.0, ignore_eos=True, output_kind=kind, n=n)
    request_id = f"aborted-{kind.name}-{n}"

    async def consume() -> list:
        return [out async for out in engine.generate("a long story", params, request_id)]

    task = asyncio.create_task(consume())

    async def in_core() -> bool:
        stats = await core_stats(engine)
        return stats["num_running_reqs"] + stats["num_waiting_reqs"] == n

    await until(in_core)
    await engine.abort(request_id)
    outputs = await asyncio.wait_for(task, 60)  # hung forever before the fix
    last = outputs[-1]
    assert last.finished and [c.finish_reason for c in last.outputs] == ["abort"] * n
    assert all(not o.finished for o in outputs[:-1])
    if kind == RequestOutputKind.FINAL_ONLY:
        assert len(outputs) == 1
    await until(lambda: _nothing_in_core(engine))


async def _nothing_in_core(engine) -> bool:
    stats = await core_stats(engine)
    return stats["num_running_reqs"] + stats["num_waiting_reqs"] == 0


async def test_a_thousand_streams_cancelled_at_once_are_one_abort_message(engine):
    # As when an HTTP request with a thousand prompts goes away: every stream is cancelled in
    # the same turn of the event loop.
    params = SamplingParams(max_tokens=240, temperature=0.0, ignore_eos=True)
    before = (await core_stats(engine))["num_abort_batches"]

    async def consume(i: int) -> None:
        async for _ in engine.generate({"prompt_token_ids": [1, 2, 3 + i % 1000]}, params, f"many-{i}"):
            pass

    tasks = [asyncio.create_task(consume(i)) for i in range(1000)]

    async def all_in_core() -> bool:
        stats = await core_stats(engine)
        done = sum(t.done() for t in tasks)
        return stats["num_running_reqs"] + stats["num_waiting_reqs"] + done == len(tasks)

    await until(all_in_core, timeout=120)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stats = await asyncio.wait_for(core_stats(engine), 60)  # answered after the abort is handled
    assert stats["num_running_reqs"] == stats["num_waiting_reqs"] == 0
    assert stats["num_abort_batches"] - before == 1
