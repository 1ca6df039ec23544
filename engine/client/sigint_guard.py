"""Ctrl-C lands between transport calls, never inside one.

Python raises KeyboardInterrupt at whatever bytecode the main thread runs when SIGINT arrives.
Inside the sync client's channel calls that can be halfway through a decode straight from shared
memory, a fragment of a large message, or a send whose first part is already in the ring: the
channel is left out of step with the core, and the next call reports the core as dead although
it is alive (seen under load: ``llm.generate`` interrupted, then ``get_stats`` failed with
EngineDeadError). vLLM's ZeroMQ client has the same window; we close it.

``SigintGuard`` swaps Python's default SIGINT handler for one that only notes the signal and
wakes the channel's wait, and raises KeyboardInterrupt when the client is back at a safe point
(``check()`` between calls, or leaving the guarded block). A handler the application installed
itself is left alone, as are threads other than the main one (signals only run there).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

_MAIN = threading.main_thread()


class SigintGuard:
    """``with guard:`` around a client call (re-entrant: only the outermost installs)."""

    __slots__ = ("_wake", "_hit", "_depth")

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._hit = False
        self._depth = 0

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self._hit = True
        self._wake()  # a blocked wait returns at once; check() then raises

    def __enter__(self) -> "SigintGuard":
        if self._depth:
            self._depth += 1
        elif threading.current_thread() is _MAIN and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
            self._depth = 1
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth:
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if exc_type is None:
            self.check()

    def check(self) -> None:
        """Raise the KeyboardInterrupt of a Ctrl-C that came while guarded, if any."""
        if self._hit:
            self._hit = False
            raise KeyboardInterrupt
