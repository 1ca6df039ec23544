"""What AsyncLLM's output handler hands its stat loggers, in vLLM's shape (vllm/v1/metrics).

Once per outputs message from a core (not per token): that core's ``SchedulerStats`` (its
gauges after the step and the step's counters, from engine/wire_messages.py) and an
``IterationStats`` the output processor filled while it turned the message into
RequestOutputs, with the message's ``engine_index``. A logger's ``record`` runs on the event
loop between two messages, so it must be cheap: add numbers, append to lists; never block.
The server's Prometheus metrics (engine/entrypoints/openai/metrics.py) are one such logger.

Timings follow vLLM's definitions, on one monotonic clock (the core's events and the
frontend's observations are comparable on one host):

- queue time: QUEUED (the core took the request) to its first SCHEDULED;
- prefill time: first SCHEDULED to the first token reaching the frontend;
- decode time: first token to last token; inference time: first SCHEDULED to last token;
- time to first token and end-to-end latency: from the request's arrival in the frontend;
- inter-token latency: per request and message, the time since that request's previous tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Optional

from engine.outputs import RequestStateStats
from engine.wire_messages import SchedulerStats


@dataclass(slots=True)
class FinishedRequestStats:
    """One finished (child) request, as vLLM's: every request counts, with its finish reason."""

    finish_reason: str  # "stop" | "length" | "abort" | "error"
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: Optional[int] = None
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    decode_time: float = 0.0
    mean_time_per_output_token: float = 0.0

    @classmethod
    def of(
        cls, stats: RequestStateStats, finish_reason: str, num_prompt_tokens: int, max_tokens: Optional[int], now: float
    ) -> "FinishedRequestStats":
        first, last, scheduled = stats.first_token_ts, stats.last_token_ts, stats.scheduled_ts
        queued = scheduled - stats.queued_ts if scheduled and stats.queued_ts else 0.0
        prefill = first - scheduled if first and scheduled else 0.0
        decode = last - first if first else 0.0
        inference = last - scheduled if last and scheduled else 0.0
        n = stats.num_generation_tokens
        return cls(
            finish_reason,
            now - stats.arrival_time,
            num_prompt_tokens,
            n,
            max_tokens,
            queued,
            prefill,
            inference,
            decode,
            decode / (n - 1) if n > 1 else 0.0,
        )


@dataclass(slots=True)
class IterationStats:
    """What one outputs message changed, seen from the frontend (vLLM's IterationStats)."""

    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0  # prompts of the requests whose first token came in this message
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    n_params_iter: list[int] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    # ringllm: the core publishing this message to the output handler taking it (the ring's latency).
    transport_latency: Optional[float] = None


class StatLoggerBase(ABC):
    """vLLM's interface for metrics: ``record`` gets each message's stats (either may be None:
    no scheduler stats with ``disable_log_stats``), ``engine_idx`` the data-parallel rank."""

    @abstractmethod
    def record(
        self, scheduler_stats: Optional[SchedulerStats], iteration_stats: Optional[IterationStats], engine_idx: int = 0
    ) -> None: ...

    def log_engine_initialized(self) -> None:  # vLLM's hook; nothing to log by default
        pass

    def log(self) -> None:
        pass


# vLLM's StatLoggerFactory: (config, engine index) -> logger; AsyncLLM builds one per rank.
StatLoggerFactory = Callable[..., StatLoggerBase]
