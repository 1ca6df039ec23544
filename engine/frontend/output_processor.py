"""Turns the core's token ids into ``RequestOutput``s: text, stop strings, logprobs, output kinds.

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

from engine.frontend.detokenizer import IncrementalDetokenizer
from engine.frontend.logprobs import LogprobsProcessor, TokenDecoder
from engine.outputs import CompletionOutput, RequestOutput, RequestStateStats
from engine.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason
from engine.sampling_params import RequestOutputKind, SamplingParams


class ParentRequest:
    """Fans a request with ``n > 1`` out into n children and merges their outputs."""

    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id = request_id
        self.params = params
        self.unfinished: set[str] = set()
        self.final: list[Optional[CompletionOutput]] = [None] * params.n

    def child(self, index: int) -> tuple[str, SamplingParams]:
        """Child ``index``'s id and params (n=1; a seed is offset so the children differ)."""
        child_id = f"{index}_{self.request_id}"
        seed = self.params.seed
        params = msgspec.structs.replace(self.params, n=1, seed=None if seed is None else seed + index)
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


class RequestState:
    def __init__(self, request: EngineCoreRequest, prompt: Optional[str], detokenizer,
                 decode: TokenDecoder, parent: Optional[ParentRequest], index: int) -> None:
        params = request.sampling_params
        self.request_id = request.request_id
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = params.output_kind
        self.parent = parent
        self.index = index
        self.detokenizer: Optional[IncrementalDetokenizer] = detokenizer
        self.logprobs = (LogprobsProcessor(decode, params.logprobs, params.prompt_logprobs)
                         if params.logprobs is not None or params.prompt_logprobs is not None else None)
        self.token_ids: list[int] = []
        self.stats = RequestStateStats(arrival_time=request.arrival_time)
        self.num_cached_tokens = 0

    def make_request_output(self, new_token_ids: list[int], finish_reason: Optional[FinishReason],
                            stop_reason, error: Optional[str]) -> Optional[RequestOutput]:
        finished = finish_reason is not None
        if not finished and (not new_token_ids or self.output_kind == RequestOutputKind.FINAL_ONLY):
            return None
        delta = self.output_kind == RequestOutputKind.DELTA
        completion = self._completion(new_token_ids, finish_reason, stop_reason, delta)
        request_id, outputs = self.request_id, [completion]
        if self.parent is not None:
            outputs, finished = self.parent.merge(self.request_id, completion)
            if not outputs:
                return None
            request_id = self.parent.request_id
        prompt_logprobs = self.logprobs.prompt_logprobs_for_output(delta) if self.logprobs else None
        return RequestOutput(request_id, self.prompt, self.prompt_token_ids, prompt_logprobs, outputs,
                             finished, self.stats, self.num_cached_tokens, error)

    def _completion(self, new_token_ids: list[int], finish_reason: Optional[FinishReason], stop_reason,
                    delta: bool) -> CompletionOutput:
        finished = finish_reason is not None
        text = self.detokenizer.get_next_output_text(finished, delta) if self.detokenizer else ""
        token_ids = new_token_ids if delta else list(self.token_ids)
        logprobs = cumulative = None
        if self.logprobs is not None and self.logprobs.logprobs is not None:
            all_logprobs = self.logprobs.logprobs
            logprobs = all_logprobs[len(all_logprobs) - len(new_token_ids):] if delta else list(all_logprobs)
            cumulative = self.logprobs.cumulative_logprob
        return CompletionOutput(self.index, text, token_ids, cumulative, logprobs,
                                str(finish_reason) if finished else None, stop_reason)


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_abort: list[str] = field(default_factory=list)  # finished here (stop strings): stop them in the core


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer if tokenizer is not None else None
        self._decode = TokenDecoder(tokenizer)
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}

    def add_request(self, request: EngineCoreRequest, prompt: Optional[str],
                    parent: Optional[ParentRequest] = None, index: int = 0) -> None:
        if request.request_id in self.request_states:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.sampling_params
        detokenizer = (IncrementalDetokenizer(self._backend, request.prompt_token_ids, params)
                       if self._backend is not None and params.detokenize else None)
        self.request_states[request.request_id] = RequestState(request, prompt, detokenizer, self._decode,
                                                               parent, index)
        if parent is not None:
            self.parent_requests[parent.request_id] = parent

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def abort_requests(self, request_ids: Iterable[str]) -> list[str]:
        """Forget these requests (a parent id covers its children); returns the ids to abort in the core."""
        core_ids = []
        for req_id in request_ids:
            parent = self.parent_requests.pop(req_id, None)
            for child_id in (parent.unfinished if parent is not None else (req_id,)):
                if self.request_states.pop(child_id, None) is not None:
                    core_ids.append(child_id)
        return core_ids

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> OutputProcessorOutput:
        result = OutputProcessorOutput()
        now = time.monotonic()
        states = self.request_states
        for out in outputs:
            state = states.get(out.request_id)
            if state is None:  # aborted here while the core was still producing
                continue
            new_ids = out.new_token_ids
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            if new_ids:
                stats = state.stats
                if not stats.first_token_ts:
                    stats.first_token_ts = now
                    state.num_cached_tokens = out.num_cached_tokens
                stats.last_token_ts = now
                stats.num_generation_tokens += len(new_ids)
                state.token_ids.extend(new_ids)
            if state.logprobs is not None:
                state.logprobs.update(out.new_logprobs, out.new_prompt_logprobs)
            if state.detokenizer is not None and new_ids:
                stop_str = state.detokenizer.update(new_ids, finish_reason == FinishReason.STOP)
                if stop_str is not None:
                    if finish_reason is None:
                        result.reqs_to_abort.append(out.request_id)
                    finish_reason, stop_reason = FinishReason.STOP, stop_str
            request_output = state.make_request_output(new_ids, finish_reason, stop_reason, out.error)
            if request_output is not None:
                result.request_outputs.append(request_output)
            if finish_reason is not None:
                del states[out.request_id]
                if state.parent is not None and not state.parent.unfinished:
                    self.parent_requests.pop(state.parent.request_id, None)
        return result
