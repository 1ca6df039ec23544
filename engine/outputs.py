"""What ``LLM.generate`` and ``AsyncLLM.generate`` hand back, with vLLM's names and fields.

``Logprob``/``SampleLogprobs``/``PromptLogprobs`` follow vLLM: one dict per position, keyed by
token id, the chosen token first, then the top-N.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: Optional[int] = None  # 1 = most likely
    decoded_token: Optional[str] = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[Optional[dict[int, Logprob]]]  # position 0 has no logprob: None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | "error"
    stop_reason: Union[int, str, None] = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestStateStats:
    """Frontend-side timings of one request (time.monotonic() seconds)."""

    arrival_time: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    num_generation_tokens: int = 0

    @property
    def first_token_latency(self) -> float:
        return self.first_token_ts - self.arrival_time if self.first_token_ts else 0.0


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list[int]]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Optional[RequestStateStats] = None
    num_cached_tokens: Optional[int] = None  # prompt tokens not computed: prefix cache or KV connector
    # ringllm: why the engine refused the request (finish_reason "error"); None otherwise.
    error: Optional[str] = None
    # ringllm: with error set, the engine failed running the request (its fault, not a refusal).
    internal_error: bool = False
