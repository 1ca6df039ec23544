"""OpenAI request and response bodies, as msgspec Structs that read as the API spec.

Requests are decoded straight into these types, so a wrong type or an out-of-range value
is refused by the decoder with the field's JSON path, whose first step becomes the error's
``param``. Every integer is bounded to int64, so whatever is accepted can cross the wire to
the EngineCore (msgpack) and fit its tensors.
The sampling fields both generation endpoints accept are declared once (``_SamplingFields``)
and mapped onto ``SamplingParams`` in one place. A field not declared here is placed by
``field_support``: a vLLM field ringllm does not carry is a 400 naming it (unless its value asks
for nothing), and a name vLLM does not know either is ignored with a warning in the log.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.field_support import check_undeclared
from engine.entrypoints.openai.partial_json import MAX_DEPTH, nesting
from engine.entrypoints.openai.structured_outputs import sampling_extras
from engine.exceptions import ParameterError
from engine.outputs import Logprob
from engine.sampling_params import RequestOutputKind, SamplingParams

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Int64 = Annotated[int, Meta(ge=_INT64_MIN, le=_INT64_MAX)]
PositiveInt = Annotated[int, Meta(ge=1, le=_INT64_MAX)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=_INT64_MAX)]
TokenIds = list[NonNegativeInt]
MAX_REQUEST_ID_CHARS = 256  # a request_id (or X-Request-Id) lands in logs and engine ids


# msgspec.ValidationError carries the JSON path only in its message, always in these two forms
# ("Expected `int`, got `str` - at `$.max_tokens`", "Object missing required field `prompt`"),
# so the offending top-level field is read from there, and only for msgspec's own errors.
_MSGSPEC_PATH = re.compile(r" - at `\$\.(\w+)")
_MSGSPEC_MISSING = re.compile(r"^Object missing required field `(\w+)`")


def _msgspec_field(error: msgspec.ValidationError) -> Optional[str]:
    """The top-level request field a msgspec validation error is about, if any."""
    match = _MSGSPEC_PATH.search(str(error)) or _MSGSPEC_MISSING.search(str(error))
    return match.group(1) if match else None


def decode_request(body: bytes, type_: type) -> Any:
    """Decode a JSON body into ``type_``; any problem is a 400 naming the offending field.

    A body nested too deeply for the decoder (``[[[[...]]]]`` in any field, known or not) is a
    400 too: msgspec stops at Python's recursion limit and raises RecursionError.
    """
    try:
        request = msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise OpenAIError(400, f"invalid request: {exc}", param=_msgspec_field(exc), code="invalid_value") from None
    except msgspec.DecodeError as exc:
        raise OpenAIError(400, f"invalid JSON body: {exc}", code="invalid_json") from None
    except RecursionError:
        raise OpenAIError(400, "invalid JSON body: it is nested too deeply", code="invalid_json") from None
    check_undeclared(body, type_)  # vLLM's fields not declared here: refused, or warned about
    return request


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage (so far) in every chunk, not only in a last one


# Unset (None), these take the model's generation-config default, then SamplingParams' own,
# as vLLM's server does; every other field has OpenAI's default.
MODEL_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class _SamplingFields(Struct, kw_only=True):
    """What /v1/completions and /v1/chat/completions share: OpenAI's fields plus vLLM's extras."""

    model: Optional[str] = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[Annotated[int, Meta(ge=-1, le=_INT64_MAX)]] = None  # above the vocabulary: no top-k
    min_p: Optional[Probability] = None
    repetition_penalty: Optional[Annotated[float, Meta(gt=0.0)]] = None
    seed: Optional[Int64] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[TokenIds] = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    ignore_eos: bool = False
    min_tokens: NonNegativeInt = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    # vLLM's extras (engine/entrypoints/openai/field_support.py places every vLLM field).
    truncate_prompt_tokens: Optional[Annotated[int, Meta(ge=-1, le=_INT64_MAX)]] = None
    truncation_side: Optional[Literal["left", "right"]] = None
    prompt_logprobs: Optional[Annotated[int, Meta(ge=-1, le=_INT64_MAX)]] = None
    return_tokens_as_token_ids: Optional[bool] = None  # logprob tokens as "token_id:{id}"
    return_token_ids: Optional[bool] = None  # prompt_token_ids and each choice's token_ids
    priority: Int64 = 0  # lower first; needs --scheduling-policy priority
    request_id: Optional[Annotated[str, Meta(min_length=1, max_length=MAX_REQUEST_ID_CHARS)]] = None
    cache_salt: Optional[Annotated[str, Meta(min_length=1, max_length=1024)]] = None
    use_beam_search: bool = False  # n is the beam width (serving_beam_search.py)
    length_penalty: float = 1.0  # beam search: scores are cumulative logprob / length ** this
    stream_interval: Optional[PositiveInt] = None  # a stream's chunks carry at least this many tokens each
    # Structured outputs and logit controls (engine/entrypoints/openai/structured_outputs.py).
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Union[str, dict[str, Any], None] = None  # deprecated (vLLM): structured_outputs.json
    guided_regex: Optional[str] = None  # deprecated: structured_outputs.regex
    guided_choice: Optional[list[str]] = None  # deprecated: structured_outputs.choice
    guided_grammar: Optional[str] = None  # deprecated: structured_outputs.grammar
    guided_whitespace_pattern: Optional[str] = None  # deprecated: structured_outputs.whitespace_pattern
    logit_bias: Optional[dict[str, float]] = None  # token id (as a string) -> bias, clamped to [-100, 100]
    allowed_token_ids: Optional[TokenIds] = None
    bad_words: Optional[list[str]] = None

    def prompt_dict(self, prompt: Any, text: Optional[str] = None) -> dict[str, Any]:
        """An engine prompt (text, or token ids with their ``text``) carrying the cache salt."""
        engine_prompt: dict[str, Any] = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
        if text is not None:
            engine_prompt["prompt"] = text
        if self.cache_salt is not None:
            engine_prompt["cache_salt"] = self.cache_salt
        return engine_prompt

    def _sampling_params(
        self,
        model_defaults: dict[str, Any],
        max_tokens: Optional[int],
        logprobs: Optional[int],
        prompt_logprobs: Optional[int],
    ) -> SamplingParams:
        """``model_defaults``: SamplingParams fields from the model's generation config."""
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(
                400, "stream_options can only be set when stream is true", param="stream_options", code="invalid_value"
            )
        if self.stream and self.prompt_logprobs is not None:
            raise OpenAIError(
                400,
                "prompt_logprobs are not available when stream is true",
                param="prompt_logprobs",
                code="invalid_value",
            )
        extras = sampling_extras(self)
        chosen = {name: getattr(self, name) for name in MODEL_DEFAULTED if getattr(self, name) is not None}
        fields = {**model_defaults, **chosen}
        if max_tokens is not None or "max_tokens" not in fields:
            fields["max_tokens"] = max_tokens
        try:
            return SamplingParams(
                **fields,
                n=self.n,
                seed=self.seed,
                stop=self.stop,
                stop_token_ids=self.stop_token_ids,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                include_stop_str_in_output=self.include_stop_str_in_output,
                skip_special_tokens=self.skip_special_tokens,
                truncate_prompt_tokens=self.truncate_prompt_tokens,
                truncation_side=self.truncation_side,
                stream_interval=self.stream_interval if self.stream else None,  # vLLM: ignored unless streaming
                output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
                **extras,
            )
        except ParameterError as exc:
            raise OpenAIError(400, str(exc), param=exc.parameter, code="invalid_value") from None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk (vLLM: needs include_usage too)."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def check_max_tokens(self, max_model_len: int) -> None:
        """More new tokens than the whole context can hold is a 400 naming the field, as vLLM answers."""
        name, value = self._max_tokens_field()
        if value is not None and value > max_model_len:
            raise OpenAIError(
                400,
                f"{name}={value} is more than the model's context length max_model_len={max_model_len}",
                param=name,
                code="invalid_value",
            )

    def _max_tokens_field(self) -> tuple[str, Optional[int]]:
        return "max_tokens", getattr(self, "max_tokens", None)


class CompletionRequest(_SamplingFields, kw_only=True):
    # str, a batch of str, one prompt of token ids, or a batch of token-id prompts.
    prompt: Union[str, list[Union[str, NonNegativeInt, TokenIds]]]
    max_tokens: Optional[NonNegativeInt] = 16  # 0 only with echo: the prompt alone (see echo_only)
    echo: bool = False
    logprobs: Optional[NonNegativeInt] = None
    suffix: Optional[str] = None
    add_special_tokens: bool = True  # the tokenizer's BOS and the like, for text prompts

    def prompts(self) -> list[Union[str, list[int]]]:
        """The batch of prompts, each a string or a list of token ids."""
        return _prompt_batch(self.prompt, "prompt")

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens`` 0: OpenAI's and vLLM's way to score a prompt. The answer
        is the prompt (and its logprobs) with ``finish_reason`` ``length`` and no completion
        tokens; the engine, which always samples, generates one token that is not shown."""
        return self.echo and self.max_tokens == 0

    def to_sampling_params(self, model_defaults: dict[str, Any]) -> SamplingParams:
        if self.max_tokens == 0 and not self.echo:
            raise OpenAIError(
                400,
                "max_tokens must be at least 1 (0 only with echo, to return the prompt alone)",
                param="max_tokens",
                code="invalid_value",
            )
        if self.suffix:
            raise OpenAIError(400, "suffix is not supported", param="suffix", code="invalid_value")
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo and self.logprobs is not None:
            prompt_logprobs = self.logprobs  # the echoed prompt's own logprobs
        return self._sampling_params(
            model_defaults, 1 if self.echo_only else self.max_tokens, self.logprobs, prompt_logprobs
        )


def _prompt_batch(p: Any, param: str) -> list[Union[str, list[int]]]:
    """OpenAI's prompt/input: a string, a batch of strings, one prompt of token ids, or a batch of
    token-id prompts; as a list of prompts, each a string or a list of token ids."""
    if isinstance(p, str):
        return [p]
    if p and all(isinstance(x, int) for x in p):
        return [list(p)]
    if p and (all(isinstance(x, str) for x in p) or all(isinstance(x, list) and x for x in p)):
        return list(p)
    if any(isinstance(x, str) for x in p) and not all(isinstance(x, str) for x in p):
        raise OpenAIError(
            400,
            f"{param} mixes strings and token ids in one list; OpenAI's schema (and vLLM) "
            "takes a string, a list of strings, a list of token ids or a list of token-id lists: "
            "send the strings and the token ids in separate requests",
            param=param,
            code="invalid_value",
        )
    raise OpenAIError(
        400,
        f"{param} must be a string, a list of strings, a list of token ids or a list of non-empty token-id lists",
        param=param,
        code="invalid_value",
    )


class PoolingBasicFields(Struct, kw_only=True):
    """What every pooling route takes (vLLM's PoolingBasicRequestMixin + ClassifyRequestMixin);
    field_support.py places every vLLM field."""

    model: Optional[str] = None
    user: Optional[str] = None
    use_activation: Optional[bool] = None  # an embedding's L2 normalisation, a classification's softmax
    truncate_prompt_tokens: Optional[Annotated[int, Meta(ge=-1, le=_INT64_MAX)]] = None
    truncation_side: Optional[Literal["left", "right"]] = None
    priority: Int64 = 0
    request_id: Optional[Annotated[str, Meta(min_length=1, max_length=MAX_REQUEST_ID_CHARS)]] = None
    cache_salt: Optional[Annotated[str, Meta(min_length=1, max_length=1024)]] = None


class PoolingInputFields(PoolingBasicFields, kw_only=True):
    """A pooling route over OpenAI's ``input`` (vLLM's CompletionRequestMixin)."""

    input: Union[str, list[Union[str, NonNegativeInt, TokenIds]]]
    add_special_tokens: bool = True  # the tokenizer's BOS and the like, for text inputs

    def prompts(self) -> list[Union[str, list[int]]]:
        return _prompt_batch(self.input, "input")


class EmbeddingRequest(PoolingInputFields, kw_only=True):
    """POST /v1/embeddings (a server started with ``--runner pooling``)."""

    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[PositiveInt] = None  # matryoshka truncation: refused, no model here has it
    embed_dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # what the values are rounded to
    endianness: Literal["native", "little", "big"] = "native"  # byte order of base64 values


class ContentPart(Struct, kw_only=True):
    type: str
    text: Optional[str] = None


# ---- tool calling (OpenAI's shapes; tool_parsers/ reads the calls out of model text) ----


class FunctionDefinition(Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema of the arguments object
    strict: Optional[bool] = None


class ChatCompletionToolsParam(Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(Struct, kw_only=True):
    name: str


class NamedToolChoice(Struct, kw_only=True):
    """``{"type": "function", "function": {"name": ...}}``: this function must be called."""

    function: NamedFunction
    type: Literal["function"] = "function"


class FunctionCall(Struct):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


# The template's ``reasoning_effort``, as vLLM passes it (chat's field, responses' ``reasoning.effort``).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None  # a tool message: the call it answers
    # An assistant's earlier reasoning (an answer's own field sent back), for templates that show it
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None  # the same, under vLLM's other name

    def for_template(self, index: int) -> dict[str, str]:
        """The plain ``{"role", "content"}`` dict chat templates expect; only text parts exist here."""
        content = self.content
        if isinstance(content, list):
            if any(part.type != "text" or part.text is None for part in content):
                raise OpenAIError(
                    400,
                    "only text content parts are supported",
                    param=f"messages.{index}.content",
                    code="invalid_value",
                )
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [_call_for_template(call, index) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning_content if self.reasoning_content is not None else self.reasoning
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message


def _call_for_template(call: ToolCall, index: int) -> dict[str, Any]:
    """A call as chat templates take it: ``arguments`` a dict, not JSON text (transformers'
    convention, which vLLM follows); empty arguments are ``{}``. Nested deeper than the parsers
    read arguments is a 400: the template's helpers recurse once per level."""
    try:
        arguments = json.loads(call.function.arguments) if call.function.arguments else {}
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack allows
        raise OpenAIError(
            400,
            f"the arguments of tool call {call.id!r} are not valid JSON",
            param=f"messages.{index}.tool_calls",
            code="invalid_value",
        ) from None
    if nesting(arguments) > MAX_DEPTH:
        raise OpenAIError(
            400,
            f"the arguments of tool call {call.id!r} are nested deeper than {MAX_DEPTH} levels",
            param=f"messages.{index}.tool_calls",
            code="invalid_value",
        )
    return {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": arguments}}


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    tools: Optional[list[ChatCompletionToolsParam]] = None
    # Unset: "auto" with tools, "none" without (vLLM); tool_parsers/tool_choice.py checks the rest.
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True
    max_tokens: Optional[PositiveInt] = None
    max_completion_tokens: Optional[PositiveInt] = None
    logprobs: bool = False
    top_logprobs: Optional[NonNegativeInt] = None
    echo: bool = False  # vLLM: the answer starts with the last message's content when it is the assistant's
    add_special_tokens: bool = False  # on top of what the chat template writes (vLLM's default: none)
    documents: Optional[list[dict[str, str]]] = None  # for RAG templates: the template's ``documents``
    include_reasoning: bool = True  # with --reasoning-parser: false leaves the reasoning out of the answer
    # The template's ``reasoning_effort`` (as vLLM passes it); no effect on a template that ignores it.
    reasoning_effort: Optional[ReasoningEffort] = None
    return_prompt_text: Optional[bool] = None  # the rendered prompt in ``prompt_text`` (a stream's first chunk)
    add_generation_prompt: bool = True
    chat_template_kwargs: Optional[dict[str, Any]] = None
    chat_template: Optional[str] = None  # a template's text, never a path (rendered in the sandbox)
    continue_final_message: bool = False  # the final (assistant) message left open, to be continued

    def template_kwargs(self) -> Optional[dict[str, Any]]:
        """``chat_template_kwargs`` over vLLM's named template variables (``documents``,
        ``reasoning_effort``), which the template sees as it sees the kwargs."""
        named = {
            name: value
            for name, value in (("documents", self.documents), ("reasoning_effort", self.reasoning_effort))
            if value is not None
        }
        return {**named, **(self.chat_template_kwargs or {})} if named else self.chat_template_kwargs

    def _max_tokens_field(self) -> tuple[str, Optional[int]]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def to_sampling_params(self, model_defaults: dict[str, Any]) -> SamplingParams:
        """With no max_(completion_)tokens the answer may run to the end of the context."""
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value")
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo and self.logprobs:
            prompt_logprobs = self.top_logprobs or 0  # as vLLM: the echoed prompt's logprobs too
        return self._sampling_params(
            model_defaults,
            self.max_completion_tokens or self.max_tokens,
            (self.top_logprobs or 0) if self.logprobs else None,
            prompt_logprobs,
        )


class TokenizeRequest(Struct, kw_only=True):
    """Either a ``prompt`` or chat ``messages`` (rendered with the chat template)."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(Struct, kw_only=True):
    tokens: TokenIds
    model: Optional[str] = None


# ---- responses ----


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class PromptTokensDetails(Struct):
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (or loaded by a KV connector)


class UsageInfo(Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: Optional[PromptTokensDetails] = None  # in whole responses and a stream's last usage


class CompletionLogProbs(Struct):
    text_offset: list[int] = []
    token_logprobs: list[Optional[float]] = []
    tokens: list[str] = []
    top_logprobs: list[Optional[dict[str, float]]] = []


# vLLM's prompt_logprobs: per prompt token, None for the first one (nothing predicts it), else
# {token id: Logprob} for the actual token and the top-N. The engine's own Logprob dataclass
# encodes as vLLM's {logprob, rank, decoded_token}: the rows go out as the output processor made
# them, never copied on the event loop (tens of thousands of entries for a long prompt).
PromptLogprobs = Optional[list[Optional[dict[int, Logprob]]]]
_TOKEN_IDS = ("token_ids", Optional[list[int]], None)  # vLLM's return_token_ids
_PROMPT_TOKEN_IDS = ("prompt_token_ids", Optional[list[int]], None)
_PROMPT_LOGPROBS = ("prompt_logprobs", PromptLogprobs, None)
_PROMPT_TEXT = ("prompt_text", Optional[str], None)  # vLLM's return_prompt_text


def _choice(name: str, body: tuple[str, Any], logprobs: Any, extra: tuple = ()) -> type[Struct]:
    """A choice in OpenAI's field order: ``index``, its body (text, message or delta), ``logprobs``,
    ``finish_reason``, ``stop_reason`` (vLLM's extra), then ``extra`` (vLLM's optional fields)."""
    return msgspec.defstruct(
        name,
        [
            ("index", int),
            body,
            ("logprobs", Optional[logprobs], None),
            ("finish_reason", Optional[str], None),
            ("stop_reason", Union[int, str, None], None),
            *extra,
        ],
        module=__name__,
    )


def _response(name: str, choice: type[Struct], object_: str, extra: tuple = ()) -> type[Struct]:
    """A response or stream chunk: ``id, created, model, choices, object, usage``, in that order,
    then ``extra``."""
    return msgspec.defstruct(
        name,
        [
            ("id", str),
            ("created", int),
            ("model", str),
            ("choices", list[choice]),
            ("object", str, object_),
            ("usage", Optional[UsageInfo], None),
            *extra,
        ],
        module=__name__,
    )


class ChatLogProb(Struct):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = []


class ChatLogProbs(Struct):
    content: Optional[list[ChatLogProbsContent]] = None


class ChatResponseMessage(Struct, omit_defaults=True):
    role: str
    content: Optional[str]  # null when the reply is only tool calls (or only reasoning)
    tool_calls: list[ToolCall] = []
    # --reasoning-parser: the reply's thinking, under both of vLLM's names (same text)
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class DeltaFunctionCall(Struct, omit_defaults=True):
    name: Optional[str] = None
    arguments: Optional[str] = None


class DeltaToolCall(Struct, omit_defaults=True):
    """A streamed call: its first delta carries ``id``, ``type`` and the whole ``name``; later
    ones pieces of ``arguments``, which concatenate to the JSON object."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: Optional[DeltaFunctionCall] = None


class DeltaMessage(Struct, omit_defaults=True):
    role: Optional[str] = None
    content: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None
    reasoning_content: Optional[str] = None  # as ChatResponseMessage's
    reasoning: Optional[str] = None


CompletionChoice = _choice(
    "CompletionChoice", ("text", str), CompletionLogProbs, (_PROMPT_LOGPROBS, _PROMPT_TOKEN_IDS, _TOKEN_IDS)
)
CompletionResponse = _response("CompletionResponse", CompletionChoice, "text_completion")
ChatChoice = _choice("ChatChoice", ("message", ChatResponseMessage), ChatLogProbs, (_TOKEN_IDS,))
ChatCompletionResponse = _response(
    "ChatCompletionResponse", ChatChoice, "chat.completion", (_PROMPT_LOGPROBS, _PROMPT_TOKEN_IDS, _PROMPT_TEXT)
)
ChatStreamChoice = _choice("ChatStreamChoice", ("delta", DeltaMessage), ChatLogProbs, (_TOKEN_IDS,))
ChatCompletionChunk = _response(
    "ChatCompletionChunk", ChatStreamChoice, "chat.completion.chunk", (_PROMPT_TOKEN_IDS, _PROMPT_TEXT)
)


class ModelCard(Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "ringllm"
    root: Optional[str] = None
    parent: Optional[str] = None  # a LoRA adapter's base model (vLLM's)


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(Struct):
    prompt: str


class EmbeddingData(Struct, kw_only=True):
    object: str = "embedding"
    index: int
    embedding: Union[list[float], str]  # a list of floats, or base64 of little-endian float32


class EmbeddingUsage(Struct):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingResponse(Struct, kw_only=True):
    id: Optional[str] = None  # vLLM's: embd-{request id}
    object: str = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
