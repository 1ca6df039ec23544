"""Data parallel: one frontend, several EngineCore processes, one ring pair each.

``DPLBAsyncMPClient`` balances requests over N cores by outstanding work and routes each
abort to the rank that owns the request. A single rank behind an external load balancer
(``data_parallel_external_lb``) needs no balancing: it is a plain ``AsyncMPClient`` of its one core.
``engine.client.factory.make_client`` makes the choice once, at start-up.
"""

from __future__ import annotations

import itertools
from typing import Optional

from engine.client.core_launcher import CoreProcess
from engine.client.mp_client import AsyncMPClient
from engine.config import EngineConfig
from engine.wire_messages import EngineCoreRequest


class DPLBAsyncMPClient(AsyncMPClient):
    """Picks, for each new request, the core with the fewest unfinished requests (ties
    rotate), and remembers the owner until the request finishes or is aborted.

    A request counts from the moment it is sent until the output processor has its final
    output (``requests_finished``) or it is aborted, so a burst of adds spreads evenly even
    before any core has answered.
    """

    def __init__(self, config: EngineConfig, started: Optional[list[CoreProcess]] = None) -> None:
        super().__init__(config, started)
        self._owner: dict[str, int] = {}  # request id -> index into self._cores
        self._load = [0] * len(self._cores)
        self._rotate = itertools.cycle(range(len(self._cores)))

    def _pick(self) -> int:
        start = next(self._rotate)
        n = len(self._load)
        return min(((start + i) % n for i in range(n)), key=self._load.__getitem__)

    async def add_request_async(self, request: EngineCoreRequest, data_parallel_rank: Optional[int] = None) -> None:
        """To ``data_parallel_rank`` when given (vLLM's AsyncLLM.generate keyword), else to the
        least loaded core."""
        rank = self._pick() if data_parallel_rank is None else data_parallel_rank
        self._owner[request.request_id] = rank
        self._load[rank] += 1
        await self._send(self._cores[rank], request)

    def _aborts_by_core(self, request_ids: list[str]) -> list[tuple[CoreProcess, list[str]]]:
        by_rank: dict[int, list[str]] = {}
        for req_id in request_ids:
            rank = self._owner.pop(req_id, None)
            if rank is not None:
                self._load[rank] -= 1
                by_rank.setdefault(rank, []).append(req_id)
        return [(self._cores[rank], ids) for rank, ids in by_rank.items()]

    def requests_finished(self, request_ids: list[str]) -> None:
        for req_id in request_ids:
            rank = self._owner.pop(req_id, None)
            if rank is not None:
                self._load[rank] -= 1

    @property
    def outstanding(self) -> list[int]:
        """Unfinished requests per rank, as the balancer sees them."""
        return list(self._load)
