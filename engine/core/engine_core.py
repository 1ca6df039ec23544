"""The EngineCore: a worker (engine/worker/worker.py), a KV cache and a scheduler, driven one step at a time.

It knows nothing of tokenizers or transports: requests come in as ``EngineCoreRequest``
(token ids), results go out as ``EngineCoreOutputs`` (token ids). The same object runs
in the caller's process (``InprocClient``) or behind the ring in its own process.

A request the core cannot serve (empty prompt, too long, bad parameters, duplicate id)
must not raise into the caller, who may be a busy loop serving everyone else: it is
answered with a finished output carrying ``FinishReason.ERROR`` and the reason. A step
that raises (scheduling, preparing inputs, the model, sampling) is answered the same way:
the requests it ran finish with ``FinishReason.ERROR`` and ``internal_error`` set, their
blocks are freed, the traceback goes to this process's log and the next step runs. Only a
core that cannot go on raises out of ``step`` (the busy loop then sends ENGINE_DEAD).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Optional

import msgspec

from engine.config import EngineConfig
from engine.core.kv_cache import KVCacheManager
from engine.core.kv_events import KVEventBatch, make_publisher
from engine.core.request import Request, RequestStatus
from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.lora.request import LoRARequest
from engine.request_check import RequestLimits, check_request
from engine.wire_messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from engine.worker.worker import rpc_callable

logger = logging.getLogger(__name__)

_NOTHING_RUN = ModelRunnerOutput()

# Steps in a row that may fail before the core gives up. A failed step's requests are gone by
# the next step, so failures that go on with fresh requests are not theirs: the engine itself
# (its device, its state) is broken.
MAX_CONSECUTIVE_FAILED_STEPS = 3

# Longest sleep of a step that ran nothing while grammars compile: a new request waits no longer.
_GRAMMAR_WAIT_S = 0.002


def _lora_request(value: Any) -> LoRARequest:
    """A LoRARequest from a utility call's argument (the ring carries it as its fields)."""
    return value if isinstance(value, LoRARequest) else msgspec.convert(value, LoRARequest)


def _structured_output_manager(config: EngineConfig) -> Optional[Any]:
    """The grammars' manager (nothing is imported or built until a constrained request comes),
    or None without a tokenizer to build grammars from."""
    mc = config.model_config
    if mc.skip_tokenizer_init or mc.runner_type == "pooling":
        return None
    from engine.structured_output.manager import StructuredOutputManager
    from engine.structured_output.reasoning import ReasoningMarkers

    so_config = config.structured_outputs_config
    reasoning = (
        ReasoningMarkers.load(mc.tokenizer, so_config.reasoning_start, so_config.reasoning_end)
        if so_config.reasoning_end
        else None
    )
    return StructuredOutputManager(
        so_config, mc.tokenizer, mc.vocab_size, config.scheduler_config.max_num_seqs, reasoning
    )


def _draft_scheduler(config: EngineConfig, kv_cache: KVCacheManager, proposer: Optional[Any]) -> Optional[Any]:
    """Speculative decoding's scheduler part (engine/spec_decode/drafts.py), or None without
    speculative_config (or for a pooling model, which never decodes). ``proposer``: the worker's
    draft model, if it has one (else n-gram lookup)."""
    if config.speculative_config is None or config.model_config.runner_type == "pooling":
        return None
    from engine.spec_decode.drafts import DraftScheduler

    return DraftScheduler(config.speculative_config, kv_cache, config.model_config.max_model_len, proposer)


class EngineCore:
    def __init__(self, config: EngineConfig, engine_index: int = 0) -> None:
        from engine.worker import resolve_worker_cls

        self.config = config
        self.engine_index = engine_index
        self.max_model_len = config.model_config.max_model_len
        self.limits = RequestLimits.of(config.model_config)
        # The Worker interface, in vLLM's order (engine/worker/worker.py).
        self.worker = resolve_worker_cls(config.worker_cls)(config)
        self.worker.init_device()
        self.worker.load_model()
        self.num_kv_blocks = self.worker.initialize_kv_cache()
        block_size = config.cache_config.block_size
        if self.num_kv_blocks * block_size < self.max_model_len:
            raise ValueError(
                f"kv_cache_memory_bytes: the KV cache holds {self.num_kv_blocks} blocks of {block_size} tokens, "
                f"fewer than one request of max_model_len={self.max_model_len} needs; "
                "raise kv_cache_memory_bytes or lower max_model_len"
            )
        kv_cache = KVCacheManager(
            self.num_kv_blocks,
            block_size,
            config.cache_config.enable_prefix_caching,
            enable_kv_cache_events=config.kv_events_config is not None,
            event_contents=bool(config.kv_events_config and config.kv_events_config.include_token_ids),
        )
        self.scheduler = Scheduler(
            config.scheduler_config,
            kv_cache,
            self.max_model_len,
            kv_connector=self.worker.kv_connector,
            structured_output=_structured_output_manager(config),
            speculative=_draft_scheduler(config, kv_cache, self.worker.draft_proposer),
            max_loras=config.lora_config.max_loras if config.lora_config is not None else 0,
        )
        self.log_stats = not config.disable_log_stats
        # With kv_events_config: the cache's events, one batch per step, sent off the step's thread.
        self.kv_event_publisher = make_publisher(config.kv_events_config, engine_index)
        self._refused: list[EngineCoreOutput] = []  # answered by the next step
        self._failed_steps = 0  # consecutive
        self._abort_batches = 0  # abort_requests calls (AbortRequests messages) since start
        logger.info(
            "EngineCore ready: %d KV blocks of %d tokens, max_model_len %d",
            self.num_kv_blocks,
            block_size,
            self.max_model_len,
        )

    def add_request(self, request: EngineCoreRequest, *, params_verified: bool = False) -> None:
        """Queue ``request``, or answer it with an error output (``_check``: the core's one
        admission check). ``params_verified``: its SamplingParams were verified since they were
        last changed, by the decode that brought the request over the ring (msgspec runs their
        ``__post_init__``) or by the admission of the input processor in this process
        (``InprocClient``), so they are not verified again."""
        error = self._check(request, params_verified)
        if error is not None:
            self._refused.append(
                EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.ERROR, error=error)
            )
            return
        self.scheduler.add_request(Request.from_engine_core_request(request, self.max_model_len))

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        self._abort_batches += 1

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._refused)

    def step(self) -> EngineCoreOutputs:
        sched = None
        try:
            # 1) schedule: pick the batch and allocate its KV blocks
            sched = self.scheduler.schedule()
            # 2) run the model and sample (nothing to run: nothing scheduled)
            if sched.requests:
                start = time.perf_counter()
                result = self.worker.execute_model(sched)
                self.scheduler.observe_step(sched, time.perf_counter() - start)
            else:
                result = _NOTHING_RUN
                self.scheduler.wait_for_grammars(_GRAMMAR_WAIT_S)
            # 3) append tokens, check stops, free finished requests
            outputs = self.scheduler.update_from_output(sched, result)
            self._failed_steps = 0
        except Exception as exc:  # the step's requests fail, not the core
            outputs = self._fail_step(sched, exc)
        # 4) package with this step's refusals and stats
        return self._package(outputs)

    # Utility methods (callable through the client, by name).

    def reset_prefix_cache(self) -> bool:
        done = self.scheduler.kv_cache.reset_prefix_cache()
        self._publish_kv_events()  # AllBlocksCleared now, not with the next step
        return done

    def get_stats(self) -> dict[str, Any]:
        """Totals since start, for tests and the CLI (per-step figures go out with each step)."""
        s = self.scheduler
        return {
            "num_running_reqs": len(s.running),
            "num_waiting_reqs": len(s.waiting),
            "kv_cache_usage": s.kv_cache.usage,
            "num_kv_blocks": self.num_kv_blocks,
            "prefix_cache_queries": s.total_queries,
            "prefix_cache_hits": s.total_hits,
            "num_preemptions": s.total_preemptions,
            "num_abort_batches": self._abort_batches,
        }

    def add_lora(self, lora_request: Any) -> Optional[str]:
        """Load and check an adapter before requests use it: None, or why it cannot be used
        (a bad adapter is the caller's error, answered here; the core goes on)."""
        try:
            request = _lora_request(lora_request)
        except ValueError as e:
            return f"lora_request: {e}"
        try:
            self.worker.add_lora(request)
        except ValueError as e:
            return str(e)
        except Exception as e:  # an unreadable file in a way the readers did not foresee
            logger.exception("LoRA adapter %r could not be loaded", request.lora_name)
            return f"LoRA adapter {request.lora_name!r} cannot be loaded ({type(e).__name__}; see the server log)"
        return None

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter (requests already running with it keep it until they finish: it is
        read again from its path if a slot needs it)."""
        return self.worker.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        return self.worker.list_loras()

    def collective_rpc(self, method: str, args: list, kwargs: dict) -> list:
        """``method(*args)`` on the worker (vLLM's collective_rpc over its one worker): a list
        of one result, as plain data, so it can cross the ring. Only methods the worker marks
        ``@rpc_method`` are reachable."""
        fn = rpc_callable(self.worker, method)
        if fn is None:
            raise ValueError(
                f"the worker has no method {method!r} marked callable through collective_rpc (engine.worker.rpc_method)"
            )
        return [msgspec.to_builtins(fn(*args, **kwargs))]

    def stop_publishing(self) -> None:
        """Send the KV events still queued (briefly) and close their sockets; idempotent."""
        publisher, self.kv_event_publisher = self.kv_event_publisher, None
        if publisher is not None:
            publisher.shutdown()

    def shutdown(self) -> None:
        self.worker = None  # type: ignore[assignment]  # frees the model now: nothing steps after shutdown
        self.stop_publishing()
        if self.scheduler.structured_output is not None:
            self.scheduler.structured_output.shutdown()

    def _fail_step(self, sched: Optional[SchedulerOutput], exc: Exception) -> list[EngineCoreOutput]:
        """Finish the failed step's requests with an error (called while ``exc`` is handled).
        Re-raises when there is no request to blame or when too many steps failed in a row."""
        self._failed_steps += 1
        failed = self.scheduler.fail_step(sched)
        if not failed or self._failed_steps >= MAX_CONSECUTIVE_FAILED_STEPS:
            raise
        logger.exception("EngineCore step failed: its %d request(s) finish with an error", len(failed))
        # For the client: what failed, never the exception's text (it may name local paths).
        error = f"the engine failed while running this request ({type(exc).__name__}); see the server log"
        return [
            EngineCoreOutput(req_id, [], finish_reason=FinishReason.ERROR, error=error, internal_error=True)
            for req_id in failed
        ]

    def stats_only(self) -> EngineCoreOutputs:
        """An outputs message with no outputs: the scheduler's state now (after aborts that left
        nothing to step, so no step would report it)."""
        return EngineCoreOutputs(self.engine_index, [], time.monotonic(), self.scheduler.make_stats())

    def _publish_kv_events(self) -> None:
        if self.kv_event_publisher is not None:
            events = self.scheduler.kv_cache.take_events()
            if events:
                self.kv_event_publisher.publish(KVEventBatch(time.time(), events))

    def _package(self, outputs: list[EngineCoreOutput]) -> EngineCoreOutputs:
        self._publish_kv_events()
        if self._refused:
            outputs = self._refused + outputs
            self._refused = []
        stats = self.scheduler.make_stats() if self.log_stats else None
        return EngineCoreOutputs(self.engine_index, outputs, time.monotonic(), stats)

    def _check(self, request: EngineCoreRequest, params_verified: bool) -> Optional[str]:
        """Why the core cannot serve ``request``, or None. The frontend ran the same
        ``check_request`` before sending it; this guards everything else that can reach the core."""
        params = request.sampling_params
        if request.request_id in self.scheduler.requests:
            return f"request id {request.request_id!r} is already in use"
        try:
            if not params_verified:
                params.verify()
            check_request(request.prompt_token_ids, params, self.limits)
        except ValueError as e:
            return str(e)
        if params.n != 1:
            return f"SamplingParams.n must be 1 inside the core (the frontend fans out n={params.n})"
        if params.structured_outputs is not None and self.scheduler.structured_output is None:
            return "structured_outputs needs the model's tokenizer (the engine was built with skip_tokenizer_init=True)"
        if request.lora_request is not None:
            return self.add_lora(request.lora_request)  # loaded now unless it still is
        return None
