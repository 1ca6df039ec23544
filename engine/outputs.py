"""What ``LLM.generate`` and ``AsyncLLM.generate`` hand back, with vLLM's names and fields.

``Logprob``/``SampleLogprobs``/``PromptLogprobs`` follow vLLM: one dict per position, keyed by
token id, the chosen token first, then the top-N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Optional, TypeVar, Union

from engine.wire_messages import EngineCoreEventType

if TYPE_CHECKING:
    import torch


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
    """Timings of one request (time.monotonic() seconds), vLLM's fields: arrival and tokens as
    the frontend saw them, queued and (first) scheduled as the core's events say."""

    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    num_generation_tokens: int = 0

    def update_from_events(self, events) -> None:
        """The core's EngineCoreEvents (engine/wire_messages.py): the first SCHEDULED counts, so a
        preempted request's queue time is its first wait."""
        for event in events:
            if event.type == EngineCoreEventType.QUEUED:
                self.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED and not self.scheduled_ts:
                self.scheduled_ts = event.timestamp

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


@dataclass(slots=True)
class PoolingOutput:
    """The pooled vector of one prompt (vLLM's name): a float32 tensor of hidden_size values."""

    data: torch.Tensor


_O = TypeVar("_O")


@dataclass(slots=True)
class PoolingRequestOutput(Generic[_O]):
    """What ``LLM.encode`` and ``AsyncLLM.encode`` hand back: one per prompt, made once the
    whole prompt is computed (``finished`` is always True), with vLLM's fields."""

    request_id: str
    outputs: _O
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True
    # ringllm, as on RequestOutput: why the engine refused or failed the request; None otherwise.
    error: Optional[str] = None
    internal_error: bool = False


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> "EmbeddingOutput":
        data = pooling_output.data
        if data.dim() != 1:
            raise ValueError(f"an embedding is one vector; the pooled output has shape {tuple(data.shape)}")
        return EmbeddingOutput(data.tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True)
class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    """What ``LLM.embed`` hands back: ``outputs.embedding`` is a list of floats."""

    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return EmbeddingRequestOutput(
            request_output.request_id,
            EmbeddingOutput.from_base(request_output.outputs),
            request_output.prompt_token_ids,
            request_output.num_cached_tokens,
            request_output.finished,
            request_output.error,
            request_output.internal_error,
        )


@dataclass(slots=True)
class ClassificationOutput:
    """vLLM's: a classification model's probabilities over its labels (the raw logits when the
    request's ``use_activation`` is False)."""

    probs: list[float]

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> "ClassificationOutput":
        return ClassificationOutput(pooling_output.data.tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass(slots=True)
class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    """What ``LLM.classify`` hands back: ``outputs.probs`` is a list of floats."""

    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> "ClassificationRequestOutput":
        return ClassificationRequestOutput(
            request_output.request_id,
            ClassificationOutput.from_base(request_output.outputs),
            request_output.prompt_token_ids,
            request_output.num_cached_tokens,
            request_output.finished,
            request_output.error,
            request_output.internal_error,
        )


@dataclass(slots=True)
class ScoringOutput:
    """vLLM's: the score of one pair (the cosine of two embeddings, or a cross-encoder's score)."""

    score: float


@dataclass(slots=True)
class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    """What ``LLM.score`` hands back: ``outputs.score`` is a float."""
