"""Whether the EngineCore still answers: what /health reports besides death.

A core that is stopped (SIGSTOP, a debugger), wedged in a system call or stuck in one endless
step has not died: its process and its ring are there, so ``check_health`` passes while every
request waits. So the server probes it in the background with a utility round trip
(``get_stats``, answered between two steps) and /health answers 503 once a probe has gone
unanswered past a bound: ``busy_timeout_s`` while there is work (requests in flight here, or
in the core at its last answer), ``idle_timeout_s`` otherwise. /health never waits on the core
itself: it reads the last verdict, so it answers at once however the core is doing, and turns
200 again as soon as a probe is answered.

Unanswered time is counted in ticks of this event loop, not read off the clock: if the loop
itself was held up (a long render, a CPU hog), the core's answer may be sitting in the ring
unread, and that must not make /health report the core.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

from engine.exceptions import EngineDeadError
from engine.server_interface import EngineClient

logger = logging.getLogger(__name__)


class CoreLiveness:
    def __init__(
        self, engine: EngineClient, busy_timeout_s: float, idle_timeout_s: float, frontend_busy: Callable[[], bool]
    ) -> None:
        """``frontend_busy``: whether requests are in flight in this server (then the busy bound
        applies even if the core last said it was idle)."""
        self.engine = engine
        self.busy_timeout_s = busy_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.frontend_busy = frontend_busy
        self.interval_s = min(1.0, busy_timeout_s / 4)
        self.unanswered_s = 0.0  # how long the probe in flight has waited, in loop ticks
        self.core_has_work = False  # at the core's last answer
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._probe_forever(), name="CoreLiveness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def problem(self) -> Optional[str]:
        """Why the core counts as unresponsive now, or None while it answers in time."""
        busy = self.core_has_work or self.frontend_busy()
        bound = self.busy_timeout_s if busy else self.idle_timeout_s
        if self.unanswered_s < bound:
            return None
        return (
            f"the engine core has not answered a liveness probe for {self.unanswered_s:.0f} s "
            f"(limit {bound:g} s {'with requests in flight' if busy else 'while idle'})"
        )

    async def _probe_forever(self) -> None:
        while True:
            probe = asyncio.ensure_future(self.engine.get_stats())
            self.unanswered_s = 0.0
            try:
                while not (await asyncio.wait({probe}, timeout=self.interval_s))[0]:
                    self.unanswered_s += self.interval_s
                    if (
                        self.unanswered_s >= self.busy_timeout_s
                        and self.unanswered_s - self.interval_s < self.busy_timeout_s
                    ):
                        logger.warning(
                            "the engine core has not answered a liveness probe for %.0f s", self.unanswered_s
                        )
                per_core = probe.result()
            except EngineDeadError:
                return  # check_health reports it from now on
            except asyncio.CancelledError:
                probe.cancel()
                raise
            except Exception:  # a probe that failed otherwise proves nothing either way: probe again
                logger.exception("liveness probe of the engine core failed")
                per_core = []
            if self.unanswered_s >= self.busy_timeout_s:
                logger.info("the engine core answers again (after %.0f s)", self.unanswered_s)
            self.unanswered_s = 0.0
            self.core_has_work = any(s["num_running_reqs"] + s["num_waiting_reqs"] for s in per_core)
            await asyncio.sleep(self.interval_s)
