"""AsyncLLM over EngineCore processes, on the ring and on the zmq baseline: output kinds,
cancellation, backpressure with tiny rings, engine death, data parallel.

One engine per transport serves most tests (built outside the event loop, so its output
handler starts lazily on the first request, as in a script that builds it before
``asyncio.run``); tests that kill a core or need two build their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from engine.async_llm import AsyncLLM, build_async_engine_client_from_engine_args
from engine.client.dp_client import DPLBAsyncMPClient
from engine.client.mp_client import AsyncMPClient
from engine.config import AsyncEngineArgs
from engine.exceptions import EngineDeadError
from engine.sampling_params import RequestOutputKind, SamplingParams
from tests.helpers.engine_utils import TINY, nothing_left_behind  # noqa: F401 (a fixture)

pytestmark = pytest.mark.asyncio(loop_scope="module")


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **kw})


def args(model: str, **overrides) -> AsyncEngineArgs:
    return AsyncEngineArgs(model=model, **{**TINY, **overrides})


@pytest.fixture(scope="module", params=["shm", "zmq"])
def engine(request, tiny_model_dir):
    llm = AsyncLLM.from_engine_args(args(tiny_model_dir, transport=request.param))
    assert llm.output_handler is None  # no loop yet: starts with the first request
    yield llm
    llm.shutdown()


async def collect(engine, prompt, params, request_id) -> list:
    return [out async for out in engine.generate(prompt, params, request_id)]


async def start_long_streams(engine, prefix: str, n: int = 8) -> list[asyncio.Task]:
    """``n`` streams of 240 greedy tokens (ids ``<prefix><i>``), returned once each has yielded an output."""
    started = [asyncio.Event() for _ in range(n)]

    async def stream(i: int) -> None:
        async for _ in engine.generate(f"{prefix} {i}", greedy(max_tokens=240), f"{prefix}{i}"):
            started[i].set()

    tasks = [asyncio.create_task(stream(i)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
    return tasks


async def unfinished_in_core(engine, engine_index: int = 0) -> int:
    stats = await engine.engine_core.call_utility_async("get_stats", engine_index=engine_index)
    return stats["num_running_reqs"] + stats["num_waiting_reqs"]


async def test_delta_concatenates_to_cumulative_and_final_only_yields_once(engine):
    prompt = "The capital of France is"
    cumulative = await collect(engine, prompt, greedy(max_tokens=12), "cum")
    delta = await collect(engine, prompt, greedy(max_tokens=12, output_kind=RequestOutputKind.DELTA), "delta")
    final = await collect(engine, prompt, greedy(max_tokens=12, output_kind=RequestOutputKind.FINAL_ONLY), "final")
    assert engine.output_handler is not None and engine.is_running
    latencies = engine.take_transport_latencies()
    assert latencies and all(0 < t < 1 for t in latencies) and not engine.take_transport_latencies()
    assert len(final) == 1 and final[0].finished
    last = cumulative[-1].outputs[0]
    assert len(last.token_ids) == 12 and last.finish_reason == "length"
    assert sum((o.outputs[0].token_ids for o in delta), []) == last.token_ids == final[0].outputs[0].token_ids
    assert "".join(o.outputs[0].text for o in delta) == last.text == final[0].outputs[0].text
    assert [o.finished for o in cumulative] == [False] * (len(cumulative) - 1) + [True]


async def test_slow_delta_consumer_gets_every_token_merged(engine):
    collector = await engine.add_request(
        "slow",
        "Once upon a time",
        greedy(max_tokens=20, output_kind=RequestOutputKind.DELTA, n=2, temperature=0.8, seed=3),
    )
    while await unfinished_in_core(engine):
        await asyncio.sleep(0.01)  # the core finishes while nobody reads
    await asyncio.sleep(0.05)
    merged = collector.get_nowait()
    assert merged.finished and collector.core_timestamp > 0
    assert sorted(c.index for c in merged.outputs) == [0, 1]
    assert all(len(c.token_ids) == 20 for c in merged.outputs)


async def test_cancelled_streams_abort_in_core_others_finish_and_ids_are_reused(engine):
    started = [asyncio.Event() for _ in range(10)]

    async def stream(i: int) -> int:
        n = 0
        async for out in engine.generate(f"prompt number {i}", greedy(max_tokens=40), f"req-{i}"):
            n = len(out.outputs[0].token_ids)
            if i < 10:
                started[i].set()
        return n

    tasks = [asyncio.create_task(stream(i)) for i in range(100)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
    for task in tasks[:10]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results[:10])
    assert results[10:] == [40] * 90
    assert await unfinished_in_core(engine) == 0
    again = await asyncio.gather(*(collect(engine, "again", greedy(max_tokens=3), f"req-{i}") for i in range(10)))
    assert [len(o[-1].outputs[0].token_ids) for o in again] == [3] * 10


async def test_2000_requests_through_tiny_rings_all_complete(engine):
    params = greedy(max_tokens=4, output_kind=RequestOutputKind.FINAL_ONLY)
    outs = await asyncio.gather(*(collect(engine, f"request {i}", params, f"bulk-{i}") for i in range(2000)))
    assert all(len(o) == 1 and len(o[0].outputs[0].token_ids) == 4 for o in outs)
    assert [o[0].request_id for o in outs] == [f"bulk-{i}" for i in range(2000)]


async def test_bad_request_fails_alone(engine):
    good = asyncio.create_task(collect(engine, "hello", greedy(max_tokens=20), "good"))
    with pytest.raises(ValueError, match="max_model_len"):
        await collect(engine, [5] * 300, greedy(), "too-long")
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="already in use"):
        await collect(engine, "hello", greedy(), "good")
    assert (await good)[-1].finished
    await engine.check_health()


@pytest.mark.parametrize("transport", ["shm", "zmq"])
async def test_kill9_of_core_fails_every_stream_within_1s(tiny_model_dir, transport):
    async with build_async_engine_client_from_engine_args(args(tiny_model_dir, transport=transport)) as llm:
        assert llm.output_handler is not None  # built inside the loop: started at once
        tasks = await start_long_streams(llm, "s")
        killed = time.monotonic()
        os.kill(llm.engine_core.ready.pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 1.0)
        assert time.monotonic() - killed < 1.0
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert llm.errored
        with pytest.raises(EngineDeadError):
            await collect(llm, "after", greedy(), "after")
        with pytest.raises(EngineDeadError):
            await llm.check_health()


async def test_data_parallel_spreads_requests_and_routes_aborts(tiny_model_dir):
    dp_args = args(tiny_model_dir, data_parallel_size=2, renderer_num_workers=2)
    async with build_async_engine_client_from_engine_args(dp_args) as llm:
        client = llm.engine_core
        assert isinstance(client, DPLBAsyncMPClient)
        tasks = await start_long_streams(llm, "dp")
        assert client.outstanding == [4, 4]
        assert [await unfinished_in_core(llm, rank) for rank in (0, 1)] == [4, 4]
        for task in tasks[:3]:  # the aborts must reach whichever rank owns each request
            task.cancel()
        await asyncio.gather(*tasks[:3], return_exceptions=True)
        assert [await unfinished_in_core(llm, rank) for rank in (0, 1)] == client.outstanding
        assert sum(client.outstanding) == 5
        for task in tasks[3:]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert [await unfinished_in_core(llm, rank) for rank in (0, 1)] == [0, 0]


async def test_external_lb_rank_serves_through_its_own_core(tiny_model_dir):
    rank_args = args(tiny_model_dir, data_parallel_size=2, data_parallel_rank=1, data_parallel_external_lb=True)
    async with build_async_engine_client_from_engine_args(rank_args) as llm:
        assert type(llm.engine_core) is AsyncMPClient and llm.engine_core.ready.engine_index == 1
        outs = await collect(llm, "hello", greedy(max_tokens=5), "rank1")
        assert len(outs[-1].outputs[0].token_ids) == 5


@pytest.mark.model
async def test_default_model_streams_an_answer():
    async with build_async_engine_client_from_engine_args(AsyncEngineArgs(max_model_len=512)) as llm:
        prompt = llm.input_processor.render_chat([{"role": "user", "content": "What is the capital of France?"}])
        deltas = await collect(
            llm, prompt, greedy(max_tokens=24, ignore_eos=False, output_kind=RequestOutputKind.DELTA), "paris"
        )
        assert "Paris" in "".join(o.outputs[0].text for o in deltas)
