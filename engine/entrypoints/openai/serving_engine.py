"""What both generation endpoints share: the model check, admission (overload control), the
engine call (with its abort and metrics), off-loop rendering, time limits, and Server-Sent
Events framing.

Cancellation is the one mechanism behind disconnects, timeouts and shutdown: aiohttp
cancels the handler when its client goes away (``handler_cancellation``), a time limit
cancels the work under it, and either way the engine streams are closed, which aborts their
requests in the core (all of one HTTP request's in one message). Every request's time limit
is registered in ``Deadlines``, so the end of a SIGTERM drain is one more deadline: it
fires them all at once. Errors before the first byte of a stream get an ordinary HTTP
status; after it, an ``{"error": ...}`` event followed by ``[DONE]``, so the client sees a
clean end, be it a timeout, a dead engine or the server going down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional, Sequence, TypeVar

import msgspec
from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.public_errors import public_error
from engine.exceptions import EngineDeadError, EngineGenerateError, EngineStepError, ParameterError
from engine.entrypoints.openai.serving_lora import ServedLoRAs
from engine.frontend.renderer import RendererBusyError
from engine.lora.request import LoRARequest
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.server_interface import EngineClient

logger = logging.getLogger(__name__)

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEFraming:
    """How a stream says its events, an error after its first byte, and its end: OpenAI's
    ``data: {json}`` events closed by ``data: [DONE]``."""

    end = b"data: [DONE]\n\n"

    def event(self, event: Any) -> bytes:
        return b"data: " + _encode(event) + b"\n\n"

    def error(self, error: OpenAIError) -> bytes:
        return self.event(error.body())


OPENAI_SSE = SSEFraming()


@dataclass(frozen=True)
class ServingLimits:
    max_waiting_requests: Optional[int]  # sequences (prompts x n) without a first output; None: unbounded
    request_timeout_s: Optional[float]  # None: no timeout
    retry_after_s: int
    max_seqs_per_request: int  # prompts x n of one request; more is a 400

    @classmethod
    def for_engine(
        cls, config: Any, max_waiting_requests: Optional[int], request_timeout_s: Optional[float], retry_after_s: int
    ) -> "ServingLimits":
        """The limits of a server over the engine of ``config`` (an ``EngineConfig``)."""
        return cls(max_waiting_requests, request_timeout_s, retry_after_s, config.max_seqs_per_request)


class Deadlines:
    """The time limit of every request in flight, so that the end of a drain can end them all.

    ``limit`` is ``asyncio.timeout_at`` that answers in OpenAI's shape: 504 when the request's
    own timeout passes, 503 ``server_shutdown`` once ``end_all`` has fired it.
    """

    def __init__(self) -> None:
        self._scopes: set[asyncio.Timeout] = set()
        self.ended = False

    @contextlib.asynccontextmanager
    async def limit(self, when: Optional[float]) -> AsyncIterator[None]:
        scope = asyncio.timeout_at(0.0 if self.ended else when)
        try:
            async with scope:
                self._scopes.add(scope)
                try:
                    yield
                finally:
                    self._scopes.discard(scope)
        except TimeoutError:
            if not scope.expired():  # not this limit's: some other TimeoutError from below
                raise
            if self.ended:
                raise OpenAIError(
                    503, "the server is shutting down", type="server_error", code="server_shutdown"
                ) from None
            raise OpenAIError(
                504, "the request took longer than the server's request timeout", type="server_error", code="timeout"
            ) from None

    def end_all(self) -> None:
        """Fire every limit now (and every later one at once): the drain is over."""
        self.ended = True
        now = asyncio.get_running_loop().time()
        for scope in list(self._scopes):
            scope.reschedule(now)


def json_response(body: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> web.Response:
    return web.Response(body=_encode(body), status=status, headers=headers, content_type="application/json")


def to_openai_error(exc: BaseException) -> OpenAIError:
    """The HTTP face of an exception raised while serving a request: OpenAI's shape and a short
    message. What only the server should see (an EngineCore traceback, file paths, an
    unexpected exception) goes to the server log."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ParameterError):
        return OpenAIError(400, str(exc), param=exc.parameter, code="invalid_value")
    if isinstance(exc, (ValueError, TypeError)):  # the input processor refused the request itself
        return OpenAIError(400, str(exc), code="invalid_value")
    if isinstance(exc, EngineDeadError):
        _log_engine_death(exc)
        return OpenAIError(500, _ENGINE_DEAD_MESSAGE, type="server_error", code="engine_dead")
    if isinstance(exc, TimeoutError):
        return OpenAIError(
            504, "the request took longer than the server's request timeout", type="server_error", code="timeout"
        )
    if isinstance(exc, EngineStepError):  # a step failed while running this request: a server fault
        return OpenAIError(500, str(exc), type="server_error", code="engine_step_failed")
    if isinstance(exc, EngineGenerateError):  # the core refused the request: its input is at fault
        return OpenAIError(400, str(exc), code="invalid_value")
    logger.exception("unexpected error while serving a request", exc_info=exc)
    return OpenAIError(500, f"internal server error: {type(exc).__name__}", type="server_error", code="internal_error")


_ENGINE_DEAD_MESSAGE = "the engine encountered an error and is no longer running; see the server log"


def _log_engine_death(exc: EngineDeadError) -> None:
    """Log the core's full report once (every request failing after the death carries the
    same exception object)."""
    if getattr(exc, "_logged", False):
        return
    exc._logged = True
    logger.error("%s\n%s", exc, exc.cause or "(no report from the EngineCore)")


class OpenAIServing:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Any,
        model_names: Sequence[str],
        max_model_len: int,
        limits: ServingLimits,
        metrics: ServerMetrics,
        deadlines: Deadlines,
        loras: Optional[ServedLoRAs] = None,
    ) -> None:
        self.engine = engine
        self.loras = loras  # LoRA adapters served under their own names (serving_lora.py)
        self.tokenizer = tokenizer
        self.model_names = tuple(model_names)
        self.max_model_len = max_model_len
        self.limits = limits
        self.metrics = metrics
        self.deadlines = deadlines
        # Sampling defaults from the model's generation config (vLLM's generation_config="auto").
        self.model_defaults = dict(engine.input_processor.default_params)
        # Sequences (prompts x n) accepted but without a first output yet (queued or in prefill).
        self.num_waiting = 0

    def check_model(self, model: Optional[str], adapters: bool = True) -> str:
        """The name to answer with (a served name or, where ``adapters``, a LoRA adapter's); an
        unknown model is a 404, as OpenAI answers it; an adapter where none runs, a 400."""
        if model is None:
            return self.model_names[0]
        if not adapters and self.lora_request(model) is not None:
            raise OpenAIError(
                400,
                f"the model {model!r} is a LoRA adapter, which this endpoint does not run; use {self.model_names[0]!r}",
                param="model",
                code="invalid_value",
            )
        if model not in self.model_names and self.lora_request(model) is None:
            raise OpenAIError(
                404,
                f"the model {model!r} does not exist; this server serves "
                f"{', '.join(self.model_names)} and its LoRA adapters",
                param="model",
                code="model_not_found",
            )
        return model

    def lora_request(self, model: Optional[str]) -> Optional[LoRARequest]:
        """The adapter a request's ``model`` names, or None (the base model)."""
        return self.loras.request_for(model) if self.loras is not None else None

    def check_no_adapter(self, model: str, field_name: str) -> None:
        """A feature that runs the base model only (beam search) refuses an adapter by name."""
        if self.lora_request(model) is not None:
            raise OpenAIError(
                400,
                f"{field_name} is not supported with a LoRA adapter (model {model!r})",
                param=field_name,
                code="invalid_value",
            )

    def overloaded(self, message: str) -> OpenAIError:
        self.metrics.rejected.labels(self.model_names[0]).inc()
        return OpenAIError(
            503,
            f"{message}; retry later",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": str(self.limits.retry_after_s)},
        )

    @contextlib.contextmanager
    def admit(self, num_prompts: int, n: int, param: Optional[str] = None) -> Iterator[Callable[[], None]]:
        """Hold a waiting slot for each of the ``num_prompts x n`` sequences of one HTTP request,
        or refuse it before anything reaches the engine: 400 past ``max_seqs_per_request``, else
        503 + Retry-After past the waiting limit.

        Yields the callback that ``generate`` calls on each prompt's first output (its ``n``
        slots are given back); slots still held when the handler ends (errors, disconnects)
        are given back on exit. The check and the reservation run without an await between
        them, so they cannot interleave. ``param``: the field a 400 names (default: n or prompt).
        """
        count = num_prompts * n
        if count > self.limits.max_seqs_per_request:
            raise OpenAIError(
                400,
                f"the request asks for {count} sequences ({num_prompts} prompts x n={n}); "
                f"this server takes at most {self.limits.max_seqs_per_request} in one request",
                param=param or ("n" if num_prompts == 1 else "prompt"),
                code="too_many_sequences",
            )
        limit = self.limits.max_waiting_requests
        if limit is not None and self.num_waiting + count > limit:
            raise self.overloaded(
                f"the server is overloaded ({self.num_waiting} sequences waiting, limit {limit}, this request {count})"
            )
        held = count
        self.num_waiting += count

        def started() -> None:
            nonlocal held
            held -= n
            self.num_waiting -= n

        try:
            yield started
        finally:
            self.num_waiting -= held

    async def offload(self, size: int, fn: Callable[..., T], *args: Any, inline: bool = True) -> T:
        """``fn(*args)`` on the engine's renderer pool (tokenizing, chat templates, detokenizing)."""
        try:
            return await self.engine.renderer.run(size, fn, *args, inline=inline)
        except RendererBusyError as exc:
            raise self.overloaded(str(exc).removesuffix("; retry later")) from None

    async def parse(self, request: web.Request, parse: Callable[[bytes], T]) -> T:
        """``parse(body)`` of the request's raw body (decode, check, build the params), weighed by
        the body's length, the whole request's size: its work grows with every list and schema
        in it (500,000 ``allowed_token_ids`` took 0.5 s to check), so a big body is parsed on
        the renderer pool like any other input-sized work, never on the event loop."""
        raw = await request.read()
        return await self.offload(len(raw), parse, raw)

    async def generate(
        self,
        prompt: Any,
        params: SamplingParams,
        request_id: str,
        started: Callable[[], None],
        priority: int = 0,
        model: Optional[str] = None,
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one admitted request (with the LoRA adapter ``model`` names, if
        any). Closing this stream early (cancel, timeout, error) aborts the request in the core; a
        request refused by the core raises."""
        first = True
        try:
            async with contextlib.aclosing(
                self.engine.generate(
                    prompt, params, request_id, priority=priority, lora_request=self.lora_request(model)
                )
            ) as outputs:
                async for output in outputs:
                    if first:
                        first = False
                        started()
                    yield output
        except RendererBusyError as exc:
            raise self.overloaded(str(exc).removesuffix("; retry later")) from None

    def generate_all(
        self,
        prompts: Sequence[Any],
        params: SamplingParams,
        request_id: str,
        started: Callable[[], None],
        priority: int = 0,
        model: Optional[str] = None,
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every prompt's outputs as ``(prompt index, output)``; leaving early aborts the
        requests still running with one message to the core, not one per prompt."""
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        return merge_streams(
            [self.generate(p, params, i, started, priority, model) for p, i in zip(prompts, ids)],
            abort=lambda: self.engine.abort(ids),
        )

    def deadline(self) -> Optional[float]:
        """When a request arriving now must be done (loop time), or None: no timeout."""
        timeout = self.limits.request_timeout_s
        return None if timeout is None else asyncio.get_running_loop().time() + timeout

    def time_limit(self, deadline: Optional[float]) -> contextlib.AbstractAsyncContextManager[None]:
        """Work under the request's ``deadline``, also ended by the end of a drain."""
        return self.deadlines.limit(deadline)

    async def sse_response(
        self, request: web.Request, events: AsyncIterator[Any], framing: SSEFraming = OPENAI_SSE
    ) -> web.StreamResponse:
        """Stream ``events`` (msgspec structs) as ``data: {json}`` chunks, then ``data: [DONE]``
        (or as ``framing`` says them).

        The first event is awaited before the headers go out, so a request the engine refuses
        outright still gets a 4xx/5xx status rather than a 200 stream holding an error.
        """
        deadline = self.deadline()
        async with contextlib.aclosing(events):
            async with self.time_limit(deadline):
                first = await anext(events, None)
            response = web.StreamResponse(headers=_SSE_HEADERS)
            try:
                await response.prepare(request)
                try:
                    async with self.time_limit(deadline):
                        if first is not None:
                            await response.write(framing.event(first))
                        async for event in events:
                            await response.write(framing.event(event))
                except ConnectionResetError:
                    raise
                except Exception as exc:
                    error = to_openai_error(exc)
                    logger.info("stream %s ended with an error: %s", request.path, error.message)
                    # the same rules as every other error body (public_errors.py)
                    await response.write(framing.error(public_error(error)))
                if framing.end:
                    await response.write(framing.end)
                await response.write_eof()
            except ConnectionResetError:
                # The client is gone, at any write up to the last: nobody to tell, and nothing to
                # log above debug (a client that hangs up is routine). Leaving closes ``events``,
                # which aborts its requests.
                logger.debug("client left %s before its stream ended", request.path)
            return response


async def merge_streams(
    streams: Sequence[AsyncIterator[T]], abort: Optional[Callable[[], Awaitable[None]]] = None
) -> AsyncIterator[tuple[int, T]]:
    """Interleave several streams as ``(stream index, item)`` in arrival order.

    Each stream is drained by its own task; leaving early (error, cancellation) first awaits
    ``abort`` (which may end all the streams' engine requests at once), then cancels the
    tasks, which closes, and so aborts, every engine request still running.
    """
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for item in stream:
                    queue.put_nowait((index, item, None))
            queue.put_nowait((index, done, None))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, None, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is done:
                remaining -= 1
            else:
                yield index, item
    finally:
        if remaining and abort is not None:
            await abort()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
