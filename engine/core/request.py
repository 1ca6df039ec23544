"""A request as the EngineCore sees it: token ids, progress, blocks, status.

Ownership: the scheduler is the only writer of every field here except that the
model runner may read anything and keep its own per-request caches keyed by
``request_id`` (dropped when the id shows up in ``SchedulerOutput.finished_req_ids``).
"""

from __future__ import annotations

import enum
import time
from typing import Optional

from engine.lora.request import LoRARequest
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams
from engine.wire_messages import EngineCoreRequest, FinishReason


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # back in the waiting queue; its KV blocks were freed (recompute)
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> Optional[FinishReason]:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "sampling_params",
        "eos_token_id",
        "arrival_time",
        "priority",
        "output_token_ids",
        "all_token_ids",
        "num_computed_tokens",
        "status",
        "block_ids",
        "block_hashes",
        "num_cached_tokens",
        "stop_reason",
        "num_preemptions",
        "num_prompt_logprobs_sent",
        "_max_tokens",
        "pooling_params",
        "structured_output",
        "cache_salt",
        "events",
        "spec_token_ids",
        "spec_state",
        "lora_request",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: Optional[int] = None,
        arrival_time: Optional[float] = None,
        priority: int = 0,
        max_model_len: Optional[int] = None,
        pooling_params: Optional[PoolingParams] = None,
        cache_salt: Optional[str] = None,
        lora_request: Optional[LoRARequest] = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.output_token_ids: list[int] = []
        # prompt + output, appended in place: the runner slices it for the tokens to compute.
        self.all_token_ids: list[int] = list(prompt_token_ids)
        # Tokens whose KV is in the cache. Advanced by the scheduler after each step, so
        # during ``execute_model`` it is the position of the first scheduled token.
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []  # the block table, in position order
        # Prefix-cache digests of the full blocks of all_token_ids (see kv_cache.py), filled lazily.
        self.block_hashes: list[bytes] = []
        # Prompt tokens not computed at first scheduling (prefix-cache hits and KV loaded by a
        # connector); -1 = not yet scheduled.
        self.num_cached_tokens = -1
        self.stop_reason: Optional[int] = None
        self.num_preemptions = 0
        # Prompt-logprob rows already sent: a preempted request recomputes its prompt, and
        # those rows must not be sent twice.
        self.num_prompt_logprobs_sent = 0
        limit = sampling_params.max_tokens
        if max_model_len is not None:
            room = max_model_len - len(self.prompt_token_ids)
            limit = room if limit is None else min(limit, room)
        self._max_tokens = limit
        # Set for a pooling request: it finishes once its prompt is computed, with the pooled vector.
        self.pooling_params = pooling_params
        # With sampling_params.structured_outputs: its grammar (engine/structured_output/manager.py
        # GrammarState), set by the scheduler when the request is added.
        self.structured_output = None
        self.cache_salt = cache_salt  # mixed into the first block's digest (kv_cache.block_hashes)
        self.lora_request = lora_request  # its adapter (also in the first block's digest); None: the base
        # EngineCoreEvents not yet sent (the scheduler records them; its next output carries them).
        self.events: Optional[list] = None
        # Speculative decoding (engine/spec_decode/): the draft tokens scheduled this step after the
        # last known token (set by the scheduler, verified by the runner, empty otherwise), and the
        # request's acceptance record that shortens or pauses its drafts (None until it drafts).
        self.spec_token_ids: list[int] = []
        self.spec_state = None

    @classmethod
    def from_engine_core_request(cls, req: EngineCoreRequest, max_model_len: Optional[int] = None) -> "Request":
        return cls(
            req.request_id,
            req.prompt_token_ids,
            req.sampling_params,
            req.eos_token_id,
            req.arrival_time or None,
            req.priority,
            max_model_len,
            req.pooling_params,
            req.cache_salt,
            req.lora_request,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> Optional[int]:
        """Output tokens allowed: max_tokens capped by what fits in max_model_len."""
        return self._max_tokens

    def append_output_token(self, token: int) -> None:
        """The one way a sampled token joins the request: output and all-token lists stay in step."""
        self.output_token_ids.append(token)
        self.all_token_ids.append(token)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
