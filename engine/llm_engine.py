"""LLMEngine: the synchronous, step-by-step engine under ``LLM`` (vLLM's v1 LLMEngine).

Input processing (tokenize, validate) and output processing (detokenize, stop strings,
output kinds) run here, in the caller's process; the EngineCore sits behind an
``EngineCoreClient``. The caller drives it: ``add_request`` any number of times, then
``step()`` while ``has_unfinished_requests()``.

Requests enter through ``InputProcessor.admit``, the path AsyncLLM takes too. The core knows
each request by an internal id (``InputProcessor.internal_id``), the caller's id plus a
sequence number, so an id can be reused as soon as its request was aborted or finished (by a
stop string, in this process): the core's outputs for the earlier request that are still on
their way match no request any more and are dropped.

One thread at a time drives an LLMEngine (as vLLM's); ``begin_shutdown`` alone may come from
another. ``LLM`` serialises its callers with a lock.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional, Union

from engine.client import make_client
from engine.client.core_launcher import CoreProcess
from engine.client.factory import config_and_cores, stopped_on_error
from engine.config import EngineArgs, EngineConfig
from engine.frontend.input_processor import InputProcessor, PromptType, get_tokenizer
from engine.frontend.output_processor import OutputProcessor
from engine.frontend.tokenizer import user_tokenizer
from engine.logging_setup import configure_logging
from engine.lora.request import LoRARequest
from engine.outputs import RequestOutput
from engine.frontend.request_options import check_lora_request
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(
        self, config: EngineConfig, multiprocess_mode: bool = False, *, _started: Optional[list[CoreProcess]] = None
    ) -> None:
        configure_logging()
        self.config = config
        with stopped_on_error(_started):
            self.tokenizer = get_tokenizer(config)
            self.input_processor = InputProcessor(config, self.tokenizer)
            self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = make_client(multiprocess_mode, False, config, _started)
        self._internal_ids: dict[str, str] = {}  # the caller's request id -> the core's
        self._loras: dict[int, Any] = {}  # adapters the core has loaded and checked, by lora_int_id

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, enable_multiprocessing: bool = False) -> "LLMEngine":
        config, started = config_and_cores(engine_args, enable_multiprocessing, sync_frontend=True)
        return cls(config, multiprocess_mode=enable_multiprocessing, _started=started)

    @classmethod
    def from_engine_config(cls, config: EngineConfig, enable_multiprocessing: bool = False) -> "LLMEngine":
        return cls(config, multiprocess_mode=enable_multiprocessing)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: Optional[float] = None,
        priority: int = 0,
        add_special_tokens: bool = True,
        *,
        lora_request: Any = None,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
    ) -> str:
        """Queue a request; a bad prompt or bad params raise ValueError/TypeError here and
        nothing is queued. With ``params.n > 1`` the core runs n child requests.
        ``lora_request``: the adapter (with ``enable_lora``; loaded and checked here the first
        time, so a bad one is a ValueError); ``tokenization_kwargs`` truncates a text prompt."""
        internal_id = self.input_processor.internal_id(request_id, self._internal_ids)
        admission = self.input_processor.admit(
            internal_id,
            prompt,
            params,
            arrival_time,
            priority,
            add_special_tokens,
            lora_request=lora_request,
            tokenization_kwargs=tokenization_kwargs,
        )
        if lora_request is not None and self._loras.get(lora_request.lora_int_id) != lora_request:
            self.add_lora(lora_request)
        self._internal_ids[request_id] = internal_id
        self.output_processor.add_admitted(admission, output_id=request_id)
        for request, _, _ in admission.children:
            self.engine_core.add_request(request)
        return request_id

    def step(self) -> list[RequestOutput]:
        # 1) one step of the core (in-process) or the next outputs it sent
        outputs = self.engine_core.get_output()
        # 2) detokenize, apply stop strings and output kinds
        processed = self.output_processor.process_outputs(outputs.outputs)
        # 3) stop in the core what a stop string finished here
        self.engine_core.abort_requests(processed.reqs_to_abort)
        for output in processed.request_outputs:
            if output.finished:
                del self._internal_ids[output.request_id]
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def abort_request(self, request_ids: Union[str, Iterable[str]]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        internal_ids = [self._internal_ids.pop(i) for i in ids if i in self._internal_ids]
        self.engine_core.abort_requests(self.output_processor.abort_requests(internal_ids))

    def get_tokenizer(self):
        """A transformers tokenizer, as vLLM's (built on first call when the engine reads the
        tokenizer without transformers: engine/frontend/tokenizer.py)."""
        return user_tokenizer(self.tokenizer)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """vLLM's: load and check an adapter in the core; ValueError naming what is wrong."""
        check_lora_request(lora_request, self.input_processor.lora_enabled)
        error = self.engine_core.call_utility("add_lora", lora_request)
        if error is not None:
            raise ValueError(error)
        self._loras[lora_request.lora_int_id] = lora_request
        return True

    def remove_lora(self, lora_id: int) -> bool:
        self._loras.pop(lora_id, None)
        return self.engine_core.call_utility("remove_lora", lora_id)

    def list_loras(self) -> set[int]:
        return set(self.engine_core.call_utility("list_loras"))

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.call_utility("reset_prefix_cache")

    def get_stats(self) -> dict[str, Any]:
        """Engine totals: running and waiting requests, KV usage, prefix-cache queries and hits."""
        return self.engine_core.call_utility("get_stats")

    def collective_rpc(
        self, method: str, timeout: Optional[float] = None, args: tuple = (), kwargs: Optional[dict[str, Any]] = None
    ) -> list[Any]:
        """``method`` called by name on the EngineCore's worker (engine/worker/worker.py); one
        result per worker (one here), as plain data."""
        return self.engine_core.call_utility("collective_rpc", *rpc_args(method, timeout, args, kwargs))

    def begin_shutdown(self) -> None:
        """From any thread: the call using the engine in another thread raises
        ``EngineShutdownError`` at once, and so does every later one (``EngineCoreClient``)."""
        self.engine_core.begin_shutdown()

    def shutdown(self) -> None:
        self.engine_core.shutdown()


def rpc_args(method: Any, timeout: Optional[float], args: tuple, kwargs: Optional[dict]) -> tuple:
    """The UTILITY arguments of a collective_rpc: a method *name* only (a callable would have
    to be pickled onto the ring, which carries no pickle); ``timeout`` is not supported."""
    if not isinstance(method, str):
        raise TypeError(
            f"collective_rpc takes the name of a worker method, got {type(method).__name__} "
            "(the rings carry no pickled callables)"
        )
    if timeout is not None:
        raise ValueError("collective_rpc(timeout=...) is not supported: the call waits for the worker")
    return method, list(args), dict(kwargs or {})
