"""Per-request sampling settings, with vLLM's field names and defaults.

A msgspec Struct (not a dataclass) because it crosses the ring inside every ADD
message; validation lives in ``__post_init__`` so a bad value is refused in the
caller's process, with the field named, before anything is sent.
"""
from __future__ import annotations

import enum
from typing import Optional, Union

import msgspec

_SAMPLING_EPS = 1e-5


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0  # every output carries everything generated so far
    DELTA = 1  # every output carries only what is new since the last one
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled in by the frontend from the tokenizer / generation config, not by users.
    all_stop_token_ids: list[int] = []

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.top_k == -1:
            self.top_k = 0
        self.verify()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the other knobs cannot change the argmax.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def verify(self) -> None:
        """Raise ValueError naming the first field out of range (also run on construction and decode)."""
        def bad(field: str, allowed: str, value) -> ValueError:
            return ValueError(f"SamplingParams.{field} must be {allowed}, got {value!r}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an int >= 1", self.n)
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]", self.presence_penalty)
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", "in (0, 2]", self.repetition_penalty)
        if not self.temperature >= 0.0:  # also refuses NaN
            raise bad("temperature", "non-negative", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]", self.top_p)
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "-1, 0 (disabled) or a positive int", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]", self.min_p)
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "an int >= 1", self.max_tokens)
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "an int >= 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens={self.max_tokens}", self.min_tokens)
        if self.logprobs is not None and self.logprobs < 0:
            raise bad("logprobs", "non-negative", self.logprobs)
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise bad("prompt_logprobs", "non-negative", self.prompt_logprobs)
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "an int", self.seed)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a non-empty string or a list of them", self.stop)
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of non-negative ints", self.stop_token_ids)

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
