"""LLM: offline batched generation, with vLLM's public API.

``LLM(model, **engine_args).generate(prompts, sampling_params)`` queues every prompt, drives
the engine until all are done and returns the outputs in input order. Prompts are validated
before anything is queued, so one bad prompt raises (naming the problem) without leaving
work behind, and an interrupted ``generate`` (Ctrl-C) aborts what it queued.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Optional, Sequence, Union

import msgspec
from tqdm.auto import tqdm

from engine.config import DEFAULT_MODEL, EngineArgs, non_default_args
from engine.frontend.input_processor import ChatMessage, PromptType
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        engine_args = EngineArgs(model=model, **kwargs)
        self._init(engine_args)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLM":
        llm = cls.__new__(cls)
        llm._init(engine_args)
        return llm

    def _init(self, engine_args: EngineArgs) -> None:
        logger.info("Non-default args: %s", non_default_args(engine_args))
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self._counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        return self.llm_engine.input_processor.default_sampling_params()

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None, *,
                 use_tqdm: bool = True, priority: Optional[list[int]] = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. ``prompts``: a str, a token-id list, a
        ``{"prompt": ...}``/``{"prompt_token_ids": [...]}`` dict, or a list of these;
        ``sampling_params``: one for all prompts or a list of the same length."""
        prompt_list = self._as_list(prompts)
        return self._run(prompt_list, sampling_params, use_tqdm, priority, add_special_tokens=True)

    def chat(self, messages: Union[list[ChatMessage], list[list[ChatMessage]]],
             sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None, *,
             use_tqdm: bool = True, chat_template: Optional[str] = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: Optional[list[dict]] = None,
             chat_template_kwargs: Optional[dict[str, Any]] = None) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} messages) or to a
        list of conversations, rendered with the tokenizer's chat template."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of messages or of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        render = self.llm_engine.input_processor.render_chat
        prompts = [render(conv, chat_template, add_generation_prompt, continue_final_message, tools,
                          chat_template_kwargs) for conv in conversations]
        # The template already wrote any special tokens (a BOS) the model expects.
        return self._run(prompts, sampling_params, use_tqdm, None, add_special_tokens=False)

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    @staticmethod
    def _as_list(prompts: Any) -> list:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if isinstance(prompts, (list, tuple)):
            if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
                return [list(prompts)]  # one prompt given as token ids
            return list(prompts)
        raise TypeError(f"prompts must be a str, a dict, a list of token ids or a list of prompts, "
                        f"got {type(prompts).__name__}")

    def _params_list(self, params: Any, n: int) -> list[SamplingParams]:
        if params is None:
            params = self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * n
        elif not isinstance(params, (list, tuple)) or len(params) != n:
            raise ValueError(f"sampling_params must be one SamplingParams or a list of {n} (one per prompt)")
        # Only the final output is wanted; a copy, so the caller's object is left as it was.
        return [p if p.output_kind == RequestOutputKind.FINAL_ONLY else
                msgspec.structs.replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in params]

    def _run(self, prompts: list, sampling_params: Any, use_tqdm: bool, priority: Optional[list[int]],
             add_special_tokens: bool) -> list[RequestOutput]:
        params = self._params_list(sampling_params, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority must have one entry per prompt ({len(prompts)}), got {len(priority)}")
        engine = self.llm_engine
        request_ids: list[str] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = str(next(self._counter))
                engine.add_request(request_id, prompt, p, priority=priority[i] if priority else 0,
                                   add_special_tokens=add_special_tokens)
                request_ids.append(request_id)
            finished = self._run_engine(len(request_ids), use_tqdm)
        except BaseException:  # a bad prompt, Ctrl-C, an engine error: leave nothing queued
            engine.abort_request(request_ids)
            raise
        return [finished[request_id] for request_id in request_ids]

    def _run_engine(self, total: int, use_tqdm: bool) -> dict[str, RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        in_tokens = out_tokens = 0
        with bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if not output.finished:
                        continue
                    finished[output.request_id] = output
                    if use_tqdm:
                        in_tokens += len(output.prompt_token_ids or ())
                        out_tokens += sum(len(c.token_ids) for c in output.outputs)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(f"est. speed input: {in_tokens / elapsed:.2f} toks/s, "
                                            f"output: {out_tokens / elapsed:.2f} toks/s", refresh=False)
                        bar.update(1)
        return finished
