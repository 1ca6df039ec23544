"""Where ringllm stands on every request field vLLM's OpenAI server knows: implemented, refused,
or accepted as a no-op with the reason written beside it. A request field is a promise, so none
is dropped in silence.

An implemented field is one the request struct declares. ``PLACEMENT`` places the others, each
name of ``vllm_fields.VLLM_FIELDS`` that is not implemented (the test suite fails on one placed
nowhere, and keeps its own record of which tests prove each implemented field), and is what
``check_undeclared`` acts on for the fields of a body that the request struct does not declare:

- a **refused** field sent with a value that asks for something is a 400 naming it (its vLLM
  default, or another value that asks nothing, passes);
- a **no-op** field is accepted as it is;
- a name vLLM does not know either is ignored, with one warning in the server log per name, as
  vLLM warns ("The following fields were present in the request but ignored").

A refused field that the struct does declare (``suffix``, ``dimensions``) is refused by the
serving code itself; the test suite sends every refused field's ``example`` and expects its 400,
so either way the list and the server cannot disagree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Union

import msgspec

from engine.entrypoints.openai.errors import OpenAIError
from engine.sampling_params import VLLM_NO_OP_FIELDS, VLLM_UNSUPPORTED_FIELDS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refused:
    example: Any  # a value that asks for something: answered with a 400 naming the field
    inert: tuple = (None,)  # values that ask for nothing (vLLM's default): accepted
    why: str = ""  # said in the 400 after "is not supported"


@dataclass(frozen=True)
class NoOp:
    reason: str


Placement = Union[Refused, NoOp]

# What /v1/completions and /v1/chat/completions share.
_GENERATION: dict[str, Placement] = {
    "user": NoOp(
        "informational: OpenAI's end-user id for abuse monitoring; it changes no output (vLLM ignores it too)"
    ),
    "session_id": NoOp("informational: groups related requests; nothing here routes or caches by session"),
    "spaces_between_special_tokens": NoOp(
        "ringllm decodes with fast (tokenizers) tokenizers only, which put no "
        "spaces around special tokens whatever the flag says"
    ),
    "return_token_offsets": NoOp(
        "honoured by vLLM only on its /render endpoints; ignored on generation endpoints, as vLLM does"
    ),
    "return_mm_kwargs": NoOp(
        "honoured by vLLM only on its /render endpoints, for multimodal inputs; ignored on "
        "generation endpoints, as vLLM does"
    ),
    # Refused: nothing in ringllm carries them out.
    "watermarking": Refused(True, (None, False)),
    "logprob_token_ids": Refused([1, 2]),
    "routed_experts_prompt_start": Refused(1, (None, 0), "(no mixture-of-experts models here)"),
    "kv_transfer_params": Refused(
        {"do_remote_prefill": True},
        (None, {}),
        "per request (KV transfer is configured per engine: --kv-transfer-config)",
    ),
    "ec_transfer_params": Refused({"x": 1}, (None, {})),
    "vllm_xargs": Refused({"x": 1}, (None, {}), "(no custom extensions are loaded)"),
    "repetition_detection": Refused({"max_pattern_size": 4, "min_count": 3}),
    "thinking_token_budget": Refused(16, (None, -1), "(no reasoning models here)"),
}

COMPLETION: dict[str, Placement] = {
    **_GENERATION,
    "suffix": Refused("!", (None, ""), "(no model here has a fill-in-the-middle template)"),
    "prompt_embeds": Refused("AAAA", (None, [])),
}

CHAT: dict[str, Placement] = {
    **_GENERATION,
    "media_io_kwargs": Refused({"image": {}}, (None, {}), "(text models only)"),
    "mm_processor_kwargs": Refused({"x": 1}, (None, {}), "(text models only)"),
}

EMBEDDING: dict[str, Placement] = {
    "user": _GENERATION["user"],
    "dimensions": Refused(8, (None,), "(no model here has matryoshka representations)"),
    "padding": Refused("max_length", (None, "do_not_pad")),
    "mm_processor_kwargs": Refused({"x": 1}, (None, {}), "(text models only)"),
}

# vLLM's PoolingBasicRequestMixin + ClassifyRequestMixin: what every pooling and scoring route takes.
POOLING_BASIC: dict[str, Placement] = {
    "user": _GENERATION["user"],
    "padding": EMBEDDING["padding"],
    "mm_processor_kwargs": EMBEDDING["mm_processor_kwargs"],
}

_NOT_ON_RESPONSES = "on /v1/responses (use /v1/chat/completions)"

RESPONSES: dict[str, Placement] = {
    "user": _GENERATION["user"],
    "session_id": _GENERATION["session_id"],
    "include_reasoning": NoOp("a reasoning item is always answered (with --reasoning-parser)"),
    "prompt_cache_key": NoOp(
        "a routing hint for OpenAI's prompt cache; ringllm's prefix cache finds shared "
        "prefixes by their tokens, with no key (vLLM ignores it too)"
    ),
    "include": Refused(["message.output_text.logprobs"], (None, []), "(no include value can be filled here)"),
    "max_tool_calls": Refused(1),
    "prompt": Refused({"id": "pmpt_1"}, (None,), "(no stored prompt templates here)"),
    "service_tier": Refused("flex", (None, "auto", "default"), "(one tier here)"),
    "top_logprobs": Refused(2, (None, 0), _NOT_ON_RESPONSES),
    "truncation": Refused("auto", (None, "disabled"), "(a prompt too long for the context is a 400)"),
    "top_k": Refused(5, (None, -1), _NOT_ON_RESPONSES),
    "skip_special_tokens": Refused(False, (True,), _NOT_ON_RESPONSES),
    "include_stop_str_in_output": Refused(True, (False,), _NOT_ON_RESPONSES),
    "presence_penalty": Refused(1.0, (None, 0.0), _NOT_ON_RESPONSES),
    "frequency_penalty": Refused(1.0, (None, 0.0), _NOT_ON_RESPONSES),
    "repetition_penalty": Refused(1.5, (None, 1.0), _NOT_ON_RESPONSES),
    "stop": Refused(["x"], (None, []), _NOT_ON_RESPONSES),
    "structured_outputs": Refused({"json": {"type": "object"}}, (None,), "(use text.format)"),
    "chat_template_kwargs": Refused({"x": 1}, (None, {}), _NOT_ON_RESPONSES),
    "request_id": Refused("r1", (None,), _NOT_ON_RESPONSES),
    "priority": Refused(1, (0,), _NOT_ON_RESPONSES),
    "cache_salt": Refused("salt", (None,), _NOT_ON_RESPONSES),
    "enable_response_messages": Refused(True, (False,)),
    "previous_input_messages": Refused([{"role": "user", "content": "x"}], (None, []), "(use previous_response_id)"),
    "watermarking": _GENERATION["watermarking"],
    "media_io_kwargs": CHAT["media_io_kwargs"],
    "mm_processor_kwargs": CHAT["mm_processor_kwargs"],
    "vllm_xargs": _GENERATION["vllm_xargs"],
    "kv_transfer_params": _GENERATION["kv_transfer_params"],
    "ec_transfer_params": _GENERATION["ec_transfer_params"],
    # OpenAI's, which vLLM does not list: refused rather than ignored, since each asks for something.
    "conversation": Refused("conv_1", (None,), "(use previous_response_id)"),
    "context_management": Refused([{"type": "compaction"}], (None, [])),
}

MESSAGES: dict[str, Placement] = {
    "metadata": NoOp(
        "Anthropic's user_id for abuse detection; it changes no output (Anthropic's own generation ignores it too)"
    ),
    "kv_transfer_params": _GENERATION["kv_transfer_params"],
    # Anthropic's, which vLLM does not list: refused rather than ignored, since each asks for something.
    "thinking": Refused(
        {"type": "enabled", "budget_tokens": 1024}, (None, {"type": "disabled"}), "(no reasoning parser runs here)"
    ),
    "container": Refused("container_1", (None,), "(no code execution containers here)"),
    "mcp_servers": Refused(
        [{"type": "url", "url": "https://example.com/mcp", "name": "x"}], (None, []), "(no MCP connector here)"
    ),
    "context_management": Refused({"edits": [{"type": "clear_tool_uses_20250919"}]}, (None, {})),
    "service_tier": NoOp("one service tier here: auto and standard_only both ask for what every request gets"),
    "cache_control": NoOp(
        "the prefix cache reuses every shared prefix by itself; a cache marker asks for nothing more"
    ),
    "inference_geo": NoOp("where the request runs: on this server, wherever it is asked for"),
    "user_profile_id": NoOp("informational: who the request is made for; it changes no output"),
    "workspace_id": NoOp("informational: Anthropic's workspaces; this server has one"),
    "diagnostics": Refused({"previous_message_id": "msg_1"}, (None,), "(no prompt-cache diagnostics here)"),
    "speed": Refused("fast", (None, "standard"), "(one speed here)"),
}

COUNT_TOKENS: dict[str, Placement] = {
    "thinking": MESSAGES["thinking"],
    "mcp_servers": MESSAGES["mcp_servers"],
    "context_management": MESSAGES["context_management"],
}

SAMPLING_PARAMS: dict[str, Placement] = {
    "spaces_between_special_tokens": _GENERATION["spaces_between_special_tokens"],
    **{name: Refused("any value but vLLM's default", (default,)) for name, default in VLLM_UNSUPPORTED_FIELDS.items()},
    **{name: NoOp(reason) for name, reason in VLLM_NO_OP_FIELDS.items()},
}

PLACEMENT: dict[str, dict[str, Placement]] = {
    "ChatCompletionRequest": CHAT,
    "CompletionRequest": COMPLETION,
    "EmbeddingRequest": EMBEDDING,
    "StreamOptions": {},
    "SamplingParams": SAMPLING_PARAMS,
    "ResponsesRequest": RESPONSES,
    "PoolingRequest": EMBEDDING,
    "ClassificationRequest": POOLING_BASIC,
    "ScoreRequest": POOLING_BASIC,
    "RerankRequest": POOLING_BASIC,
    "AnthropicMessagesRequest": MESSAGES,
    "AnthropicCountTokensRequest": COUNT_TOKENS,
}

# At most this many distinct unknown names are warned about, so that clients sending random
# names cannot grow the set (or the log) without bound.
_MAX_WARNED = 256
_warned: set[str] = set()


def _same(value: Any, inert: Any) -> bool:
    """JSON equality, where true is not 1 (Python's ``True == 1``)."""
    return value == inert and isinstance(value, bool) == isinstance(inert, bool)


def _raw_keys(body: bytes) -> dict[str, msgspec.Raw]:
    """The top-level keys of a JSON object body, values left undecoded (a cheap scan)."""
    return msgspec.json.decode(body, type=dict[str, msgspec.Raw])


def check_undeclared(body: bytes, type_: type) -> None:
    """Act on the fields of ``body`` that ``type_`` (a request struct that already decoded it)
    does not declare: 400 for a refused one asking for something, a warning for an unknown name.
    """
    placement = PLACEMENT.get(type_.__name__, {})
    declared = set(type_.__struct_fields__)
    unknown = []
    for name, raw in _raw_keys(body).items():
        if name in declared:
            continue
        place = placement.get(name)
        if isinstance(place, Refused):
            try:
                value = msgspec.json.decode(raw)
            except RecursionError:  # nested too deeply to be an inert value
                value = place.example
            if not any(_same(value, inert) for inert in place.inert):
                reason = f" {place.why}" if place.why else ""
                raise OpenAIError(
                    400, f"{name} is not supported by this server{reason}", param=name, code="unsupported_field"
                )
        elif place is None:
            unknown.append(name)
    fresh = [name for name in unknown if name not in _warned]
    if fresh and len(_warned) < _MAX_WARNED:
        _warned.update(fresh)
        logger.warning("The following fields were present in the request but ignored: %s", set(fresh))
