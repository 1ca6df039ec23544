"""Turns the core's token ids into ``RequestOutput``s: text, stop strings, logprobs, output kinds.

The frontend's one place that reads ``EngineCoreOutputs`` (vLLM's ``process_outputs``: "the only
function that should loop over EngineCoreOutputs"): ``fold`` merges the messages that have
arrived, ``process_outputs`` turns each entry into a RequestOutput. The clients only hand the
messages on, and AsyncLLM's collectors only fold RequestOutputs a consumer has not taken yet.

Per request it keeps a ``RequestState``. A request with ``n > 1`` is sent to the core as n
independent child requests (``ParentRequest``) whose outputs are merged back under the
parent's id. A stop string is found here, not in the core: the request is then finished
at once and its id returned in ``reqs_to_abort`` so the caller stops it in the core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

import msgspec

from engine.frontend.detokenizer import ByteLevelTable, IncrementalDetokenizer, make_detokenizer
from engine.frontend.logprobs import LogprobsProcessor, TokenDecoder
from engine.outputs import CompletionOutput, PoolingOutput, PoolingRequestOutput, RequestOutput, RequestStateStats
from engine.sampling_params import RequestOutputKind, SamplingParams, verified_copy
from engine.stat_loggers import FinishedRequestStats, IterationStats
from engine.wire_messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason, merge_outputs


def _pooling_output(state: "RequestState", out: EngineCoreOutput) -> PoolingRequestOutput:
    """A pooling request's one output: the core's float32 bytes as vLLM's tensor."""
    import torch

    data = torch.frombuffer(bytearray(out.pooled), dtype=torch.float32)
    return PoolingRequestOutput(
        state.output_id, PoolingOutput(data), state.prompt_token_ids, out.num_cached_tokens, True
    )


class ParentRequest:
    """Fans a request with ``n > 1`` out into n children and merges their outputs."""

    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id = request_id
        self.params = params
        self.unfinished: set[str] = set()
        self.final: list[Optional[CompletionOutput]] = [None] * params.n

    def child(self, index: int) -> tuple[str, SamplingParams]:
        """Child ``index``'s id and params (n=1; a seed is offset so the children differ): a
        copy of the parent's verified params, not verified again (the frontend checked that
        every child's seed fits)."""
        child_id = f"{index}_{self.request_id}"
        seed = self.params.seed
        params = verified_copy(self.params, n=1, seed=None if seed is None else seed + index)
        self.unfinished.add(child_id)
        return child_id, params

    def merge(self, child_id: str, completion: CompletionOutput) -> tuple[list[CompletionOutput], bool]:
        """The completions to show now, and whether the parent is finished. Streaming kinds
        pass each child's output through; FINAL_ONLY waits for all n."""
        if completion.finished():
            self.unfinished.discard(child_id)
        finished = not self.unfinished
        if self.params.output_kind != RequestOutputKind.FINAL_ONLY:
            return [completion], finished
        self.final[completion.index] = completion
        return (self.final if finished else []), finished


def fan_out(request: EngineCoreRequest) -> list[tuple[EngineCoreRequest, Optional[ParentRequest], int]]:
    """The engine requests behind one user request, each with its parent and index: the request
    itself, or with ``n > 1`` one child per sample (the core runs n = 1 only). A pooling request
    carries n = 1."""
    if request.sampling_params.n == 1:
        return [(request, None, 0)]
    parent = ParentRequest(request.request_id, request.sampling_params)
    children = []
    for index in range(request.sampling_params.n):
        child_id, child_params = parent.child(index)
        children.append(
            (msgspec.structs.replace(request, request_id=child_id, sampling_params=child_params), parent, index)
        )
    return children


class RequestState:
    """What the frontend keeps of one (child) request while the core runs it."""

    __slots__ = (
        "request_id",
        "output_id",
        "prompt",
        "prompt_token_ids",
        "output_kind",
        "delta",
        "final_only",
        "parent",
        "index",
        "detokenizer",
        "logprobs",
        "token_ids",
        "stats",
        "num_cached_tokens",
        "queue",
        "max_tokens",
    )

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: Optional[str],
        detokenizer,
        decode: TokenDecoder,
        parent: Optional[ParentRequest],
        index: int,
        output_id: Optional[str] = None,
        queue=None,
    ) -> None:
        params = request.sampling_params
        self.request_id = request.request_id
        # The id its RequestOutputs carry: the caller's (the core knows the request by request_id).
        self.output_id = output_id or (parent.request_id if parent is not None else request.request_id)
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = params.output_kind
        self.delta = params.output_kind == RequestOutputKind.DELTA
        self.final_only = params.output_kind == RequestOutputKind.FINAL_ONLY
        self.parent = parent
        self.index = index
        self.detokenizer: Optional[IncrementalDetokenizer] = detokenizer
        self.logprobs = (
            LogprobsProcessor(decode, params.logprobs, params.prompt_logprobs)
            if params.logprobs is not None or params.prompt_logprobs is not None
            else None
        )
        self.token_ids: list[int] = []  # all output ids so far (DELTA: not kept, its outputs carry the new ones)
        self.stats = RequestStateStats(arrival_time=request.arrival_time)
        self.num_cached_tokens = 0
        self.queue = queue  # AsyncLLM: the request's collector, which takes each output at once
        self.max_tokens = getattr(params, "max_tokens", None)  # for the metrics (vLLM's max_tokens_param)

    def finished_stats(self, finish_reason: FinishReason, now: float) -> FinishedRequestStats:
        return FinishedRequestStats.of(self.stats, str(finish_reason), len(self.prompt_token_ids), self.max_tokens, now)

    def make_request_output(
        self,
        new_token_ids: list[int],
        finish_reason: Optional[FinishReason],
        stop_reason,
        error: Optional[str],
        internal_error: bool = False,
    ) -> Optional[RequestOutput]:
        finished = finish_reason is not None
        if not finished and (not new_token_ids or self.final_only):
            return None
        delta = self.delta
        detokenizer = self.detokenizer
        text = detokenizer.get_next_output_text(finished, delta) if detokenizer is not None else ""
        token_ids = new_token_ids if delta else self.token_ids.copy()
        reason = str(finish_reason) if finished else None
        logprobs = self.logprobs
        if logprobs is None:  # the common case
            completion = CompletionOutput(self.index, text, token_ids, None, None, reason, stop_reason)
            prompt_logprobs = None
        else:
            sample, cumulative = logprobs.logprobs, None
            if sample is not None:
                sample = sample[len(sample) - len(new_token_ids) :] if delta else sample.copy()
                cumulative = logprobs.cumulative_logprob
            completion = CompletionOutput(self.index, text, token_ids, cumulative, sample, reason, stop_reason)
            prompt_logprobs = logprobs.prompt_logprobs_for_output(delta)
        outputs = [completion]
        if self.parent is not None:
            outputs, finished = self.parent.merge(self.request_id, completion)
            if not outputs:
                return None
        return RequestOutput(
            self.output_id,
            self.prompt,
            self.prompt_token_ids,
            prompt_logprobs,
            outputs,
            finished,
            self.stats,
            self.num_cached_tokens,
            error,
            internal_error,
        )


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput] = field(default_factory=list)  # of requests without a queue
    reqs_to_abort: list[str] = field(default_factory=list)  # finished here (stop strings): stop them in the core
    finished_queues: list = field(default_factory=list)  # queues whose request got its last output
    finished_by_core: list[str] = field(default_factory=list)  # ids the core finished (for the DP balancer)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer if tokenizer is not None else None
        self._table = ByteLevelTable.build(self._backend) if self._backend is not None else None
        self._decode = TokenDecoder(tokenizer)
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}
        # With stat loggers (AsyncLLM): requests aborted here since the output handler last took them.
        self.log_stats = False
        self.aborted_stats: list[FinishedRequestStats] = []

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: Optional[str],
        parent: Optional[ParentRequest] = None,
        index: int = 0,
        *,
        output_id: Optional[str] = None,
        queue=None,
    ) -> None:
        """Track a request. ``output_id``: the id its outputs carry (default: the parent's id,
        else the request's). ``queue``: an object with ``put(output, core_timestamp)`` that
        takes each output as it is made, instead of ``process_outputs`` returning it."""
        if request.request_id in self.request_states:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.sampling_params
        detokenizer = (
            make_detokenizer(self._backend, self._table, request.prompt_token_ids, params)
            if self._backend is not None and params.detokenize
            else None
        )
        self.request_states[request.request_id] = RequestState(
            request, prompt, detokenizer, self._decode, parent, index, output_id, queue
        )
        if parent is not None:
            self.parent_requests[parent.request_id] = parent

    def add_admitted(self, admission, output_id: str, queue=None) -> None:
        """Track the requests ``InputProcessor.admit`` made of one user request (the request or
        its n children), their outputs carrying ``output_id``; ``queue`` as ``add_request``."""
        for request, parent, index in admission.children:
            self.add_request(request, admission.prompt_text, parent, index, output_id=output_id, queue=queue)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def abort_requests(self, request_ids: Iterable[str]) -> list[str]:
        """Forget these requests (a parent id covers its children); returns the ids to abort in
        the core. A request with a queue gets a last output there, finished with "abort" (as
        vLLM's), so a consumer waiting on it ends instead of waiting forever."""
        core_ids = []
        for req_id in request_ids:
            parent = self.parent_requests.pop(req_id, None)
            for child_id in list(parent.unfinished) if parent is not None else (req_id,):
                state = self.request_states.pop(child_id, None)
                if state is None:
                    continue
                core_ids.append(child_id)
                if self.log_stats:
                    self.aborted_stats.append(state.finished_stats(FinishReason.ABORT, time.monotonic()))
                if state.queue is not None:
                    output = state.make_request_output([], FinishReason.ABORT, None, None)
                    if output is not None:
                        state.queue.put(output)
        return core_ids

    @staticmethod
    def fold(messages: list[EngineCoreOutputs]) -> list[EngineCoreOutputs]:
        """The OUTPUTS messages that have arrived, each run of one core's consecutive messages
        merged into its first (one entry per request, as the core merges what a full ring holds
        back: ``merge_outputs``). When the core steps faster than this process handles its
        outputs, each request's tokens then go through ``process_outputs``, its consumer and its
        SSE write once per batch rather than once per step; they had all arrived, so none goes
        out later for it."""
        folded: list[EngineCoreOutputs] = []
        for outputs in messages:
            if folded and folded[-1].engine_index == outputs.engine_index:
                merge_outputs(folded[-1], outputs)
            else:
                folded.append(outputs)
        return folded

    def process_outputs(
        self,
        outputs: list[EngineCoreOutput],
        engine_core_timestamp: float = 0.0,
        iteration_stats: Optional[IterationStats] = None,
    ) -> OutputProcessorOutput:
        """Turn one batch of core outputs into RequestOutputs: returned, or put into each
        request's queue with ``engine_core_timestamp`` (when the core published them). With
        ``iteration_stats``, what the batch did is added to it (engine/stat_loggers.py)."""
        result = OutputProcessorOutput()
        request_outputs, reqs_to_abort = result.request_outputs, result.reqs_to_abort
        now = time.monotonic()
        states = self.request_states
        itl = iteration_stats.inter_token_latencies_iter.append if iteration_stats is not None else None
        num_new = 0  # tokens in this batch, for iteration_stats
        for out in outputs:
            state = states.get(out.request_id)
            if state is None:  # aborted here while the core was still producing
                continue
            new_ids = out.new_token_ids
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            if out.events is not None:
                state.stats.update_from_events(out.events)
            if new_ids:
                stats = state.stats
                if not stats.first_token_ts:
                    stats.first_token_ts = now
                    state.num_cached_tokens = out.num_cached_tokens
                    if iteration_stats is not None:
                        _first_token(iteration_stats, state, now)
                elif itl is not None:
                    itl(now - stats.last_token_ts)
                stats.last_token_ts = now
                stats.num_generation_tokens += len(new_ids)
                num_new += len(new_ids)
                if not state.delta:  # DELTA outputs carry only the new ids
                    state.token_ids += new_ids
                if state.detokenizer is not None:
                    stop_str = state.detokenizer.update(new_ids, finish_reason == FinishReason.STOP)
                    if stop_str is not None:
                        if finish_reason is None:
                            reqs_to_abort.append(out.request_id)
                        finish_reason, stop_reason = FinishReason.STOP, stop_str
            if state.logprobs is not None:
                state.logprobs.update(out.new_logprobs, out.new_prompt_logprobs)
            request_output = (
                _pooling_output(state, out)
                if out.pooled is not None
                else state.make_request_output(new_ids, finish_reason, stop_reason, out.error, out.internal_error)
            )
            if finish_reason is not None:
                if out.finish_reason is not None:
                    result.finished_by_core.append(out.request_id)
                if iteration_stats is not None:
                    iteration_stats.finished_requests.append(state.finished_stats(finish_reason, now))
                del states[out.request_id]
                parent = state.parent
                if parent is not None and not parent.unfinished:
                    self.parent_requests.pop(parent.request_id, None)
            if request_output is None:
                continue
            queue = state.queue
            if queue is None:
                request_outputs.append(request_output)
            else:
                queue.put(request_output, engine_core_timestamp)
                if request_output.finished:
                    result.finished_queues.append(queue)
        if iteration_stats is not None:
            iteration_stats.num_generation_tokens += num_new
        return result


def _first_token(iteration_stats: IterationStats, state: RequestState, now: float) -> None:
    """A request's first token: its time to first token, its prompt tokens, and (once per
    user request) its ``n``."""
    iteration_stats.time_to_first_tokens_iter.append(now - state.stats.arrival_time)
    iteration_stats.num_prompt_tokens += len(state.prompt_token_ids)
    parent = state.parent
    if parent is None:
        iteration_stats.n_params_iter.append(1)
    elif state.index == 0:
        iteration_stats.n_params_iter.append(parent.params.n)
