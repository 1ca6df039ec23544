"""Per-request sampling settings, with vLLM's field names and defaults.

A msgspec Struct (not a dataclass) because it crosses the ring inside every ADD
message; validation lives in ``__post_init__`` so a bad value is refused in the
caller's process, with the field named, before anything is sent.
"""

from __future__ import annotations

import copy
import enum
import math
import numbers
from typing import Any, Optional, Union

import msgspec

from engine.exceptions import ParameterError
from engine.structured_output.params import StructuredOutputsParams

__all__ = ["BeamSearchParams", "RequestOutputKind", "SamplingParams", "SamplingType", "StructuredOutputsParams"]

_SAMPLING_EPS = 1e-5
# Stop strings are ringllm's bound (vLLM documents none; OpenAI allows 4): every new piece of
# text is searched for each of them, so their number and length bound the work a request adds
# to each step of the event loop (engine/frontend/detokenizer.py).
MAX_STOP_STRINGS = 256
MAX_STOP_STRING_CHARS = 1024
# bad_words are ringllm's bound too (vLLM has none): each is tokenized twice by the frontend, and
# every step of the core tries each resulting sequence against the output's tail in Python.
MAX_BAD_WORDS = 1024
# Every int crosses the wire as msgpack and lands in int64 tensors: keep it in that range.
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs")
_FLOAT_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p")
_BOOL_FIELDS = (
    "ignore_eos",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
)


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0  # every output carries everything generated so far
    DELTA = 1  # every output carries only what is new since the last one
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


# vLLM SamplingParams fields ringllm does not carry, with vLLM's default: any other value is a
# ValueError naming the field (a name vLLM does not have stays msgspec's TypeError, as in vLLM).
VLLM_UNSUPPORTED_FIELDS: dict[str, Any] = {
    "prompt_logprob_token_ids": None,
    "prompt_logprob_start": None,
    "logprob_token_ids": None,
    "flat_logprobs": False,
    "extra_args": None,
    "thinking_token_budget": None,
    "repetition_detection": None,
    "routed_experts_prompt_start": 0,
    "trace_decode_token_ids": None,
}
# vLLM SamplingParams fields that ask nothing of ringllm: accepted and dropped, for this reason.
VLLM_NO_OP_FIELDS: dict[str, str] = {
    "skip_clone": "a hint that the object need not be copied; ringllm copies the params it changes",
    "output_text_buffer_length": "derived from the stop strings by the engine (vLLM sets it itself too)",
}


class _VLLMKeywords(type(msgspec.Struct)):
    """Constructing SamplingParams with a vLLM field ringllm does not carry fails with a
    ValueError that names it, instead of msgspec's TypeError for an unknown keyword."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        for name in [k for k in kwargs if k in VLLM_NO_OP_FIELDS]:
            del kwargs[name]
        for name in [k for k in kwargs if k in VLLM_UNSUPPORTED_FIELDS]:
            if kwargs[name] != VLLM_UNSUPPORTED_FIELDS[name]:
                raise ParameterError(
                    f"SamplingParams.{name} is not supported by ringllm", parameter=name, value=kwargs[name]
                )
            del kwargs[name]
        return super().__call__(*args, **kwargs)


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, metaclass=_VLLMKeywords):
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled; above the vocabulary size: no effect
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None  # top-N per sampled token; -1: the whole vocabulary
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled in by the frontend from the tokenizer / generation config, not by users.
    all_stop_token_ids: list[int] = []
    # Logit controls and structured outputs (vLLM's fields; engine/worker/logit_controls.py,
    # engine/structured_output/).
    logit_bias: Optional[dict[int, float]] = None  # token id -> added to its logit, in [-100, 100]
    allowed_token_ids: Optional[list[int]] = None  # only these may be sampled
    bad_words: Optional[list[str]] = None  # never generated (as token sequences)
    structured_outputs: Optional[StructuredOutputsParams] = None
    # Filled in by the frontend: each bad word tokenized with and without a leading space.
    bad_words_token_ids: list[list[int]] = []
    # Keep only this many prompt tokens (-1: max_model_len), cut from ``truncation_side``: "left"
    # (the default, as vLLM) keeps the last ones, "right" the first ones. Applied by the frontend.
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: Optional[str] = None
    # Streamed outputs (AsyncLLM.generate) carry at least this many new tokens each, the first
    # and the last excepted (vLLM's stream_interval; None: each as it comes).
    stream_interval: Optional[int] = None
    # vLLM's: compute the whole prompt, reading nothing from the prefix cache (prompt_logprobs
    # requests never read it anyway); what it computes is still cached for others.
    skip_reading_prefix_cache: Optional[bool] = None

    def __post_init__(self) -> None:
        """Normalise the shorthands, then validate. Runs on construction, on
        ``msgspec.structs.replace`` and on decode, so every copy is checked again, except the
        engine's own ``verified_copy``."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, (list, tuple)):
            self.stop_token_ids = _as_ints(self.stop_token_ids)
        for name in _INT_FIELDS:
            setattr(self, name, _as_int(getattr(self, name)))
        for name in _FLOAT_FIELDS:
            setattr(self, name, _as_float(name, getattr(self, name)))
        if self.top_k == -1:
            self.top_k = 0
        if not isinstance(self.output_kind, RequestOutputKind):
            self.output_kind = _as_output_kind(self.output_kind)
        if isinstance(self.logit_bias, dict):
            self.logit_bias = {_as_int(t): _as_float("logit_bias", b) for t, b in self.logit_bias.items()}
        if isinstance(self.allowed_token_ids, tuple):
            self.allowed_token_ids = list(self.allowed_token_ids)
        if isinstance(self.allowed_token_ids, list):
            self.allowed_token_ids = _as_ints(self.allowed_token_ids)
        if isinstance(self.bad_words, (str, tuple)):
            self.bad_words = [self.bad_words] if isinstance(self.bad_words, str) else list(self.bad_words)
        self.verify()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the other knobs cannot change the argmax.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def verify(self) -> None:
        """Raise ParameterError naming the first field out of range or of the wrong type.

        Everything that crosses the wire to the core is checked here, exactly: ints are ints
        (not bools) within int64, floats are finite, flags are bools. A value that passes
        can be encoded, decoded by the core and executed by its sampler.
        """
        _int("n", self.n, low=1)
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, low_open=True)
        _float_in("temperature", self.temperature, 0.0)
        _float_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _int("top_k", self.top_k, low=0, allowed="-1 or 0 (disabled), or a positive int below 2**63")
        _float_in("min_p", self.min_p, 0.0, 1.0)
        _optional_int("seed", self.seed, low=_INT64_MIN)
        _optional_int("max_tokens", self.max_tokens, low=1)
        _int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _bad("min_tokens", f"<= max_tokens={self.max_tokens}", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):  # a bool is refused: logprobs=True means no count
            _optional_int(
                name,
                getattr(self, name),
                low=-1,
                allowed="None, or an int: -1 (the whole vocabulary), 0 or a count below 2**63",
            )
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP_STRINGS:  # first: O(1) for a huge list
            raise ParameterError(
                f"SamplingParams.stop: at most {MAX_STOP_STRINGS} stop strings of at most "
                f"{MAX_STOP_STRING_CHARS} characters each, got {len(self.stop)}",
                parameter="stop",
            )
        if not isinstance(self.stop, list) or any(not isinstance(s, str) or not s for s in self.stop):
            raise _bad("stop", "a non-empty string or a list of them", self.stop)
        if any(len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise ParameterError(
                f"SamplingParams.stop: at most {MAX_STOP_STRINGS} stop strings of at most "
                f"{MAX_STOP_STRING_CHARS} characters each, got one of "
                f"{max(map(len, self.stop))} characters",
                parameter="stop",
            )
        _token_ids("stop_token_ids", self.stop_token_ids)
        _token_ids("all_stop_token_ids", self.all_stop_token_ids)
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "a bool", getattr(self, name))
        if not isinstance(self.output_kind, RequestOutputKind):
            raise _bad("output_kind", "a RequestOutputKind", self.output_kind)
        self._verify_logit_controls()
        verify_truncation(self.truncate_prompt_tokens, self.truncation_side, "SamplingParams")
        _optional_int("stream_interval", self.stream_interval, low=1)
        if self.skip_reading_prefix_cache is not None and not isinstance(self.skip_reading_prefix_cache, bool):
            raise _bad("skip_reading_prefix_cache", "a bool or None", self.skip_reading_prefix_cache)

    def _verify_logit_controls(self) -> None:
        """logit_bias, allowed_token_ids, bad_words and structured_outputs; token ids are checked
        against the vocabulary by the input processor, which knows it."""
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                _is_int(t)
                and 0 <= t <= _INT64_MAX
                and isinstance(b, (int, float))
                and not isinstance(b, bool)
                and math.isfinite(b)
                and -100.0 <= b <= 100.0
                for t, b in self.logit_bias.items()
            ):
                raise _bad(
                    "logit_bias",
                    "a dict of token id -> bias, each bias a finite number in [-100, 100]",
                    self.logit_bias,
                )
        if self.allowed_token_ids is not None:
            _token_ids("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise _bad("allowed_token_ids", "a non-empty list of token ids (or None)", self.allowed_token_ids)
        if isinstance(self.bad_words, list) and len(self.bad_words) > MAX_BAD_WORDS:  # first: O(1) for a huge list
            raise ParameterError(
                f"SamplingParams.bad_words: at most {MAX_BAD_WORDS} words, got {len(self.bad_words)}",
                parameter="bad_words",
            )
        if self.bad_words is not None and (
            not isinstance(self.bad_words, list) or not all(isinstance(w, str) and w.strip() for w in self.bad_words)
        ):
            raise _bad("bad_words", "a list of non-empty strings", self.bad_words)
        if not isinstance(self.bad_words_token_ids, list) or not all(
            isinstance(w, list) and w and all(_is_int(t) and t >= 0 for t in w) for w in self.bad_words_token_ids
        ):
            raise _bad("bad_words_token_ids", "a list of non-empty lists of token ids", self.bad_words_token_ids)
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise _bad("structured_outputs", "a StructuredOutputsParams", self.structured_outputs)
            self.structured_outputs.verify()

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    def clone(self) -> "SamplingParams":
        return msgspec.structs.replace(self)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__struct_fields__)
        return f"SamplingParams({fields})"


class BeamSearchParams(msgspec.Struct, omit_defaults=True):
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False


def verified_copy(params: SamplingParams, **changes: Any) -> SamplingParams:
    """``params`` with ``changes``, neither normalised nor verified again (``msgspec.structs.replace``
    would run ``__post_init__``, ~20 us): for the engine's own copies, made before admission
    (which verifies what it is given) or after it with changes that keep verified params valid,
    such as the n children of a request (n=1, a seed the frontend checked). Validation then runs
    once on each side of the ring: ``verify`` at admission in the frontend, the decode in the core."""
    params = copy.copy(params)
    for name, value in changes.items():
        setattr(params, name, value)
    return params


def verify_truncation(truncate_prompt_tokens: Any, truncation_side: Any, owner: str) -> None:
    """truncate_prompt_tokens: None, -1 (the model's context) or a positive int; truncation_side:
    None, "left" or "right" (shared with PoolingParams)."""
    k = truncate_prompt_tokens
    if k is not None and not (_is_int(k) and (k == -1 or 1 <= k <= _INT64_MAX)):
        raise ParameterError(
            f"{owner}.truncate_prompt_tokens must be None, -1 (the model's context length) or a "
            f"positive int, got {_show(k)}",
            parameter="truncate_prompt_tokens",
            value=k,
        )
    if truncation_side not in (None, "left", "right"):
        raise ParameterError(
            f"{owner}.truncation_side must be None, 'left' or 'right', got {_show(truncation_side)}",
            parameter="truncation_side",
            value=truncation_side,
        )


# ---- validation helpers: each raises ParameterError naming its field ----


def _bad(field: str, allowed: str, value: Any) -> ParameterError:
    return ParameterError(f"SamplingParams.{field} must be {allowed}, got {_show(value)}", parameter=field, value=value)


def _show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut short: a huge int or list must not make a huge message."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"an int of {value.bit_length()} bits"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_int(value: Any) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _int(field: str, value: Any, low: int, allowed: Optional[str] = None) -> None:
    if not _is_int(value) or not low <= value <= _INT64_MAX:
        raise _bad(field, allowed or _int_range(low), value)


def _optional_int(field: str, value: Any, low: int, allowed: Optional[str] = None) -> None:
    # The message is built only for a refusal: verify runs on every request, on both sides.
    if value is not None and not (_is_int(value) and low <= value <= _INT64_MAX):
        raise _bad(field, allowed or f"{_int_range(low)} or None", value)


def _int_range(low: int) -> str:
    return f"an int in [{'-2**63' if low == _INT64_MIN else low}, 2**63)"


def _token_ids(field: str, value: Any) -> None:
    if not isinstance(value, list):
        raise _bad(field, "a list of non-negative ints", value)
    if set(map(type, value)) <= {int}:  # the common case, in C (500,000 ids: ms, not a second)
        if value and (min(value) < 0 or max(value) > _INT64_MAX):
            raise _bad(field, "a list of non-negative ints", value)
    elif not all(_is_int(t) and 0 <= t <= _INT64_MAX for t in value):
        raise _bad(field, "a list of non-negative ints", value)


def ints_only(values: Any) -> bool:
    """Whether every item of ``values`` is an int and none a bool: ``type`` looked up in C for
    the common case (a prompt's ids), a per-item check only when some item is of another type."""
    kinds = set(map(type, values))
    return kinds <= {int} or all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _as_int(value: Any) -> Any:
    """Other integer types (numpy's, for one) become ints, which the wire can carry; a bool
    stays as it is, for ``verify`` to refuse."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (int, bool)):
        return int(value)
    return value


def _as_ints(values: list | tuple) -> list:
    """``_as_int`` of each of ``values``, as a new list; a list of plain ints is only copied
    (its types looked up in C)."""
    return list(values) if set(map(type, values)) <= {int} else [_as_int(t) for t in values]


def _as_float(field: str, value: Any) -> Any:
    """Ints and other real numbers become floats (a huge int would not fit the wire's float
    field); anything that is not a real number is left for ``verify`` to refuse."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, float)):
        try:
            return float(value)
        except OverflowError:
            raise _bad(field, "a finite number", value) from None
    return value


def _float_in(field: str, value: Any, low: float, high: Optional[float] = None, low_open: bool = False) -> None:
    """``value`` must be a finite float, at least ``low`` (above it if ``low_open``) and at
    most ``high`` (no upper bound if None). NaN fails every comparison, so it is refused too."""
    ok = (
        isinstance(value, float)
        and math.isfinite(value)
        and (low < value if low_open else low <= value)
        and (high is None or value <= high)
    )
    if not ok:
        opening = "(" if low_open else "["
        bounds = f"in {opening}{low:g}, {high:g}]" if high is not None else f"{'>' if low_open else '>='} {low:g}"
        raise _bad(field, f"a finite number {bounds}", value)


def _as_output_kind(value: Any) -> Any:
    if _is_int(value):
        try:
            return RequestOutputKind(value)
        except ValueError:
            pass
    raise _bad("output_kind", "a RequestOutputKind", value)
