"""AsyncLLM's per-request mailbox (engine/async_llm.py, RequestOutputCollector): the frontend's one
merge of RequestOutputs, for a consumer slower than the output handler and for stream_interval."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_llm import RequestOutputCollector
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import RequestOutputKind


def _output(token_ids: list[int], text: str, finished: bool = False) -> RequestOutput:
    completion = CompletionOutput(0, text, token_ids, None, None, "length" if finished else None)
    return RequestOutput("r", "p", [1], None, [completion], finished)


def _collector(kind: RequestOutputKind, stream_interval=None) -> RequestOutputCollector:
    return RequestOutputCollector("r", "r-0", kind, stream_interval=stream_interval)


def test_a_slow_consumer_gets_the_deltas_it_missed_in_one_output():
    collector = _collector(RequestOutputKind.DELTA)
    collector.put(_output([5], "a"))
    collector.put(_output([6], "b"))
    collector.put(_output([7], "c", finished=True))
    out = collector.get_nowait()
    assert out.outputs[0].token_ids == [5, 6, 7] and out.outputs[0].text == "abc" and out.finished
    assert collector.get_nowait() is None


def test_a_cumulative_consumer_gets_the_latest_state():
    collector = _collector(RequestOutputKind.CUMULATIVE)
    collector.put(_output([5], "a"))
    collector.put(_output([5, 6], "ab"))
    assert collector.get_nowait().outputs[0].token_ids == [5, 6]


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_stream_interval_hands_out_the_first_then_every_interval_tokens_then_the_last(kind):
    collector = _collector(kind, stream_interval=3)
    ids: list[int] = []

    def put(token: int, finished: bool = False) -> None:
        ids.append(token)
        new = [token] if kind == RequestOutputKind.DELTA else list(ids)
        collector.put(_output(new, "x" * len(new), finished))

    put(10)
    assert collector.get_nowait().outputs[0].token_ids == [10]  # the first at once
    put(11)
    put(12)
    assert collector.get_nowait() is None  # two new tokens: held
    put(13)
    assert collector.get_nowait().outputs[0].token_ids == (
        [11, 12, 13] if kind == RequestOutputKind.DELTA else [10, 11, 12, 13]
    )
    put(14, finished=True)
    last = collector.get_nowait()  # the last at once, whatever it carries
    assert last.finished and last.outputs[0].token_ids[-1] == 14


async def test_a_waiting_consumer_is_woken_only_once_the_interval_is_reached():
    collector = RequestOutputCollector("r", "r-0", RequestOutputKind.DELTA, asyncio.get_running_loop(), 2)
    collector.put(_output([1], "a"))
    assert collector.get_nowait() is not None
    consumer = asyncio.ensure_future(collector.get())
    collector.put(_output([2], "b"))
    await asyncio.sleep(0)
    assert not consumer.done()
    collector.put(_output([3], "c"))
    assert (await asyncio.wait_for(consumer, 10)).outputs[0].token_ids == [2, 3]


def test_an_error_replaces_what_waits_and_is_raised():
    collector = _collector(RequestOutputKind.DELTA, stream_interval=5)
    collector.put(_output([1], "a"))
    collector.get_nowait()
    collector.put(_output([2], "b"))
    collector.put(RuntimeError("engine dead"))
    with pytest.raises(RuntimeError, match="engine dead"):
        collector.get_nowait()
