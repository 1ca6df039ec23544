"""Connection limits of the HTTP server: how long a connection may make us wait, and how many
may be open at once.

aiohttp bounds how large a request may be, not how slowly it may arrive, and it accepts
connections until the process runs out of file descriptors; then /health and every new
client fail while idle or half-sent connections sit there. So each connection here is in
one of three phases, each with its own bound:

- WAITING: connected, or its last response written, and no byte of the next request yet.
  Closed ``keep_alive_timeout_s`` after the wait began (uvicorn's and vLLM's timeout_keep_alive).
- HEAD: bytes of a request arrived but not its whole head (a slowloris drip-feeding
  headers). Closed ``header_timeout_s`` after the wait began, however slowly bytes come.
- BUSY: a request is being handled. Its body must arrive whole within ``body_timeout_s`` of
  the head (else 408 and the connection is closed); past that, the server's own request
  timeout applies, not these.

At most ``max_connections`` are open. One more evicts the connection that has waited longest
without a request in hand (WAITING or HEAD), as nginx reuses idle keep-alive connections when it
runs short; only when every open connection is BUSY does the newcomer get a 503 and is closed.
Idle or slow connections, however many, never keep a probe of /health out, and the cap stays
below the open-file limit (raised to its hard limit at start), so accepting never fails.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import resource
from dataclasses import dataclass
from typing import Callable, Optional

from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 1024
# The listening socket's accept queue (uvicorn's default; the kernel caps it at net.core.somaxconn).
# asyncio's default of 100 overflows when a few hundred clients reconnect at once: the kernel then
# drops the handshake's last ACK, the client believes it is connected and its request waits on
# TCP retransmission, seconds later (measured: 256 streaming clients on new connections, 17
# requests in 25 s unread for 5 s, closed by the keep-alive timeout with no answer).
LISTEN_BACKLOG = 2048


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds above, from ``ServerSettings.connection_limits()`` (which validates them)."""

    header_timeout_s: float
    body_timeout_s: float
    keep_alive_timeout_s: float
    max_connections: int


def raise_open_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it); returns
    the soft limit now in force. Every connection is a descriptor: a default soft limit of
    1024 would make the cap, not the clients, the bottleneck."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel refuses
            logger.warning("could not raise the open-file limit from %d to %s: %s", soft, hard, exc)
    return soft


def default_max_connections(open_file_limit: int) -> int:
    """``DEFAULT_MAX_CONNECTIONS``, or half the open-file limit when that is lower: the other half
    is the process's own (the engine's rings, the model's files, the log, accepting one more)."""
    if open_file_limit == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, open_file_limit // 2))


class RequestBodyTimeout(OpenAIError, TimeoutError):
    """Set on a request's body stream when the body is late: the handler's read raises it (a
    408), and aiohttp, seeing a TimeoutError while it drains the rest, closes the connection."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {timeout_s:g} s",
            code="request_timeout",
            headers={"Connection": "close"},
        )


class _BodyAbandoned(TimeoutError):
    """What aiohttp's drain of an unread body (its "lingering" read after the response) takes for
    the end of its wait: it stops quietly and closes the connection, where any other error
    would be logged as unhandled, with a traceback."""


def abandon_body(request: web.Request) -> None:
    """Read no more of ``request``'s body (it cannot be decoded): the connection closes after the
    response."""
    request.content.set_exception(_BodyAbandoned("the request body was abandoned"))


class Phase(enum.Enum):
    WAITING = "waiting"
    HEAD = "head"
    BUSY = "busy"


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's protocol for one connection, reporting its phases to the ``ConnectionGuard``."""

    def __init__(self, guard: "ConnectionGuard", manager: web.Server, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.phase = Phase.WAITING
        self.wait_start = 0.0
        self.deadline: Optional[asyncio.TimerHandle] = None
        self.counted = False  # counted against the cap (False once evicted or refused)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.guard.opened(self, transport)

    def data_received(self, data: bytes) -> None:
        if data and self.phase is Phase.WAITING:
            self.guard.head_started(self)
        super().data_received(data)

    async def finish_response(self, request, resp, start_time):
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self.guard.waiting(self)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.guard.closed(self)
        super().connection_lost(exc)


_REFUSED_BODY = (
    b'{"error":{"message":"the server has too many open connections; retry later",'
    b'"type":"server_error","param":null,"code":"overloaded"}}'
)
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)
_REFUSAL_LOG_INTERVAL_S = 10.0


class ConnectionGuard:
    """The phases, deadlines and cap of every connection of one listening socket."""

    def __init__(self, limits: ConnectionLimits, probe_paths: frozenset[str] = frozenset()) -> None:
        """``probe_paths``: routes not counted in ``requests_in_flight`` (/health, /metrics...)."""
        self.limits = limits
        self.probe_paths = probe_paths
        self.open = 0
        self.requests_in_flight = 0  # being handled, probes aside
        self.refused = 0  # connections answered 503 at accept
        self._last_refusal_log = float("-inf")
        # Connections without a request in hand, the longest waiting first: who is evicted.
        self._idle: collections.OrderedDict[GuardedRequestHandler, None] = collections.OrderedDict()
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def protocol_factory(self, server: web.Server) -> Callable[[], GuardedRequestHandler]:
        """What ``loop.create_server`` calls per accepted connection (aiohttp's ``Server`` would make
        a plain RequestHandler). aiohttp's own keep-alive timer is pushed past ours: only a backstop."""
        self._loop = asyncio.get_running_loop()
        backstop = max(self.limits.header_timeout_s, self.limits.keep_alive_timeout_s) + 1.0
        lingering = min(10.0, self.limits.body_timeout_s)  # draining an unread body after the response
        return lambda: GuardedRequestHandler(
            self, server, loop=self._loop, keepalive_timeout=backstop, lingering_time=lingering
        )

    # ---- phases ----
    def opened(self, handler: GuardedRequestHandler, transport: asyncio.BaseTransport) -> None:
        if self.open >= self.limits.max_connections and not self._evict_one():
            self.refused += 1
            now = self._loop.time()
            if now - self._last_refusal_log >= _REFUSAL_LOG_INTERVAL_S:  # a flood logs a line, not a line each
                self._last_refusal_log = now
                logger.warning(
                    "all %d connections are busy: refusing new ones with 503 (%d so far)", self.open, self.refused
                )
            transport.write(_REFUSED)
            handler.force_close()
            return
        self.open += 1
        handler.counted = True
        self._wait(handler)

    def head_started(self, handler: GuardedRequestHandler) -> None:
        if handler.counted:
            handler.phase = Phase.HEAD
            self._arm(handler, handler.wait_start + self.limits.header_timeout_s)

    def busy(self, handler: GuardedRequestHandler) -> None:
        """The request's head is complete and its handler runs (called by ``middleware``)."""
        handler.phase = Phase.BUSY
        self._disarm(handler)
        self._idle.pop(handler, None)

    def waiting(self, handler: GuardedRequestHandler) -> None:
        if handler.counted:
            self._wait(handler)

    def closed(self, handler: GuardedRequestHandler) -> None:
        self._disarm(handler)
        self._idle.pop(handler, None)
        if handler.counted:
            handler.counted = False
            self.open -= 1

    # ---- the middleware: the BUSY phase and the body's deadline ----
    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        protocol = request.protocol
        if isinstance(protocol, GuardedRequestHandler):
            self.busy(protocol)
        if request.path in self.probe_paths:
            return await handler(request)
        self.requests_in_flight += 1
        try:
            return await self._with_body_deadline(request, handler)
        finally:
            self.requests_in_flight -= 1

    async def _with_body_deadline(self, request: web.Request, handler) -> web.StreamResponse:
        body = request.content
        if body.is_eof():
            return await handler(request)
        timeout = self.limits.body_timeout_s

        def expire() -> None:
            if not body.is_eof():
                logger.info("%s %s: the request body did not arrive within %g s", request.method, request.path, timeout)
                body.set_exception(RequestBodyTimeout(timeout))

        timer = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            return await handler(request)
        finally:
            timer.cancel()

    # ---- internals ----
    def _wait(self, handler: GuardedRequestHandler) -> None:
        handler.phase = Phase.WAITING
        handler.wait_start = self._loop.time()
        self._idle[handler] = None
        self._idle.move_to_end(handler)
        self._arm(handler, handler.wait_start + self.limits.keep_alive_timeout_s)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest without a request; False if none has."""
        if not self._idle:
            return False
        victim, _ = self._idle.popitem(last=False)
        logger.debug("connection cap (%d) reached: closing the longest-waiting connection", self.limits.max_connections)
        self.closed(victim)
        victim.force_close()
        return True

    def _arm(self, handler: GuardedRequestHandler, when: float) -> None:
        self._disarm(handler)
        handler.deadline = self._loop.call_at(when, self._expire, handler)

    @staticmethod
    def _disarm(handler: GuardedRequestHandler) -> None:
        if handler.deadline is not None:
            handler.deadline.cancel()
            handler.deadline = None

    def _expire(self, handler: GuardedRequestHandler) -> None:
        handler.deadline = None
        if handler.phase is not Phase.BUSY:
            logger.debug(
                "closing a connection %s too long",
                "idle" if handler.phase is Phase.WAITING else "sending its request head",
            )
            self.closed(handler)
            handler.force_close()
