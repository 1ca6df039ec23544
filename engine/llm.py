"""LLM: offline batched generation, with vLLM's public API.

``LLM(model, **engine_args).generate(prompts, sampling_params)`` queues every prompt, drives
the engine until all are done and returns the outputs in input order. Prompts are validated
before anything is queued, so one bad prompt raises (naming the problem) without leaving
work behind, and an interrupted ``generate`` (Ctrl-C) aborts what it queued.
"""
from __future__ import annotations

import itertools
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import msgspec
from tqdm.auto import tqdm

from engine import envs
from engine.config import DEFAULT_MODEL, CompilationConfig, EngineArgs, non_default_args
from engine.frontend.input_processor import ChatMessage, PromptType
from engine.llm_engine import LLMEngine
from engine.outputs import Logprob, RequestOutput
from engine.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class BeamSearchSequence:
    """One beam: prompt and generated tokens, the top logprobs at each generated position."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        if "swap_space" in kwargs:
            kwargs.pop("swap_space")
            warnings.warn("LLM(swap_space=...) is deprecated and ignored: preempted requests are "
                          "recomputed, never swapped", DeprecationWarning, stacklevel=2)
        compilation = kwargs.get("compilation_config")
        if isinstance(compilation, int) and not isinstance(compilation, bool):
            kwargs["compilation_config"] = CompilationConfig(mode=compilation)
        engine_args = EngineArgs(model=model, **kwargs)
        self._init(engine_args)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLM":
        llm = cls.__new__(cls)
        llm._init(engine_args)
        return llm

    def _init(self, engine_args: EngineArgs) -> None:
        if engine_args.data_parallel_size > 1:
            raise ValueError(
                f"data_parallel_size={engine_args.data_parallel_size}: LLM runs a single EngineCore; for "
                "data parallelism use AsyncLLM or `ringllm serve --data-parallel-size N`, which start one "
                "EngineCore process per rank and balance requests over them")
        if engine_args.renderer_num_workers > 1:
            warnings.warn("renderer_num_workers is ignored by LLM: it tokenizes in the caller's thread "
                          "(AsyncLLM uses the thread pool)", UserWarning, stacklevel=3)
        logger.info("Non-default args: %s", non_default_args(engine_args))
        # A core process by default (as vLLM's VLLM_ENABLE_V1_MULTIPROCESSING); freed on
        # shutdown(), when the LLM is garbage collected, and at interpreter exit.
        self.llm_engine = LLMEngine.from_engine_args(
            engine_args, enable_multiprocessing=envs.RINGLLM_ENABLE_MULTIPROCESSING)
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

    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams) -> list["BeamSearchOutput"]:
        """vLLM's beam search, driven from here: each round asks the engine for one token with
        the top ``2 * beam_width`` logprobs for every live beam, then keeps the best
        ``beam_width`` per prompt by length-penalised cumulative logprob."""
        tokenizer = self.get_tokenizer()
        eos = self.llm_engine.input_processor.eos_token_id
        width = params.beam_width

        def score(beam: BeamSearchSequence) -> float:
            length = len(beam.tokens) - (1 if beam.tokens[-1] == eos else 0)
            return beam.cum_logprob / (length ** params.length_penalty)

        live: list[list[BeamSearchSequence]] = []
        for prompt in self._as_list(prompts):
            if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
                tokens = list(prompt["prompt_token_ids"])
            elif isinstance(prompt, (list, tuple)):
                tokens = list(prompt)
            else:
                tokens = tokenizer.encode(prompt["prompt"] if isinstance(prompt, dict) else prompt)
            live.append([BeamSearchSequence(tokens)])
        completed: list[list[BeamSearchSequence]] = [[] for _ in live]
        step = SamplingParams(logprobs=2 * width, max_tokens=1, temperature=params.temperature)
        for _ in range(params.max_tokens):
            beams = [beam for group in live for beam in group]
            if not beams:
                break
            results = iter(self.generate([{"prompt_token_ids": b.tokens} for b in beams], step, use_tqdm=False))
            for i, group in enumerate(live):
                candidates = []
                for beam in group:
                    top = next(results).outputs[0].logprobs[0]
                    for token_id, logprob in top.items():
                        new = BeamSearchSequence(beam.tokens + [token_id], beam.logprobs + [top],
                                                 beam.cum_logprob + logprob.logprob)
                        (completed[i] if token_id == eos and not params.ignore_eos else candidates).append(new)
                live[i] = sorted(candidates, key=score, reverse=True)[:width]
        outputs = []
        for group, done in zip(live, completed):
            best = sorted(done + group, key=score, reverse=True)[:width]
            for beam in best:
                beam.text = tokenizer.decode(beam.tokens) if tokenizer is not None else None
            outputs.append(BeamSearchOutput(best))
        return outputs

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def collective_rpc(self, method: str, timeout: Optional[float] = None, args: tuple = (),
                       kwargs: Optional[dict[str, Any]] = None) -> list[Any]:
        """Call a public method of the EngineCore's worker by name (vLLM's collective_rpc):
        one result per worker, as plain data (lists, dicts, numbers, strings)."""
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

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
        """One SamplingParams per prompt; anything else is a TypeError (a wrong count a ValueError)
        before a single request is queued."""
        if params is None:
            params = self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * n
        elif not isinstance(params, (list, tuple)):
            raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got "
                            f"{type(params).__name__}")
        elif len(params) != n:
            raise ValueError(f"sampling_params is a list of {len(params)}, but there are {n} prompts: "
                             "give one SamplingParams for all, or one per prompt")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}")
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
                request_ids.append(request_id)  # first: Ctrl-C inside add_request must abort it too
                engine.add_request(request_id, prompt, p, priority=priority[i] if priority else 0,
                                   add_special_tokens=add_special_tokens)
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
