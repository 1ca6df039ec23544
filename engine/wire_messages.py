"""Messages between the frontend and the EngineCore.

Everything here crosses a process boundary (the shm ring or the zmq baseline), so
each type is a msgspec Struct, array_like (positional, no field names on the wire)
and omit_defaults (a decode step sends only what changed). Nothing is pickled.
The transport puts one byte of message kind in front (``MessageKind``, ``MESSAGE_TYPES``).
Imported by both processes; what the HTTP server sends and receives is
``engine.entrypoints.openai.http_bodies``.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

import msgspec

from engine.lora.request import LoRARequest
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a request ended; ``str()`` gives the OpenAI/vLLM spelling."""

    STOP = 0  # eos, stop token id or (in the frontend) stop string
    LENGTH = 1  # max_tokens or max_model_len reached
    ABORT = 2  # aborted by the client, or failed
    ERROR = 3  # refused inside the core, or its step failed (EngineCoreOutput.internal_error)

    def __str__(self) -> str:
        return ("stop", "length", "abort", "error")[self.value]


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: Optional[int] = None
    arrival_time: float = 0.0
    priority: int = 0
    # A pooling request (runner="pooling"): prefill only, one output with ``pooled``, no sampling.
    pooling_params: Optional[PoolingParams] = None
    # Enters the digest of the first prefix-cache block: requests with different salts share no
    # cached KV (vLLM's cache_salt, for tenants who must not read each other's prefixes).
    cache_salt: Optional[str] = None
    # vLLM's LoRARequest (engine/lora/request.py): the adapter this request runs with; None: the base.
    lora_request: Optional[LoRARequest] = None


class LogprobsLists(msgspec.Struct, array_like=True):
    """Logprobs of K positions. Row i: the chosen token first, then the top-N.

    For sample logprobs the chosen token is the sampled one; for prompt logprobs
    it is the actual next prompt token. ``ranks[i]`` is the chosen token's rank
    (1 = most likely) in the full distribution.
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


class EngineCoreEventType(enum.IntEnum):
    """vLLM's request events that the core timestamps (the values are vLLM's)."""

    QUEUED = 1  # the core took the request
    SCHEDULED = 2  # the scheduler moved it from waiting to running (again after a preemption)


class EngineCoreEvent(msgspec.Struct, array_like=True):
    """When a request reached a state in the core (``time.monotonic()``: one clock with the
    frontend's on a host). Queue, prefill and inference times are measured from these."""

    type: EngineCoreEventType
    timestamp: float


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: Optional[LogprobsLists] = None
    new_prompt_logprobs: Optional[LogprobsLists] = None
    finish_reason: Optional[FinishReason] = None
    stop_reason: Optional[int] = None  # the stop token id that ended the request
    num_cached_tokens: int = 0
    error: Optional[str] = None  # set with FinishReason.ERROR: why the core refused it
    # With FinishReason.ERROR: the step that ran the request raised, so the engine is at fault,
    # not the request (HTTP 500, where a refusal is a 400); ``error`` names no path or traceback.
    internal_error: bool = False
    # A pooling request's vector: little-endian float32 bytes (finished with FinishReason.STOP).
    pooled: Optional[bytes] = None
    # The request's events since its previous output (vLLM's ``events``): only on the outputs
    # that follow an event, so a decode step's outputs carry none.
    events: Optional[list[EngineCoreEvent]] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, array_like=True, omit_defaults=True):
    """One core's state after a step (the gauges) and what the step counted (the counters), as
    vLLM's: the frontend's stat loggers (AsyncLLM's output handler) read it from each outputs
    message, so /metrics never asks the core."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    prefix_cache_queries: int = 0  # counter: prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # counter: of which found
    num_preempted_reqs: int = 0  # counter
    # Counters of speculative decoding (engine/spec_decode/): requests that ran drafts, draft
    # tokens verified, of which accepted.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = []  # [k]: drafts whose token at position j was accepted
    # With LoRA (gauges, vLLM's): adapter name -> its running / waiting requests.
    running_lora_adapters: dict[str, int] = {}
    waiting_lora_adapters: dict[str, int] = {}

    def add_counters(self, earlier: "SchedulerStats") -> None:
        """Fold in an earlier step's counters (this step's gauges are the newer ones)."""
        self.prefix_cache_queries += earlier.prefix_cache_queries
        self.prefix_cache_hits += earlier.prefix_cache_hits
        self.num_preempted_reqs += earlier.num_preempted_reqs
        self.spec_decode_num_drafts += earlier.spec_decode_num_drafts
        self.spec_decode_num_draft_tokens += earlier.spec_decode_num_draft_tokens
        self.spec_decode_num_accepted_tokens += earlier.spec_decode_num_accepted_tokens
        self.spec_decode_num_accepted_tokens_per_pos = add_lists(
            self.spec_decode_num_accepted_tokens_per_pos, earlier.spec_decode_num_accepted_tokens_per_pos
        )


def add_lists(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum, as long as the longer list (a missing entry counts 0)."""
    if len(a) < len(b):
        a, b = b, a
    return [x + (b[i] if i < len(b) else 0) for i, x in enumerate(a)]


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    timestamp: float = 0.0  # time.monotonic() when published (transport latency metric)
    scheduler_stats: Optional[SchedulerStats] = None  # None with disable_log_stats


class UtilityResult(msgspec.Struct, array_like=True, omit_defaults=True):
    call_id: int
    result: Any = None
    error: Optional[str] = None


# --- Control messages of the EngineCore process (ADD is EngineCoreRequest, OUTPUTS is
# EngineCoreOutputs, UTILITY_RESULT is UtilityResult). ---


class AbortRequests(msgspec.Struct, array_like=True):
    request_ids: list[str]


class UtilityCall(msgspec.Struct, array_like=True, omit_defaults=True):
    """Call an allow-listed EngineCore method; answered by a UtilityResult with the same call_id."""

    call_id: int
    method: str
    args: list[Any] = []


class Shutdown(msgspec.Struct, array_like=True):
    """Finish the busy loop and exit cleanly."""


class EngineReady(msgspec.Struct, array_like=True, omit_defaults=True):
    """The core's handshake, sent once the model is loaded and the KV cache allocated."""

    engine_index: int
    pid: int
    num_kv_blocks: int
    # the digest of the EngineConfig the core runs, checked by the frontend (engine/core/launch.py)
    config_digest: str


class EngineDead(msgspec.Struct, array_like=True, omit_defaults=True):
    """The core failed (at start-up or in its loop) and is exiting; ``error`` carries the cause."""

    error: str
    engine_index: int = 0


class MessageKind(enum.IntEnum):
    """The kind byte of each message on the wire. The values are the protocol: never renumber
    or reuse one; a new message takes a new value."""

    ENGINE_CORE_REQUEST = 0
    ABORT_REQUESTS = 1
    UTILITY_CALL = 2
    SHUTDOWN = 3
    ENGINE_READY = 4
    ENGINE_CORE_OUTPUTS = 5
    UTILITY_RESULT = 6
    ENGINE_DEAD = 7


# kind byte -> message type: what both sides build their codec from (shm_transport.MsgspecCodec).
MESSAGE_TYPES = {
    MessageKind.ENGINE_CORE_REQUEST: EngineCoreRequest,
    MessageKind.ABORT_REQUESTS: AbortRequests,
    MessageKind.UTILITY_CALL: UtilityCall,
    MessageKind.SHUTDOWN: Shutdown,
    MessageKind.ENGINE_READY: EngineReady,
    MessageKind.ENGINE_CORE_OUTPUTS: EngineCoreOutputs,
    MessageKind.UTILITY_RESULT: UtilityResult,
    MessageKind.ENGINE_DEAD: EngineDead,
}


def _merge_output(into: EngineCoreOutput, new: EngineCoreOutput) -> None:
    into.new_token_ids.extend(new.new_token_ids)
    for name in ("new_logprobs", "new_prompt_logprobs"):
        a, b = getattr(into, name), getattr(new, name)
        if a is None:
            setattr(into, name, b)
        elif b is not None:
            setattr(into, name, LogprobsLists(a.token_ids + b.token_ids, a.logprobs + b.logprobs, a.ranks + b.ranks))
    into.finish_reason, into.stop_reason = new.finish_reason, new.stop_reason
    into.error, into.internal_error = new.error, new.internal_error
    if new.events:
        into.events = (into.events or []) + new.events


def merge_outputs(into: EngineCoreOutputs, new: EngineCoreOutputs) -> None:
    """Fold a later outputs message into one not yet handed on: one entry per request. The core
    merges what a full ring holds back (so what it holds stays bounded by the number of live
    requests), the async client what has arrived before it is processed."""
    index = {o.request_id: o for o in into.outputs}
    for out in new.outputs:
        held = index.get(out.request_id)
        if held is None or held.finished:
            into.outputs.append(out)
            index[out.request_id] = out
        else:
            _merge_output(held, out)
    if new.scheduler_stats is not None and into.scheduler_stats is not None:
        new.scheduler_stats.add_counters(into.scheduler_stats)
    into.scheduler_stats = new.scheduler_stats or into.scheduler_stats
