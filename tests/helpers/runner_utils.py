"""Drive a ModelRunner by hand (no scheduler): trivial block allocation, optional
chunked prefill, greedy or sampled steps. For the model, loader and sampler tests."""

from __future__ import annotations

from typing import Optional

from engine.config import EngineArgs
from engine.core.request import Request
from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner


def make_runner(model: str, **kwargs) -> ModelRunner:
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("num_threads", 1)
    kwargs.setdefault("kv_cache_memory", 16 << 20)
    runner = ModelRunner(EngineArgs(model=model, **kwargs).create_engine_config())
    runner.num_blocks = runner.initialize_kv_cache()
    runner.next_block = 1  # block 0 is left unused so padding never aliases a live block
    return runner


def make_request(req_id: str, prompt: list[int], **params) -> Request:
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 16)
    return Request(req_id, prompt, SamplingParams(**params), eos_token_id=2)


def step(
    runner: ModelRunner, reqs: list[Request], chunk: Optional[int] = None, finished: frozenset[str] = frozenset()
) -> ModelRunnerOutput:
    """Schedule every request (at most ``chunk`` tokens each), run, and apply the result."""
    so = SchedulerOutput(finished_req_ids=set(finished))
    bs = runner.block_size
    for r in reqs:
        n = r.num_tokens - r.num_computed_tokens
        n = n if chunk is None else min(n, chunk)
        while len(r.block_ids) * bs < r.num_computed_tokens + n:
            r.block_ids.append(runner.next_block)
            runner.next_block += 1
        so.requests.append(r)
        so.num_scheduled_tokens.append(n)
    so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens)
    out = runner.execute_model(so)
    sampled = dict(zip(out.req_ids, out.sampled_token_ids))
    for r, n in zip(so.requests, so.num_scheduled_tokens):
        r.num_computed_tokens += n
        if r.request_id in sampled:
            r.append_output_token(sampled[r.request_id])
    return out


def generate(
    runner: ModelRunner, reqs: list[Request], num_tokens: int, chunk: Optional[int] = None
) -> list[ModelRunnerOutput]:
    """Step until every request has ``num_tokens`` outputs; returns each step's output."""
    outs = []
    while any(r.num_output_tokens < num_tokens for r in reqs):
        outs.append(step(runner, [r for r in reqs if r.num_output_tokens < num_tokens], chunk))
    return outs


def preempt(runner: ModelRunner, req: Request) -> None:
    """What the scheduler does on preemption: forget the KV; the next step recomputes from scratch."""
    req.num_computed_tokens = 0
    req.block_ids = []
    step(runner, [], finished=frozenset({req.request_id}))
