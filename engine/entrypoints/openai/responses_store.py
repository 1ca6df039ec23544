"""The stored responses behind ``previous_response_id``, ``GET /v1/responses/{id}`` and background
responses: in memory, bounded in count, in bytes and in age, so that clients cannot grow the
server without limit (a response is stored by default, as OpenAI and vLLM do).

Each entry keeps the response and the conversation it ends (the chat messages of its input, its
previous responses' included, then its own output), which a later request continues. The oldest
entries go first when a bound is passed; an entry still running (a background response) is never
dropped to make room, and a new one that finds no room is refused (503). An entry older than
``max_age_s`` is gone (404), running or not.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import msgspec

from engine.entrypoints.openai.http_bodies import ChatMessage
from engine.entrypoints.openai.responses_bodies import ResponseObject

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class StoreLimits:
    max_entries: int = 1024
    max_bytes: int = 64 << 20  # the entries' responses and conversations, as JSON
    max_age_s: float = 3600.0

    def __post_init__(self) -> None:
        for name, ok in (
            ("max_entries", self.max_entries >= 1),
            ("max_bytes", self.max_bytes >= 1),
            ("max_age_s", self.max_age_s > 0),
        ):
            if not ok:
                raise ValueError(f"responses store {name} must be positive, got {getattr(self, name)!r}")


@dataclass
class StoredResponse:
    response: ResponseObject
    conversation: list[ChatMessage]
    created: float = field(default_factory=time.monotonic)
    size: int = 0
    task: Optional[asyncio.Task] = None  # a background response while it runs

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


class StoreFull(Exception):
    """No room: every entry left is a background response still running."""


class ResponsesStore:
    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> Optional[StoredResponse]:
        self._expire()
        return self._entries.get(response_id)

    def put(
        self, response: ResponseObject, conversation: list[ChatMessage], task: Optional[asyncio.Task] = None
    ) -> StoredResponse:
        """Store (or replace) ``response``; raises StoreFull if only running entries are left to drop.
        One entry over ``max_bytes`` on its own is not stored (a response that cannot be kept)."""
        old = self._entries.pop(response.id, None)
        if old is not None:
            self.bytes -= old.size
            task = task or old.task
        entry = StoredResponse(response, conversation, task=task)
        entry.size = len(_encode(response)) + len(_encode(conversation))
        if entry.size > self.limits.max_bytes:
            raise StoreFull(f"the response is larger than the store's {self.limits.max_bytes} bytes")
        self._expire()
        while len(self._entries) >= self.limits.max_entries or self.bytes + entry.size > self.limits.max_bytes:
            victim = next((key for key, e in self._entries.items() if not e.running), None)
            if victim is None:
                raise StoreFull("the responses store is full of background responses still running")
            self.bytes -= self._entries.pop(victim).size
        self._entries[response.id] = entry
        self.bytes += entry.size
        return entry

    def running_tasks(self) -> list[asyncio.Task]:
        return [e.task for e in self._entries.values() if e.running]

    def _expire(self) -> None:
        deadline = time.monotonic() - self.limits.max_age_s
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            if oldest.created > deadline:
                return
            if oldest.task is not None:
                oldest.task.cancel()
            self.bytes -= self._entries.pop(key).size
