"""Prompts in, ``EngineCoreRequest``s out: tokenize, validate, finish the sampling params.

``admit`` is the one way a request enters the engine, for ``LLMEngine`` and ``AsyncLLM`` alike.
Everything the core would refuse is refused here first, with a ValueError (a ParameterError
naming the field where one is at fault) or a TypeError, so a bad request fails in the
caller's hands and never reaches the engine: the checks that need the model are
``engine.request_check``'s, the same function the core runs. The params are verified once
here; the copies made after that (the filled-in params, the n children) are not verified again.
The caller's SamplingParams object is never modified: filled-in params are a copy.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from typing import Any, Container, NamedTuple, Optional, Sequence, TypedDict, Union

import msgspec

from engine.config import EngineConfig
from engine.exceptions import ParameterError
from engine.frontend.bad_words import tokenize_bad_words
from engine.frontend.chat_template import ChatTemplateError, TemplateLimits, render_chat
from engine.frontend.output_processor import ParentRequest, fan_out
from engine.frontend.renderer import encode, max_token_bytes
from engine.frontend.request_size import params_size
from engine.frontend.tokenizer import FastTokenizer, chat_template_source
from engine.hf_config import ModelConfigError
from engine.pooling_params import PoolingParams
from engine.request_check import RequestLimits, check_request
from engine.frontend.request_options import check_lora_request, check_tokenization_kwargs, tokenize_with_kwargs
from engine.sampling_params import RequestOutputKind, SamplingParams, ints_only, verified_copy
from engine.wire_messages import EngineCoreRequest

# What a pooling request carries as its (unused) sampling params: nothing to sample or detokenize.
_POOLING_SAMPLING = SamplingParams(max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)


class TextPrompt(TypedDict, total=False):
    prompt: str
    cache_salt: str  # vLLM's: prefix-cache blocks are shared only between requests of one salt


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]
    prompt: str  # optional: the text the ids came from, echoed in RequestOutput.prompt
    cache_salt: str


# vLLM prompt keys for inputs that only multimodal (or embedding-input) models take: on the text
# models served here each is a ValueError, never dropped in silence.
_MULTIMODAL_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids", "prompt_embeds")


PromptType = Union[str, TextPrompt, TokensPrompt, Sequence[int]]

ChatMessage = dict[str, Any]

# Template variables that are the request's own fields, not chat_template_kwargs' to set.
_RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "conversation", "chat_template"})
# The fields a chat render's ValueError may name ("continue_final_message: ...").
_CHAT_FIELDS = frozenset({"messages", "chat_template", "continue_final_message", "documents", "tools"})


_INT64_MAX = (1 << 63) - 1


class Admission(NamedTuple):
    """A request, admitted: what goes to the core (``children``: the request itself, or its n
    children, each with its parent and index) and the prompt text its outputs echo."""

    request: EngineCoreRequest
    prompt_text: Optional[str]
    children: list[tuple[EngineCoreRequest, Optional[ParentRequest], int]]


# The files a Hugging Face tokenizer is read from: a directory with none of them has no tokenizer.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def get_tokenizer(config: EngineConfig):
    """The model's tokenizer, or None with skip_tokenizer_init: a ``FastTokenizer`` where that is
    exact (engine/frontend/tokenizer.py: no transformers, no torch), else transformers'. Only
    fast (tokenizers-backed) tokenizers are accepted: streaming detokenization relies on them."""
    model_config = config.model_config
    if model_config.skip_tokenizer_init:
        return None
    path = model_config.tokenizer
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, name)) for name in _TOKENIZER_FILES):
        raise ModelConfigError(
            f"tokenizer: {path} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); pass "
            "tokenizer=<a directory with one>, or skip_tokenizer_init=True"
        )
    try:
        fast = None if path.endswith(".gguf") else FastTokenizer.from_dir(path)
        if fast is not None:
            return fast
        from transformers import AutoTokenizer

        if path.endswith(".gguf"):
            tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
    except ModelConfigError:
        raise  # names the file already
    except Exception as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"tokenizer: cannot load a tokenizer from {path!r}: {detail}") from None
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(f"tokenizer: {path!r} has no fast (tokenizers) tokenizer, which ringllm needs")
    return tokenizer


def _generation_config(config: EngineConfig) -> dict[str, Any]:
    """The model's generation_config.json, if it has one (a .gguf model has none)."""
    path = os.path.join(config.model_config.model_path, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read())


# generation_config.json keys that become default SamplingParams (as vLLM's generation_config="auto").
_GENERATION_DEFAULTS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def _arrival_time(value: Any) -> float:
    """``value`` (the caller's ``time.monotonic()``), or now; a finite float on the wire."""
    if value is None:
        return time.monotonic()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:
            pass
        else:
            if math.isfinite(value):
                return value
    raise TypeError(f"arrival_time must be a finite number (as time.monotonic() gives), got {value!r}")


class InputProcessor:
    def __init__(self, config: EngineConfig, tokenizer) -> None:
        model_config = config.model_config
        self.tokenizer = tokenizer
        self.max_model_len = model_config.max_model_len
        self.vocab_size = model_config.vocab_size
        self.limits = RequestLimits.of(model_config)
        self._sequence = itertools.count()  # numbers the core's request ids
        self.max_n = config.max_seqs_per_request
        self.priority_scheduling = config.scheduler_config.policy == "priority"
        self.lora_enabled = config.lora_config is not None
        self.runner_type = model_config.runner_type  # "generate": SamplingParams only; "pooling": PoolingParams only
        self.pooling_task = model_config.pooling_task  # the one task a pooling model serves
        eos = tokenizer.eos_token_id if tokenizer is not None else getattr(model_config.hf_config, "eos_token_id", None)
        self.eos_token_id: Optional[int] = eos[0] if isinstance(eos, list) else eos
        generation = _generation_config(config)
        eos_ids = generation.get("eos_token_id")
        eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
        # Further eos ids act as stop token ids (vLLM: stop_reason is the id).
        self.extra_eos_ids = [i for i in eos_ids if i != self.eos_token_id]
        self.default_params = {
            param: generation[key] for key, param in _GENERATION_DEFAULTS.items() if generation.get(key) is not None
        }
        self.structured_outputs_backend = config.structured_outputs_config.backend
        # Longer prompt text cannot fit the context whatever its tokens: refused before tokenizing.
        self.max_prompt_bytes = None if tokenizer is None else self.max_model_len * max_token_bytes(tokenizer)

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the model's generation-config defaults applied."""
        return SamplingParams(**self.default_params)

    def internal_id(self, request_id: Any, in_use: Container[str]) -> str:
        """The id the core knows a new request by: the caller's ``request_id`` plus a sequence
        number, so an id can be reused as soon as its request finished or was aborted here (the
        core's outputs for the earlier one, still on their way, then match no request). An id in
        ``in_use`` (the caller's live requests) is a ValueError."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id in in_use:
            raise ValueError(f"request id {request_id!r} is already in use")
        return f"{request_id}-{next(self._sequence)}"

    def admit(
        self,
        internal_id: str,
        prompt: PromptType,
        params: Union[SamplingParams, PoolingParams],
        arrival_time: Optional[float] = None,
        priority: int = 0,
        add_special_tokens: bool = True,
        *,
        lora_request: Any = None,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
    ) -> Admission:
        """Everything between a caller's arguments and the core, for ``LLMEngine`` and ``AsyncLLM``:
        vLLM's per-request keywords checked, the prompt tokenized (``tokenization_kwargs`` may
        truncate it) and validated, the params verified and finished, and the request fanned out
        into its n children. CPU work only: AsyncLLM runs it on the renderer pool when
        ``offload_size`` says the prompt is worth a thread."""
        lora = check_lora_request(lora_request, self.lora_enabled)
        check_tokenization_kwargs(tokenization_kwargs)
        prompt = tokenize_with_kwargs(self.tokenizer, prompt, tokenization_kwargs, add_special_tokens)
        request, text = self.process(internal_id, prompt, params, arrival_time, priority, add_special_tokens)
        request.lora_request = lora
        return Admission(request, text, fan_out(request))

    def process(
        self,
        request_id: str,
        prompt: PromptType,
        params: Union[SamplingParams, PoolingParams],
        arrival_time: Optional[float] = None,
        priority: int = 0,
        add_special_tokens: bool = True,
    ) -> tuple[EngineCoreRequest, Optional[str]]:
        """The request for the core, and the prompt text to echo in outputs. ``params``: a
        SamplingParams on a generating model, a PoolingParams on a pooling one (runner)."""
        pooling = isinstance(params, PoolingParams)
        if not pooling and not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        self.check_runner(pooling)
        params.verify()  # this side's one check: the caller may have changed its object since it was built
        if pooling and params.task is not None and params.task != self.pooling_task:
            raise ParameterError(
                f"pooling_task {params.task!r} is not supported by this model, which serves {self.pooling_task!r}",
                parameter="task",
                value=params.task,
            )
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"priority must be an int, got {priority!r}")
        if not -(1 << 63) <= priority < (1 << 63):
            raise ParameterError("priority must fit in 64 bits", parameter="priority", value=priority)
        if priority and not self.priority_scheduling:
            raise ParameterError(
                f"priority={priority} needs scheduling_policy='priority' (the engine runs 'fcfs')",
                parameter="priority",
                value=priority,
            )
        cache_salt = self._prompt_options(prompt)
        truncating = params.truncate_prompt_tokens is not None
        text, token_ids = self._tokenize(prompt, add_special_tokens, truncating)
        token_ids = self._truncate(token_ids, params.truncate_prompt_tokens, params.truncation_side)
        if pooling:
            self._validate(token_ids, _POOLING_SAMPLING)
            return EngineCoreRequest(
                request_id,
                token_ids,
                _POOLING_SAMPLING,
                None,
                _arrival_time(arrival_time),
                priority,
                pooling_params=params,
                cache_salt=cache_salt,
            ), text
        self._validate(token_ids, params)
        request = EngineCoreRequest(
            request_id,
            token_ids,
            self._finish_params(params),
            self.eos_token_id,
            _arrival_time(arrival_time),
            priority,
            cache_salt=cache_salt,
        )
        return request, text

    @staticmethod
    def _prompt_options(prompt: PromptType) -> Optional[str]:
        """A dict prompt's ``cache_salt`` (a non-empty str, or None); its multimodal keys are
        refused, as vLLM refuses them for a text model."""
        if not isinstance(prompt, dict):
            return None
        for key in _MULTIMODAL_KEYS:
            if prompt.get(key) is not None:
                raise ParameterError(
                    f"{key}: this is a text-only model; it takes no multimodal or embedding inputs", parameter=key
                )
        salt = prompt.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise ParameterError(f"cache_salt must be a non-empty string, got {salt!r}", parameter="cache_salt")
        return salt

    def _truncate(self, token_ids: list[int], keep: Optional[int], side: Optional[str]) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep ``keep`` tokens (-1: max_model_len), the last ones
        unless ``side`` is "right"."""
        if keep is None:
            return token_ids
        if keep == -1:
            keep = self.max_model_len
        elif keep > self.max_model_len:
            raise ParameterError(
                f"truncate_prompt_tokens={keep} is more than max_model_len={self.max_model_len}",
                parameter="truncate_prompt_tokens",
                value=keep,
            )
        if len(token_ids) <= keep:
            return token_ids
        return token_ids[:keep] if side == "right" else token_ids[len(token_ids) - keep :]

    def check_runner(self, pooling: bool) -> None:
        """A generation request on a pooling model, or a pooling one on a generating model, is a
        ValueError naming the runner it needs (vLLM's runner check)."""
        if pooling and self.runner_type != "pooling":
            raise ValueError(
                "pooling requests (PoolingParams: embed, encode) are only supported for pooling "
                "models. Try passing `--runner pooling` to use the model as a pooling model."
            )
        if not pooling and self.runner_type == "pooling":
            raise ValueError(
                "generation requests (SamplingParams) are only supported for generative models. "
                "Try passing `--runner generate` to use the model as a generative model."
            )

    @staticmethod
    def offload_size(prompt: PromptType, params: Any = None) -> int:
        """The input-sized work of admitting ``prompt`` with ``params``, to decide whether it runs
        off the event loop: the text ``admit`` would tokenize (its characters) plus what the params
        carry to tokenize, check or turn into a grammar (engine/frontend/request_size.py); a cheap,
        bounded look, no validation. A prompt's token ids count 0: checking them is a few C-level
        passes (type, min, max), cheaper than the hop to a thread."""
        if isinstance(prompt, dict):
            prompt = None if "prompt_token_ids" in prompt else prompt.get("prompt")
        return (len(prompt) if isinstance(prompt, str) else 0) + params_size(params)

    def check_text_fits(self, text: str, param: str = "prompt") -> None:
        """Refuse text too long for ``max_model_len`` whatever its tokens, before tokenizing it:
        O(1) for short text (a character is at most 4 bytes), one UTF-8 encode otherwise."""
        limit = self.max_prompt_bytes
        if limit is None or 4 * len(text) <= limit:
            return
        size = len(text.encode())  # ~1 ms a megabyte
        if size > limit:
            raise ParameterError(
                f"the prompt ({size} bytes of text) is longer than the maximum model length "
                f"max_model_len={self.max_model_len} can hold (at most {limit} bytes)",
                parameter=param,
            )

    def check_prompt_fits(self, prompt: PromptType, params: Any = None) -> None:
        """``check_text_fits`` for a prompt in any of its forms (token ids are counted later);
        none for params that truncate the prompt (any length fits then, as in vLLM)."""
        if getattr(params, "truncate_prompt_tokens", None) is not None:
            return
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:
            prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            self.check_text_fits(prompt)

    def render_chat(
        self,
        conversation: list[ChatMessage],
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Optional[list[dict]] = None,
        chat_template_kwargs: Optional[dict] = None,
        documents: Optional[list[dict]] = None,
        max_chars: Optional[int] = None,
    ) -> str:
        """The conversation as prompt text, through ``chat_template`` (a template's text) or the
        tokenizer's, rendered in the bounded sandbox (engine/frontend/chat_template.py): past its
        time bound or past ``max_chars`` of output (default: what the context can hold) it is a
        ParameterError, like every other fault of the template or the messages. As vLLM,
        ``chat_template_kwargs`` reach the template and override the named arguments."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer, but the engine was built with skip_tokenizer_init=True")
        variables = dict(chat_template_kwargs or {})
        for key in variables:
            if not isinstance(key, str) or key in _RESERVED_TEMPLATE_VARIABLES:
                raise ParameterError(
                    f"chat_template_kwargs may not set {key!r} (the request's own field)",
                    parameter="chat_template_kwargs",
                )
        add_generation_prompt = variables.pop("add_generation_prompt", add_generation_prompt)
        continue_final_message = variables.pop("continue_final_message", continue_final_message)
        tools = variables.pop("tools", tools)
        documents = variables.pop("documents", documents)
        if continue_final_message and add_generation_prompt:
            raise ParameterError(
                "continue_final_message and add_generation_prompt cannot both be true (set "
                "add_generation_prompt=false to continue the final message)",
                parameter="continue_final_message",
            )
        if max_chars is None and self.max_prompt_bytes is not None:  # longer text cannot fit the context
            limits = TemplateLimits(
                max_chars=self.max_prompt_bytes,
                max_chars_reason=f"more than max_model_len={self.max_model_len} can hold",
            )
        else:
            limits = TemplateLimits(max_chars=max_chars or TemplateLimits.max_chars)
        at_fault = "messages" if chat_template is None else "chat_template"
        try:
            source = chat_template_source(self.tokenizer, chat_template, tools)
            return render_chat(
                source,
                conversation,
                special_tokens=self.tokenizer.special_tokens_map,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                documents=documents,
                variables=variables,
                limits=limits,
            )
        except ParameterError:
            raise
        except ChatTemplateError as e:
            raise ParameterError(str(e), parameter=at_fault) from None
        except ValueError as e:  # "<field>: what is wrong"
            field = str(e).split(":", 1)[0]
            raise ParameterError(str(e), parameter=field if field in _CHAT_FIELDS else at_fault) from None

    def chat_prompt(
        self,
        conversation: list[ChatMessage],
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Optional[list[dict]] = None,
        chat_template_kwargs: Optional[dict] = None,
        documents: Optional[list[dict]] = None,
        max_chars: Optional[int] = None,
        *,
        must_fit: bool = True,
        add_special_tokens: bool = False,
    ) -> tuple[str, list[int]]:
        """The conversation as prompt text and its token ids: ``render_chat``, then (``must_fit``)
        text too long for the context refused before the costly part, then tokenized, without
        special tokens unless asked (the template wrote them as text; a BOS added again would be
        a second one). One job for the renderer pool: a chat's CPU work in one hop, after which
        its ids enter ``admit`` as a token-id prompt, checked inline."""
        text = self.render_chat(
            conversation,
            chat_template,
            add_generation_prompt,
            continue_final_message,
            tools,
            chat_template_kwargs,
            documents,
            max_chars,
        )
        if must_fit:
            self.check_text_fits(text, param="messages")
        return text, encode(self.tokenizer, text, add_special_tokens)

    def _tokenize(
        self, prompt: PromptType, add_special_tokens: bool, truncating: bool = False
    ) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._token_ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ParameterError("a dict prompt needs 'prompt' (text) or 'prompt_token_ids'", parameter="prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ParameterError(
                    "text prompts need a tokenizer (skip_tokenizer_init=True); pass {'prompt_token_ids': [...]}",
                    parameter="prompt",
                )
            if not truncating:  # a truncated prompt fits whatever its length
                self.check_text_fits(prompt)
            return prompt, encode(self.tokenizer, prompt, add_special_tokens)
        if isinstance(prompt, (list, tuple)):
            return None, self._token_ids(prompt)
        raise TypeError(
            "prompt must be a str, a list of token ids, {'prompt': str} or "
            f"{{'prompt_token_ids': [...]}}, got {type(prompt).__name__}"
        )

    @staticmethod
    def _token_ids(ids: Any) -> list[int]:
        if not isinstance(ids, (list, tuple)) or not ints_only(ids):
            raise TypeError("prompt_token_ids must be a list of ints")
        return list(ids)

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        """``params`` (verified) and the prompt against the engine: the core's own check
        (engine.request_check), and what only the frontend knows (n, stop strings, grammars)."""
        if params.n > self.max_n:  # each of n is a sequence the engine would hold
            raise ParameterError(
                f"SamplingParams.n must be <= {self.max_n} (the sequences one request may hold), got {params.n}",
                parameter="n",
                value=params.n,
            )
        if params.n > 1 and params.seed is not None and params.seed + params.n - 1 > _INT64_MAX:
            raise ParameterError(
                f"SamplingParams.seed must be at most 2**63 - n with n={params.n} (sample i "
                f"is seeded with seed + i), got {params.seed}",
                parameter="seed",
                value=params.seed,
            )
        check_request(token_ids, params, self.limits)
        if params.stop and (self.tokenizer is None or not params.detokenize):
            raise ParameterError(
                "SamplingParams.stop: stop strings need detokenize=True and a tokenizer",
                parameter="stop",
                value=params.stop,
            )
        so = params.structured_outputs
        if so is not None:
            if self.tokenizer is None:
                raise ParameterError(
                    "structured_outputs needs a tokenizer (the engine was built with skip_tokenizer_init=True)",
                    parameter="structured_outputs",
                )
            from engine.structured_output.validate import validate_structured_outputs

            validate_structured_outputs(so, self.structured_outputs_backend)

    def _num_logprobs(self, value: Optional[int]) -> Optional[int]:
        """vLLM's -1 is the whole vocabulary; the core only ever sees the count."""
        return self.vocab_size if value == -1 else value

    def _finish_params(self, params: SamplingParams) -> SamplingParams:
        stop_ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids += [i for i in self.extra_eos_ids if i not in stop_ids]
        all_stop = set(stop_ids)
        if not params.ignore_eos and self.eos_token_id is not None:
            all_stop.add(self.eos_token_id)
        bad_words = tokenize_bad_words(self.tokenizer, params.bad_words) if params.bad_words else []
        return verified_copy(
            params,
            stop_token_ids=stop_ids,
            all_stop_token_ids=sorted(all_stop),
            bad_words_token_ids=bad_words,
            logprobs=self._num_logprobs(params.logprobs),
            prompt_logprobs=self._num_logprobs(params.prompt_logprobs),
        )
