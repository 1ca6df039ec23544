"""LLM: offline batched generation, with vLLM's public API.

``LLM(model, **engine_args).generate(prompts, sampling_params)`` queues every prompt, drives
the engine until all are done and returns the outputs in input order. Prompts are validated
before anything is queued, so one bad prompt raises (naming the problem) without leaving
work behind, and an interrupted ``generate`` (Ctrl-C) aborts what it queued.

Unlike vLLM's, an ``LLM`` may be called from several threads: the calls that drive the engine
run one at a time (a lock), so each gets its own outputs; one waiting for the lock still takes
Ctrl-C at once. ``shutdown()`` from another thread does not wait for a call in flight to end:
it makes that call raise ``EngineShutdownError`` now, then stops the engine.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import warnings
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import msgspec
from tqdm.auto import tqdm

from engine import envs
from engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchSequence  # noqa: F401 (exported)
from engine.config import DEFAULT_MODEL, CompilationConfig, EngineArgs, non_default_args
from engine.frontend.input_processor import ChatMessage, PromptType
from engine.llm_engine import LLMEngine
from engine.lora.request import LoRARequest
from engine.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from engine.frontend.renderer import encode_pair
from engine.pooling_params import PoolingParams
from engine.frontend.request_options import check_tokenization_kwargs, load_chat_template, lora_requests_per_prompt
from engine.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, verified_copy
from engine.scoring import cosine, score_mode, score_pairs

logger = logging.getLogger(__name__)

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _serialised(method: _Method) -> _Method:
    """One engine-driving call of an ``LLM`` at a time, across threads: the engine's client
    has one reader, and a call runs the engine until its own requests are done, so two at
    once would take each other's outputs (``KeyError`` in one, a hang in the other). Re-entrant:
    ``chat`` and ``beam_search`` call ``generate``-like methods. Waiting for the lock is
    interruptible: Ctrl-C raises KeyboardInterrupt in the waiting (main) thread at once."""

    @functools.wraps(method)
    def call(self: "LLM", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        if "swap_space" in kwargs:
            kwargs.pop("swap_space")
            warnings.warn(
                "LLM(swap_space=...) is deprecated and ignored: preempted requests are recomputed, never swapped",
                DeprecationWarning,
                stacklevel=2,
            )
        chat_template = load_chat_template(kwargs.pop("chat_template", None))
        kwargs.setdefault("disable_log_stats", True)  # as vLLM's LLM: no per-step stats offline
        compilation = kwargs.get("compilation_config")
        if isinstance(compilation, int) and not isinstance(compilation, bool):
            kwargs["compilation_config"] = CompilationConfig(mode=compilation)
        engine_args = EngineArgs(model=model, **kwargs)
        self._init(engine_args)
        self.chat_template = chat_template

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
                "EngineCore process per rank and balance requests over them"
            )
        if engine_args.renderer_num_workers > 1:
            warnings.warn(
                "renderer_num_workers is ignored by LLM: it tokenizes in the caller's thread "
                "(AsyncLLM uses the thread pool)",
                UserWarning,
                stacklevel=3,
            )
        self._lock = threading.RLock()  # see _serialised
        logger.info("Non-default args: %s", non_default_args(engine_args))
        # A core process by default (as vLLM's VLLM_ENABLE_V1_MULTIPROCESSING); freed on
        # shutdown(), when the LLM is garbage collected, and at interpreter exit.
        self.llm_engine = LLMEngine.from_engine_args(
            engine_args, enable_multiprocessing=envs.RINGLLM_ENABLE_MULTIPROCESSING
        )
        self._counter = itertools.count()
        self.chat_template: Optional[str] = None  # chat()'s default template (LLM(chat_template=...))
        self._queued: list[str] = []  # ids enqueue() added, in order, for wait_for_completion()
        self._done: dict[str, RequestOutput] = {}  # finished outputs of queued requests

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        return self.llm_engine.input_processor.default_sampling_params()

    @_serialised
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        use_tqdm: bool = True,
        lora_request: Any = None,
        priority: Optional[list[int]] = None,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. ``prompts``: a str, a token-id list, a
        ``{"prompt": ...}``/``{"prompt_token_ids": [...]}`` dict, or a list of these;
        ``sampling_params``: one for all prompts or a list of the same length;
        ``tokenization_kwargs``: e.g. ``{"truncation": True, "max_length": N}``."""
        self._check_runner("generate", "LLM.generate()")
        ids = self.enqueue(
            prompts,
            sampling_params,
            lora_request=lora_request,
            priority=priority,
            tokenization_kwargs=tokenization_kwargs,
            _queue=False,
        )
        return self._wait(ids, use_tqdm)

    @_serialised
    def enqueue(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        lora_request: Any = None,
        priority: Optional[list[int]] = None,
        use_tqdm: bool = False,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
        _queue: bool = True,
    ) -> list[str]:
        """Queue prompts without running them (vLLM's queued offline API); returns their
        request ids. ``wait_for_completion()`` runs the engine and returns their outputs."""
        self._check_runner("generate", "LLM.enqueue()")
        check_tokenization_kwargs(tokenization_kwargs)
        prompt_list = self._as_list(prompts)
        loras = lora_requests_per_prompt(lora_request, len(prompt_list), self._lora_enabled)
        return self._add(
            prompt_list,
            self._params_list(sampling_params, len(prompt_list)),
            priority,
            add_special_tokens=True,
            queue=_queue,
            tokenization_kwargs=tokenization_kwargs,
            loras=loras,
        )

    @_serialised
    def enqueue_chat(
        self,
        messages: Union[list[ChatMessage], list[list[ChatMessage]]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        lora_request: Any = None,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Optional[list[dict]] = None,
        chat_template_kwargs: Optional[dict[str, Any]] = None,
        _queue: bool = True,
    ) -> list[str]:
        """``enqueue`` for conversations, rendered as ``chat()`` renders them."""
        self._check_runner("generate", "LLM.enqueue_chat()")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of messages or of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        loras = lora_requests_per_prompt(lora_request, len(conversations), self._lora_enabled)
        template = load_chat_template(chat_template) or self.chat_template
        render = self.llm_engine.input_processor.render_chat
        prompts = [
            render(conv, template, add_generation_prompt, continue_final_message, tools, chat_template_kwargs)
            for conv in conversations
        ]
        # The template already wrote any special tokens (a BOS) the model expects.
        return self._add(
            prompts,
            self._params_list(sampling_params, len(prompts)),
            None,
            add_special_tokens=False,
            queue=_queue,
            loras=loras,
        )

    @_serialised
    def wait_for_completion(self, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run the engine until every request ``enqueue``/``enqueue_chat`` queued is done; their
        outputs, in the order they were queued."""
        ids, self._queued = self._queued, []
        return self._wait(ids, use_tqdm)

    @_serialised
    def chat(
        self,
        messages: Union[list[ChatMessage], list[list[ChatMessage]]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        use_tqdm: bool = True,
        lora_request: Any = None,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Optional[list[dict]] = None,
        chat_template_kwargs: Optional[dict[str, Any]] = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} messages) or to a
        list of conversations, rendered with ``chat_template`` (a template or a file path), else
        the one given to ``LLM(chat_template=...)``, else the tokenizer's."""
        self._check_runner("generate", "LLM.chat()")
        ids = self.enqueue_chat(
            messages,
            sampling_params,
            lora_request=lora_request,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            _queue=False,
        )
        return self._wait(ids, use_tqdm)

    @_serialised
    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams) -> list["BeamSearchOutput"]:
        """vLLM's beam search (engine/beam_search.py), each round's requests run as one batch."""
        self._check_runner("generate", "LLM.beam_search()")
        tokenizer = self.llm_engine.tokenizer
        prompt_ids = []
        for prompt in self._as_list(prompts):
            if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
                prompt_ids.append(list(prompt["prompt_token_ids"]))
            elif isinstance(prompt, (list, tuple)):
                prompt_ids.append(list(prompt))
            else:
                prompt_ids.append(tokenizer.encode(prompt["prompt"] if isinstance(prompt, dict) else prompt))
        search = BeamSearch(prompt_ids, params, self.llm_engine.input_processor.eos_token_id)
        while not search.done:
            outputs = self.generate(
                [{"prompt_token_ids": b.tokens} for b in search.beams()], search.step_params, use_tqdm=False
            )
            search.advance([out.outputs[0].logprobs[0] for out in outputs])
        return search.outputs(tokenizer.decode if tokenizer is not None else None)

    @_serialised
    def embed(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        *,
        use_tqdm: bool = True,
        pooling_params: Optional[Union[PoolingParams, Sequence[PoolingParams]]] = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt, in input order (a model served with runner="pooling"):
        the pooled final hidden states, L2-normalised unless ``pooling_params`` says otherwise."""
        self._check_runner("pooling", "LLM.embed()")
        outputs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, pooling_task="embed")
        return [EmbeddingRequestOutput.from_base(output) for output in outputs]

    @_serialised
    def classify(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        *,
        use_tqdm: bool = True,
        pooling_params: Optional[Union[PoolingParams, Sequence[PoolingParams]]] = None,
    ) -> list[ClassificationRequestOutput]:
        """One classification per prompt, in input order (a *ForSequenceClassification model):
        ``outputs.probs``, the softmax over the labels (a sigmoid for one label), or the logits
        when ``pooling_params.use_activation`` is False."""
        self._check_runner("pooling", "LLM.classify()")
        outputs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, pooling_task="classify")
        return [ClassificationRequestOutput.from_base(output) for output in outputs]

    @_serialised
    def score(
        self,
        data_1: Union[str, Sequence[str]],
        data_2: Union[str, Sequence[str]],
        /,
        *,
        use_tqdm: bool = True,
        pooling_params: Optional[PoolingParams] = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's ``LLM.score``: one score per pair, ``data_1`` against each of ``data_2`` (1:N)
        or pairwise (N:N); the cosine of their embeddings on an embedding model, the pair's
        output on a one-label classification model (engine/scoring.py)."""
        self._check_runner("pooling", "LLM.score()")
        mc = self.llm_engine.config.model_config
        mode = score_mode(mc.pooling_task, mc.classifier_labels)
        pairs = score_pairs(data_1, data_2)
        if mode == "cross":
            tokenizer = self.llm_engine.tokenizer
            prompts = [{"prompt_token_ids": encode_pair(tokenizer, a, b)} for a, b in pairs]
            outputs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm)
            return [
                ScoringRequestOutput(
                    o.request_id, ScoringOutput(float(o.outputs.data[0])), o.prompt_token_ids, o.num_cached_tokens
                )
                for o in outputs
            ]
        texts = sorted({t for pair in pairs for t in pair})  # each distinct text embedded once
        embedded = dict(zip(texts, self.encode(texts, pooling_params, use_tqdm=use_tqdm)))
        return [
            ScoringRequestOutput(
                f"{embedded[a].request_id}_{embedded[b].request_id}",
                ScoringOutput(cosine(embedded[a].outputs.data, embedded[b].outputs.data)),
                embedded[a].prompt_token_ids + embedded[b].prompt_token_ids,
                embedded[a].num_cached_tokens + embedded[b].num_cached_tokens,
            )
            for a, b in pairs
        ]

    @_serialised
    def encode(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        pooling_params: Optional[Union[PoolingParams, Sequence[PoolingParams]]] = None,
        *,
        use_tqdm: bool = True,
        pooling_task: Optional[str] = None,
    ) -> list[PoolingRequestOutput]:
        """One PoolingRequestOutput per prompt, in input order; ``outputs.data`` is the pooled
        float32 tensor. ``pooling_task``: what the pooler computes ("embed" on a converted
        decoder, "classify" on a classification model; None: the model's)."""
        self._check_runner("pooling", "LLM.encode()")
        if pooling_task is None:
            pooling_task = self.llm_engine.config.model_config.pooling_task
        prompt_list = self._as_list(prompts)
        if pooling_params is None:
            pooling_params = PoolingParams()
        params = [pooling_params] * len(prompt_list) if isinstance(pooling_params, PoolingParams) else pooling_params
        if not isinstance(params, (list, tuple)) or len(params) != len(prompt_list):
            raise ValueError(
                f"pooling_params must be a PoolingParams or a list of {len(prompt_list)} (one per "
                f"prompt), got {pooling_params!r}"
            )
        for i, p in enumerate(params):
            if not isinstance(p, PoolingParams):
                raise TypeError(f"pooling_params[{i}] must be a PoolingParams, got {type(p).__name__}")
            p.verify(pooling_task)
        params = [msgspec.structs.replace(p, task=pooling_task) for p in params]
        outputs = self._wait(self._add(prompt_list, params, None, add_special_tokens=True, queue=False), use_tqdm)
        for output in outputs:
            if output.error is not None:  # refused by the core: not a pooled vector
                raise ValueError(f"request {output.request_id!r} failed: {output.error}")
        return outputs

    def _check_runner(self, runner: str, call: str) -> None:
        """vLLM's runner check: a call that needs the other runner is a ValueError naming it."""
        if self.llm_engine.config.model_config.runner_type == runner:
            return
        kind = "pooling" if runner == "pooling" else "generative"
        raise ValueError(
            f"{call} is only supported for {kind} models. Try passing `--runner {runner}` "
            f"(LLM(runner={runner!r})) to use the model as a {kind} model."
        )

    @property
    def _lora_enabled(self) -> bool:
        return self.llm_engine.config.lora_config is not None

    @_serialised
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load and check an adapter ahead of its first request (ValueError naming what is wrong)."""
        return self.llm_engine.add_lora(lora_request)

    @_serialised
    def remove_lora(self, lora_id: int) -> bool:
        return self.llm_engine.remove_lora(lora_id)

    @_serialised
    def list_loras(self) -> set[int]:
        return self.llm_engine.list_loras()

    @_serialised
    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    @_serialised
    def collective_rpc(
        self, method: str, timeout: Optional[float] = None, args: tuple = (), kwargs: Optional[dict[str, Any]] = None
    ) -> list[Any]:
        """Call a public method of the EngineCore's worker by name (vLLM's collective_rpc):
        one result per worker, as plain data (lists, dicts, numbers, strings)."""
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def shutdown(self) -> None:
        """Stop the engine; from any thread. A call running in another thread raises
        ``EngineShutdownError`` at once (its requests are dropped, with the core), as does every
        later call; the core is stopped once that call has let go of the engine."""
        self.llm_engine.begin_shutdown()
        with self._lock:
            self.llm_engine.shutdown()

    @staticmethod
    def _as_list(prompts: Any) -> list:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if isinstance(prompts, (list, tuple)):
            if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
                return [list(prompts)]  # one prompt given as token ids
            return list(prompts)
        raise TypeError(
            f"prompts must be a str, a dict, a list of token ids or a list of prompts, got {type(prompts).__name__}"
        )

    def _params_list(self, params: Any, n: int) -> list[SamplingParams]:
        """One SamplingParams per prompt; anything else is a TypeError (a wrong count a ValueError)
        before a single request is queued."""
        if params is None:
            params = self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * n
        elif not isinstance(params, (list, tuple)):
            raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {type(params).__name__}")
        elif len(params) != n:
            raise ValueError(
                f"sampling_params is a list of {len(params)}, but there are {n} prompts: "
                "give one SamplingParams for all, or one per prompt"
            )
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}")
        # Only the final output is wanted; a copy, so the caller's object is left as it was (not
        # verified here: admission verifies what it is given).
        return [
            p
            if p.output_kind == RequestOutputKind.FINAL_ONLY
            else verified_copy(p, output_kind=RequestOutputKind.FINAL_ONLY)
            for p in params
        ]

    def _add(
        self,
        prompts: list,
        params: list,
        priority: Optional[list[int]],
        add_special_tokens: bool,
        queue: bool,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
        loras: Optional[list] = None,
    ) -> list[str]:
        """Add every prompt or none (``params``: one SamplingParams or PoolingParams each): a bad
        one (or Ctrl-C) aborts those already added. With ``queue`` the ids wait for
        ``wait_for_completion``; else the caller waits for them."""
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority must have one entry per prompt ({len(prompts)}), got {len(priority)}")
        engine = self.llm_engine
        request_ids: list[str] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = str(next(self._counter))
                request_ids.append(request_id)  # first: Ctrl-C inside add_request must abort it too
                engine.add_request(
                    request_id,
                    prompt,
                    p,
                    priority=priority[i] if priority else 0,
                    add_special_tokens=add_special_tokens,
                    tokenization_kwargs=tokenization_kwargs,
                    lora_request=loras[i] if loras else None,
                )
        except BaseException:  # a bad prompt, Ctrl-C: leave nothing queued
            engine.abort_request(request_ids)
            raise
        if queue:
            self._queued += request_ids
        return request_ids

    def _wait(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        """Run the engine until nothing is left; the outputs of ``request_ids``. Outputs of
        queued requests finished on the way are kept for ``wait_for_completion``."""
        try:
            self._done.update(self._run_engine(self.llm_engine.get_num_unfinished_requests(), use_tqdm))
        except BaseException:  # Ctrl-C, an engine error: abort what this call waited for
            self.llm_engine.abort_request(request_ids)
            raise
        return [self._done.pop(request_id) for request_id in request_ids]

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
                        if isinstance(output, RequestOutput):
                            out_tokens += sum(len(c.token_ids) for c in output.outputs)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(
                            f"est. speed input: {in_tokens / elapsed:.2f} toks/s, "
                            f"output: {out_tokens / elapsed:.2f} toks/s",
                            refresh=False,
                        )
                        bar.update(1)
        return finished
