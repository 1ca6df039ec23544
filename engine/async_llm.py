"""AsyncLLM: the asyncio entry point for serving (vLLM's v1 ``AsyncLLM``).

Requests are admitted by the input processor (``InputProcessor.admit``, LLMEngine's path too)
and sent to the EngineCore process(es) through an ``AsyncMPClient``. Admitting a text prompt
of more than a few KB (its tokenizing) runs on ``renderer``, a pool of ``renderer_num_workers``
threads bounded in queued work (engine/frontend/renderer.py), so the event loop never waits
on it; token ids are checked inline, work that holds the GIL on any thread. The server renders
chat templates and detokenizes long texts there too. One background task, the
output handler, pulls the core's outputs, detokenizes them in slices of
``RINGLLM_OUTPUT_PROC_CHUNK_SIZE`` (yielding to the loop between slices, so a step of 256
requests never stalls the server for its whole length) and drops each request's output
into that request's ``RequestOutputCollector`` (the output processor puts each output
straight into it), which ``generate()`` awaits.

Failure model: when the core dies every collector gets ``EngineDeadError`` and new requests
are refused with it at once; a request the core refuses fails alone with
``EngineGenerateError``, and one whose engine step failed fails alone with ``EngineStepError``.
``shutdown()`` ends the requests still running with ``EngineShutdownError`` (an EngineDeadError).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncGenerator, Iterable, Optional, Union


from engine import envs
from engine.client import make_client
from engine.client.core_launcher import CoreProcess
from engine.client.factory import config_and_cores, stopped_on_error
from engine.config import AsyncEngineArgs, EngineArgs, EngineConfig, FrontendConfig
from engine.exceptions import EngineDeadError, EngineGenerateError, EngineShutdownError, EngineStepError
from engine.frontend.input_processor import InputProcessor, PromptType, get_tokenizer
from engine.frontend.output_processor import OutputProcessor
from engine.frontend.renderer import Renderer
from engine.frontend.tokenizer import user_tokenizer
from engine.llm_engine import rpc_args
from engine.logging_setup import configure_logging
from engine.lora.request import LoRARequest
from engine.outputs import PoolingRequestOutput, RequestOutput
from engine.pooling_params import PoolingParams
from engine.frontend.request_options import check_lora_request
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.server_interface import EngineClient
from engine.stat_loggers import IterationStats, StatLoggerBase, StatLoggerFactory

logger = logging.getLogger(__name__)


def _merge(pending: RequestOutput, new: RequestOutput, aggregate: bool) -> None:
    """Fold ``new`` into an output the consumer has not taken yet: DELTA appends each
    completion's increments, the other kinds keep each completion's latest state."""
    pending.finished |= new.finished
    pending.metrics, pending.error = new.metrics, new.error or pending.error
    pending.internal_error |= new.internal_error
    if new.prompt_logprobs is not None:
        pending.prompt_logprobs = (
            (pending.prompt_logprobs or []) + new.prompt_logprobs if aggregate else new.prompt_logprobs
        )
    for completion in new.outputs:
        for i, old in enumerate(pending.outputs):
            if old.index != completion.index:
                continue
            if aggregate:
                old.text += completion.text
                old.token_ids = old.token_ids + completion.token_ids
                if completion.logprobs:
                    old.logprobs = (old.logprobs or []) + completion.logprobs
                old.cumulative_logprob = completion.cumulative_logprob
                old.finish_reason, old.stop_reason = completion.finish_reason, completion.stop_reason
            else:
                pending.outputs[i] = completion
            break
        else:
            pending.outputs.append(completion)


def _num_new_tokens(output: RequestOutput, aggregate: bool, sent: int) -> int:
    """New tokens in ``output`` (its longest completion): all it carries when outputs are
    deltas, else what it has beyond the ``sent`` already yielded."""
    longest = max((len(c.token_ids) for c in output.outputs), default=0)
    return longest if aggregate else longest - sent


class RequestOutputCollector:
    """One request's mailbox between the output handler and its consumer.

    ``put`` never blocks the handler: an output the consumer has not taken yet is merged
    with the new one (deltas concatenated for DELTA, the latest state kept otherwise), so
    a slow consumer loses nothing and holds at most one pending output. The frontend's one
    merge of RequestOutputs. ``core_timestamp`` is when the core published the newest step
    folded in (the transport latency metric).

    ``stream_interval`` (vLLM's): after the first output, one is handed out only once it
    carries that many new tokens (the last, or an error, at once); until then it is the
    pending output that later ones merge into.

    ``internal_id`` is the id the core and the output processor know the request by: the
    caller's id plus a sequence number, so an id reused right after an abort can never
    receive the old request's outputs still on their way.
    """

    __slots__ = (
        "request_id",
        "internal_id",
        "aggregate",
        "output",
        "waiter",
        "core_timestamp",
        "_loop",
        "_interval",
        "_sent",
    )

    def __init__(
        self,
        request_id: str,
        internal_id: str,
        output_kind: RequestOutputKind,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        stream_interval: Optional[int] = None,
    ) -> None:
        self.request_id = request_id
        self.internal_id = internal_id
        self.aggregate = output_kind == RequestOutputKind.DELTA
        self.output: Union[RequestOutput, BaseException, None] = None
        self.waiter: Optional[asyncio.Future] = None  # the consumer, while it awaits
        self.core_timestamp = 0.0
        self._loop = loop
        self._interval = stream_interval
        self._sent: Optional[int] = None  # with stream_interval: output tokens handed out (None: nothing yet)

    def put(self, output: Union[RequestOutput, BaseException], core_timestamp: float = 0.0) -> None:
        self.core_timestamp = core_timestamp
        pending = self.output
        if pending is None or isinstance(output, BaseException):
            self.output = output
        elif type(pending) is RequestOutput:
            _merge(pending, output, self.aggregate)
        waiter = self.waiter
        if waiter is not None and (not self._interval or self._due()):
            self.waiter = None
            if not waiter.done():  # done: its consumer was cancelled
                waiter.set_result(None)

    async def get(self) -> RequestOutput:
        while self.output is None or (self._interval and not self._due()):  # one consumer, woken once per output
            loop = self._loop or asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            await waiter
        return self._take()

    def get_nowait(self) -> Optional[RequestOutput]:
        if self.output is None or (self._interval and not self._due()):
            return None
        return self._take()

    def _due(self) -> bool:
        """Whether the pending output may be handed out now, with ``stream_interval`` set (the
        callers test ``_interval`` first: without it every output is due, and the common path
        pays for no call)."""
        output = self.output
        if output is None:
            return False
        if self._sent is None or type(output) is not RequestOutput:
            return True
        return (
            output.finished
            or output.error is not None
            or _num_new_tokens(output, self.aggregate, self._sent) >= self._interval
        )

    def _take(self) -> RequestOutput:
        output, self.output = self.output, None
        if isinstance(output, BaseException):
            raise output
        if self._interval:
            self._sent = (self._sent or 0) + _num_new_tokens(output, self.aggregate, self._sent or 0)
        return output


async def _output_handler(
    engine_core,
    output_processor: OutputProcessor,
    requests: dict[str, RequestOutputCollector],
    latencies: deque,
    stat_loggers: list[tuple[Optional[int], StatLoggerBase]],
) -> None:
    """The one task that turns core outputs into RequestOutputs. A free function holding no
    reference to the AsyncLLM, so an AsyncLLM nobody uses can be garbage collected."""
    chunk = envs.RINGLLM_OUTPUT_PROC_CHUNK_SIZE
    try:
        while True:
            # 1) every OUTPUTS message that has arrived, folded: one per run of one core's messages
            for outputs in output_processor.fold(await engine_core.get_outputs_async()):
                items, timestamp = outputs.outputs, outputs.timestamp
                latency = time.monotonic() - timestamp
                latencies.append(latency)
                iteration_stats = _iteration_stats(output_processor, latency) if stat_loggers else None
                for start in range(0, len(items), chunk):
                    # 2) detokenize, stop strings, output kinds; each output goes into its collector
                    processed = output_processor.process_outputs(
                        items[start : start + chunk] if len(items) > chunk else items, timestamp, iteration_stats
                    )
                    # 3) forget the collectors of finished requests (their consumers still hold them)
                    for collector in processed.finished_queues:
                        if requests.get(collector.request_id) is collector:
                            del requests[collector.request_id]
                    # 4) stop in the core what a stop string finished here; count off what the core finished
                    engine_core.abort_requests_nowait(processed.reqs_to_abort)
                    engine_core.requests_finished(processed.finished_by_core)
                    # 5) let this slice's consumers (and new requests) run, before the next slice
                    # and before this task goes back to waiting on the channel
                    await asyncio.sleep(0)
                # 6) the message's stats, once per message, to the stat loggers (the server's metrics)
                if iteration_stats is not None:
                    _record(stat_loggers, outputs.scheduler_stats, iteration_stats, outputs.engine_index)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        error = e if isinstance(e, EngineDeadError) else EngineDeadError(f"output handler failed: {e!r}")
        if not isinstance(e, EngineDeadError):
            logger.exception("AsyncLLM output handler failed")
        _fail_all(requests, error)  # the task ends here; AsyncLLM.errored reports it from now on


def _fail_all(requests: dict[str, RequestOutputCollector], error: EngineDeadError) -> None:
    """End every request still running with ``error``: no output will come for them."""
    for collector in requests.values():
        collector.put(error)
    requests.clear()


def _stop_output_handler(handler: asyncio.Task, requests: dict[str, RequestOutputCollector]) -> None:
    """On the handler's loop (or with the loop stopped): cancel it, and end the requests it was
    serving with EngineShutdownError; their ``generate`` would otherwise await outputs that no
    task reads any more, for ever."""
    handler.cancel()
    if not handler.get_loop().is_closed():
        _fail_all(requests, EngineShutdownError(EngineShutdownError.RUNNING))


def _iteration_stats(output_processor: OutputProcessor, transport_latency: float) -> IterationStats:
    """A message's IterationStats, starting with the requests aborted here since the last one."""
    stats = IterationStats(transport_latency=transport_latency)
    if output_processor.aborted_stats:
        stats.finished_requests, output_processor.aborted_stats = output_processor.aborted_stats, []
    return stats


def _record(
    stat_loggers: list[tuple[Optional[int], StatLoggerBase]],
    scheduler_stats,
    iteration_stats: IterationStats,
    engine_index: int,
) -> None:
    for rank, stat_logger in stat_loggers:
        if rank is None or rank == engine_index:
            try:
                stat_logger.record(scheduler_stats, iteration_stats, engine_index)
            except Exception:  # a broken logger loses its figures, never the engine
                logger.exception("stat logger %s failed", type(stat_logger).__name__)


class AsyncLLM(EngineClient):
    # Appended to every id the core knows a request by: API servers sharing one core
    # (--api-server-count) each set their own, so two of them never send the core the same id.
    internal_id_suffix = ""

    def __init__(
        self,
        config: EngineConfig,
        *,
        log_requests: bool = False,
        start_engine_loop: bool = True,
        stat_loggers: Optional[list[StatLoggerFactory]] = None,
        _started: Optional[list[CoreProcess]] = None,
    ) -> None:
        """``_started``: cores already launched by ``from_engine_args`` (see config_and_cores).
        ``stat_loggers``: vLLM's factories, ``factory(config, engine_index)``, one logger per
        data-parallel rank (``add_stat_logger`` adds one for every rank)."""
        configure_logging()
        self.config = config
        self.model_config = config.model_config
        self.log_requests = log_requests
        with stopped_on_error(_started):
            self.tokenizer = get_tokenizer(config)
            self.input_processor = InputProcessor(config, self.tokenizer)
            self.output_processor = OutputProcessor(self.tokenizer)
        self._requests: dict[str, RequestOutputCollector] = {}  # by the caller's request id
        self._loras: dict[int, LoRARequest] = {}  # adapters every core has loaded and checked, by lora_int_id
        self._transport_latencies: deque[float] = deque(maxlen=100_000)
        # (rank or None for every rank, logger): fed by the output handler once per message
        self._stat_loggers: list[tuple[Optional[int], StatLoggerBase]] = []
        self.renderer = Renderer(config.frontend_config.renderer_num_workers)
        self.output_handler: Optional[asyncio.Task] = None
        self.engine_core = make_client(True, True, config, _started)
        for factory in stat_loggers or ():
            for rank in config.parallel_config.frontend_engine_indices:
                self._add_stat_logger(factory(config, rank), rank)
        # Everything built so far (torch, transformers, the tokenizer) lives as long as the
        # server: out of the collector's way, a step's burst of small objects no longer
        # triggers full collections over it (they cost milliseconds per output batch).
        gc.collect()
        gc.freeze()
        try:
            asyncio.get_running_loop()
            if start_engine_loop:
                self._run_output_handler()
        except RuntimeError:
            pass  # no loop yet: the handler starts with the first request

    @classmethod
    def from_engine_args(
        cls,
        engine_args: EngineArgs,
        start_engine_loop: bool = True,
        stat_loggers: Optional[list[StatLoggerFactory]] = None,
    ) -> "AsyncLLM":
        """``start_engine_loop``: start the output handler now (when called inside a running
        event loop); False leaves it to the first request."""
        config, started = config_and_cores(engine_args, True, sync_frontend=False)
        return cls(
            config,
            start_engine_loop=start_engine_loop,
            stat_loggers=stat_loggers,
            log_requests=getattr(engine_args, "enable_log_requests", False),
            _started=started,
        )

    @classmethod
    def from_vllm_config(
        cls, vllm_config: EngineConfig, start_engine_loop: bool = True, enable_log_requests: bool = False
    ) -> "AsyncLLM":
        """From the config ``EngineArgs.create_engine_config()`` derived (vLLM's VllmConfig)."""
        return cls(vllm_config, log_requests=enable_log_requests, start_engine_loop=start_engine_loop)

    @classmethod
    def from_engine_config(cls, config: EngineConfig, *, log_requests: bool = False) -> "AsyncLLM":
        return cls(config, log_requests=log_requests)

    def _run_output_handler(self) -> None:
        if self.output_handler is None:
            self.output_handler = asyncio.get_running_loop().create_task(
                _output_handler(
                    self.engine_core,
                    self.output_processor,
                    self._requests,
                    self._transport_latencies,
                    self._stat_loggers,
                ),
                name="AsyncLLM.output_handler",
            )

    # -- state -----------------------------------------------------------------------
    @property
    def errored(self) -> bool:
        return self.engine_core.dead_error is not None or not self.is_running

    @property
    def is_running(self) -> bool:
        return self.output_handler is None or not self.output_handler.done()

    @property
    def is_stopped(self) -> bool:
        return self.errored

    @property
    def dead_error(self) -> EngineDeadError:
        return self.engine_core.dead_error or EngineDeadError("the output handler has stopped")

    async def check_health(self) -> None:
        if self.errored:
            raise self.dead_error

    async def get_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("no tokenizer: the engine was built with skip_tokenizer_init=True")
        # A transformers tokenizer, as vLLM's; building one imports transformers: off the loop.
        return await asyncio.to_thread(user_tokenizer, self.tokenizer)

    async def get_model_config(self):
        return self.model_config

    async def get_vllm_config(self) -> EngineConfig:
        return self.config

    async def get_stats(self) -> list[dict[str, Any]]:
        """Each EngineCore's totals, in rank order (running and waiting requests, KV usage,
        prefix-cache queries and hits)."""
        return list(
            await asyncio.gather(
                *(
                    self.engine_core.call_utility_async("get_stats", engine_index=rank)
                    for rank in self.config.parallel_config.frontend_engine_indices
                )
            )
        )

    def add_stat_logger(self, stat_logger: StatLoggerBase) -> None:
        """Hand ``stat_logger.record`` every outputs message's stats from now on, from every rank."""
        self._add_stat_logger(stat_logger, None)

    def _add_stat_logger(self, stat_logger: StatLoggerBase, rank: Optional[int]) -> None:
        if not isinstance(stat_logger, StatLoggerBase):
            raise TypeError(
                f"a stat logger must be an engine.stat_loggers.StatLoggerBase, got {type(stat_logger).__name__}"
            )
        self._stat_loggers.append((rank, stat_logger))
        self.output_processor.log_stats = True
        stat_logger.log_engine_initialized()

    def take_transport_latencies(self) -> list[float]:
        """Seconds from the core publishing each OUTPUTS message to the output handler taking
        it, for every message since the previous call (the ring's own latency, for /metrics)."""
        samples = list(self._transport_latencies)
        self._transport_latencies.clear()
        return samples

    async def reset_prefix_cache(self) -> bool:
        """Every data-parallel rank's cache (as vLLM's DP client sends a utility call to each core);
        True only if each core reset its own (one refuses while its blocks are in use)."""
        results = [
            await self.engine_core.call_utility_async("reset_prefix_cache", engine_index=rank)
            for rank in self.config.parallel_config.frontend_engine_indices
        ]
        return all(results)

    async def collective_rpc(
        self, method: str, timeout: Optional[float] = None, args: tuple = (), kwargs: Optional[dict] = None
    ) -> list:
        """Call a public method of every EngineCore's worker by name: one result per
        data-parallel rank, as plain data."""
        call = rpc_args(method, timeout, args, kwargs)
        return [
            result
            for rank in self.config.parallel_config.frontend_engine_indices
            for result in await self.engine_core.call_utility_async("collective_rpc", *call, engine_index=rank)
        ]

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load and check an adapter in every data-parallel rank's core; ValueError naming what
        is wrong (vLLM's ``add_lora``)."""
        check_lora_request(lora_request, self.input_processor.lora_enabled)
        for rank in self.config.parallel_config.frontend_engine_indices:
            error = await self.engine_core.call_utility_async("add_lora", lora_request, engine_index=rank)
            if error is not None:
                raise ValueError(error)
        self._loras[lora_request.lora_int_id] = lora_request
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self._loras.pop(lora_id, None)
        results = [
            await self.engine_core.call_utility_async("remove_lora", lora_id, engine_index=rank)
            for rank in self.config.parallel_config.frontend_engine_indices
        ]
        return any(results)

    async def list_loras(self) -> set[int]:
        rank = self.config.parallel_config.frontend_engine_indices[0]
        return set(await self.engine_core.call_utility_async("list_loras", engine_index=rank))

    # -- requests --------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: Optional[float] = None,
        priority: int = 0,
        *,
        lora_request: Any = None,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
        data_parallel_rank: Optional[int] = None,
    ) -> RequestOutputCollector:
        """Admit (``InputProcessor.admit``, as LLMEngine does) and send; returns the request's
        collector at once (the first output comes later). Bad input raises ValueError/TypeError
        and nothing is sent. A request whose text and params are long enough to be worth it
        (``InputProcessor.offload_size``) is admitted on the renderer pool, others inline.
        ``data_parallel_rank`` sends it to that rank's EngineCore."""
        if self.errored:
            raise self.dead_error
        processor = self.input_processor
        internal_id = processor.internal_id(request_id, self._requests) + self.internal_id_suffix
        ranks = self.config.parallel_config.frontend_engine_indices
        if data_parallel_rank is not None and data_parallel_rank not in ranks:
            raise ValueError(f"data_parallel_rank={data_parallel_rank!r}: this engine runs rank(s) {ranks}")
        self._run_output_handler()
        collector = RequestOutputCollector(
            request_id,
            internal_id,
            getattr(params, "output_kind", None),
            asyncio.get_running_loop(),
            getattr(params, "stream_interval", None),
        )
        self._requests[request_id] = collector  # reserved across awaits
        try:
            processor.check_prompt_fits(prompt, params)  # a prompt too long to fit is refused before the queue
            admit = functools.partial(
                processor.admit, lora_request=lora_request, tokenization_kwargs=tokenization_kwargs
            )
            admission = await self.renderer.run(
                processor.offload_size(prompt, params), admit, internal_id, prompt, params, arrival_time, priority
            )
            if lora_request is not None and self._loras.get(lora_request.lora_int_id) != lora_request:
                await self.add_lora(lora_request)  # a bad adapter: ValueError before anything is sent
            self.output_processor.add_admitted(admission, output_id=request_id, queue=collector)
            for request, _, _ in admission.children:
                await self.engine_core.add_request_async(request, data_parallel_rank)
        except BaseException:
            self._abort_now([request_id])
            raise
        if self.log_requests:
            logger.info(
                "Added request %s (%d prompt tokens, %s)", request_id, len(admission.request.prompt_token_ids), params
            )
        return collector

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        lora_request: Any = None,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
        priority: int = 0,
        data_parallel_rank: Optional[int] = None,
        arrival_time: Optional[float] = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs until it finishes. Cancelling the consumer (or closing
        the generator) aborts the request in the core; ``abort(request_id)`` ends it with a last
        output finished with "abort"."""
        collector = None
        try:
            collector = await self.add_request(
                request_id,
                prompt,
                sampling_params,
                arrival_time,
                priority,
                lora_request=lora_request,
                tokenization_kwargs=tokenization_kwargs,
                data_parallel_rank=data_parallel_rank,
            )
            finished = False
            while not finished:
                output = collector.get_nowait() or await collector.get()
                if output.error is not None:
                    error = EngineStepError if output.internal_error else EngineGenerateError
                    raise error(f"request {request_id!r} failed: {output.error}")
                finished = output.finished
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            if collector is not None:
                self._abort_now([request_id])
                if self.log_requests:
                    logger.info("Request %s aborted", request_id)
            raise

    async def encode(
        self, prompt: PromptType, pooling_params: PoolingParams, request_id: str, *, priority: int = 0
    ) -> AsyncGenerator[PoolingRequestOutput, None]:
        """vLLM's pooling counterpart of ``generate`` (a model served with runner="pooling"):
        yields the request's one PoolingRequestOutput, made once its prompt is computed."""
        if not isinstance(pooling_params, PoolingParams):
            raise TypeError(f"pooling_params must be a PoolingParams, got {type(pooling_params).__name__}")
        self.input_processor.check_runner(pooling=True)
        async for output in self.generate(prompt, pooling_params, request_id, priority=priority):
            yield output

    def _abort_now(self, request_ids: Iterable[str]) -> None:
        internal_ids = []
        for req_id in request_ids:
            collector = self._requests.pop(req_id, None)
            if collector is not None:
                internal_ids.append(collector.internal_id)
        core_ids = self.output_processor.abort_requests(internal_ids)
        if core_ids and not self.errored:
            self.engine_core.abort_requests_nowait(core_ids)

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests: each one's generator yields a last output, finished with
        finish_reason "abort", and ends. All of them go to the core in one message (one per
        data-parallel rank)."""
        self._abort_now([request_id] if isinstance(request_id, str) else request_id)

    # -- lifetime --------------------------------------------------------------------
    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Stop the handler, the core process(es) and the tokenizer pool; idempotent. The
        cores get ``timeout`` seconds (default: the ``shutdown_timeout`` setting) to exit
        before they are killed."""
        if timeout is None:
            config = getattr(self, "config", None)  # None: __init__ failed before setting it
            timeout = config.frontend_config.shutdown_timeout if config is not None else FrontendConfig.shutdown_timeout
        handler = getattr(self, "output_handler", None)
        if handler is not None and not handler.done():
            loop = handler.get_loop()
            try:
                in_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                in_loop = False
            if in_loop or not loop.is_running():
                _stop_output_handler(handler, self._requests)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(_stop_output_handler, handler, self._requests)
        engine_core = getattr(self, "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown(timeout)
        renderer = getattr(self, "renderer", None)
        if renderer is not None:
            renderer.shutdown()

    def __del__(self) -> None:
        self.shutdown()


@asynccontextmanager
async def build_async_engine_client_from_engine_args(
    engine_args: AsyncEngineArgs,
) -> AsyncGenerator[EngineClient, None]:
    """The AsyncLLM a server runs on, shut down whatever way the server exits."""
    engine = None
    try:
        engine = AsyncLLM.from_engine_args(engine_args)
        yield engine
    finally:
        if engine is not None:
            engine.shutdown()
