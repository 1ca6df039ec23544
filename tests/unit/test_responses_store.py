"""The responses store's bounds: count, bytes and age; a background response still running is
never dropped to make room, and a new one that finds none is refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.entrypoints.openai.http_bodies import ChatMessage
from engine.entrypoints.openai.responses_bodies import ResponseObject
from engine.entrypoints.openai.responses_store import ResponsesStore, StoreFull, StoreLimits


def response(i: int, text: str = "") -> ResponseObject:
    return ResponseObject(id=f"resp_{i}", created_at=0, model="m", status="completed", instructions=text or None)


def test_the_oldest_entries_go_past_the_count_and_the_bytes():
    store = ResponsesStore(StoreLimits(max_entries=3, max_bytes=10_000, max_age_s=60))
    for i in range(4):
        store.put(response(i), [ChatMessage(role="user", content="hi")])
    assert store.get("resp_0") is None and [store.get(f"resp_{i}").response.id for i in (1, 2, 3)]
    big = "x" * 4_000
    store.put(response(4, big), [])
    store.put(response(5, big), [])
    assert len(store) <= 3 and store.bytes <= 10_000
    assert store.get("resp_4") is not None and store.get("resp_5") is not None and store.get("resp_1") is None
    with pytest.raises(StoreFull):  # one entry larger than the whole store
        store.put(response(6, "x" * 20_000), [])


def test_entries_are_gone_past_their_age():
    store = ResponsesStore(StoreLimits(max_entries=8, max_bytes=1 << 20, max_age_s=0.05))
    store.put(response(0), [])
    assert store.get("resp_0") is not None
    time.sleep(0.1)
    assert store.get("resp_0") is None and len(store) == 0 and store.bytes == 0


def test_running_background_responses_are_not_dropped_to_make_room():
    async def main():
        store = ResponsesStore(StoreLimits(max_entries=2, max_bytes=1 << 20, max_age_s=60))
        never = asyncio.Event()
        tasks = [asyncio.create_task(never.wait()) for _ in range(2)]
        for i, task in enumerate(tasks):
            store.put(response(i), [], task=task)
        with pytest.raises(StoreFull):
            store.put(response(2), [])
        assert store.running_tasks() == tasks
        tasks[0].cancel()
        await asyncio.wait(tasks[:1])
        store.put(response(2), [])  # the finished one makes room
        assert store.get("resp_0") is None and store.get("resp_1") is not None
        tasks[1].cancel()
        await asyncio.wait(tasks[1:])

    asyncio.run(main())
