"""Factories for scheduler and KV-cache unit tests (plain CPU objects, no model), in the
manner of vLLM's tests/v1/core/utils.py."""

from __future__ import annotations

from typing import Callable, Optional

from engine.config import SchedulerConfig
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.sampling_params import SamplingParams
from engine.wire_messages import EngineCoreOutput

EOS = 2


def make_scheduler(
    *,
    num_blocks: int = 1000,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    enable_chunked_prefill: bool = True,
    enable_prefix_caching: bool = True,
    policy: str = "fcfs",
    max_model_len: int = 8192,
    speculative_config: Optional[dict] = None,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        policy=policy,
    )
    kv_cache = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
    drafts = None
    if speculative_config is not None:
        from engine.spec_decode.config import resolve_speculative_config
        from engine.spec_decode.drafts import DraftScheduler

        drafts = DraftScheduler(resolve_speculative_config(speculative_config), kv_cache, max_model_len)
    return Scheduler(config, kv_cache, max_model_len, speculative=drafts)


def make_request(
    request_id: str,
    prompt: list[int],
    max_model_len: Optional[int] = 8192,
    priority: int = 0,
    arrival_time: Optional[float] = None,
    **params,
) -> Request:
    params.setdefault("max_tokens", 16)
    return Request(
        request_id,
        prompt,
        SamplingParams(**params),
        eos_token_id=EOS,
        arrival_time=arrival_time,
        priority=priority,
        max_model_len=max_model_len,
    )


def make_requests(num: int, prompt_len: int, *, distinct: bool = True, **params) -> list[Request]:
    """``num`` requests of ``prompt_len`` tokens; distinct prompts share no full block."""
    return [
        make_request(
            str(i),
            [100 + (i * prompt_len + j if distinct else j) for j in range(prompt_len)],
            arrival_time=float(i),
            **params,
        )
        for i in range(num)
    ]


def fake_runner_output(sched: SchedulerOutput, token_fn: Callable[[Request], int] = lambda r: 7) -> ModelRunnerOutput:
    """What a runner returns: one token for every request whose scheduled tokens reach its end."""
    out = ModelRunnerOutput()
    for req, n in zip(sched.requests, sched.num_scheduled_tokens):
        if req.num_computed_tokens + n == req.num_tokens:
            out.req_ids.append(req.request_id)
            out.sampled_token_ids.append(token_fn(req))
    return out


def step(
    scheduler: Scheduler, token_fn: Callable[[Request], int] = lambda r: 7
) -> tuple[SchedulerOutput, list[EngineCoreOutput]]:
    sched = scheduler.schedule()
    return sched, scheduler.update_from_output(sched, fake_runner_output(sched, token_fn))


def run_to_completion(
    scheduler: Scheduler, token_fn: Callable[[Request], int] = lambda r: 7, max_steps: int = 10_000
) -> dict[str, list[int]]:
    """Step until nothing is left; returns every request's generated tokens."""
    generated: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return generated
        _, outputs = step(scheduler, token_fn)
        for out in outputs:
            generated.setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("scheduler did not finish")
