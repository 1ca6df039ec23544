"""``speculative_config``: vLLM's speculative decoding settings, validated in the frontend by
``create_engine_config`` before any process starts, and carried to the EngineCore with the other
EngineArgs as a plain JSON object.

    LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    LLM(model, speculative_config={"method": "draft_model", "model": "/models/small",
                                   "num_speculative_tokens": 3})

Two methods run: vLLM's n-gram prompt lookup and a draft model (``method: "draft_model"`` with
``model``, or a ``model`` alone, vLLM's other spelling of it; engine/spec_decode/draft_model.py).
Any key vLLM has that ringllm does not carry out is refused by name (EAGLE, MTP, the draft's own
quantization, revision or tokenizer, a tensor-parallel draft): a setting is done as asked or refused.
The draft model's files are read in the frontend with the target's (a vocabulary that differs from
the target's is a ValueError naming ``speculative_config.model``, engine/config/speculative.py).
It imports nothing of the engine (config.py reads it at module level).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

METHODS = ("ngram", "draft_model")
NOT_YET = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "suffix")
KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
    "draft_tensor_parallel_size",
)
NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")

# Bounds that keep a step's work bounded: the lookup compares up to prompt_lookup_max tokens per
# candidate position, and a step verifies at most 1 + MAX_SPECULATIVE_TOKENS tokens per request.
MAX_SPECULATIVE_TOKENS = 32
MAX_LOOKUP = 64
DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min/max when neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: Optional[int] = None  # ngram only
    prompt_lookup_max: Optional[int] = None
    # No drafts in a step whose running batch has at least this many requests (vLLM's name): a
    # large batch already reads the weights once for many tokens. None: always speculate.
    disable_by_batch_size: Optional[int] = None
    model: Optional[str] = None  # draft_model only: a GGUF file or an HF directory, as ``model``
    draft_tensor_parallel_size: int = 1  # the draft runs in the target's process: 1 only


def resolve_speculative_config(value: Any) -> Optional[SpeculativeConfig]:
    """None (no speculation), a dict of vLLM's keys, or a SpeculativeConfig; ValueError naming the
    key for anything unknown, unsupported or out of range."""
    if value is None:
        return None
    if isinstance(value, SpeculativeConfig):
        value = {k: getattr(value, k) for k in KEYS}
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config must be a dict (a JSON object), got {value!r}")
    if value.get("method") in NOT_YET:
        raise ValueError(
            f"speculative_config: method {value['method']!r} is not supported; supported: "
            f"'ngram' (prompt lookup), 'draft_model' (with model)"
        )
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ValueError(f"speculative_config: {', '.join(unknown)} not supported; supported keys: {', '.join(KEYS)}")
    model = value.get("model")
    method = value.get("method") or ("draft_model" if model is not None else None)
    if method not in METHODS:
        raise _bad("method", f"one of {METHODS} (or a model path alone)", method)
    k = _int("num_speculative_tokens", value.get("num_speculative_tokens"), 1, MAX_SPECULATIVE_TOKENS)
    batch = value.get("disable_by_batch_size")
    if batch is not None:
        batch = _int("disable_by_batch_size", batch, 1, None)
    if method == "draft_model":
        if not isinstance(model, str) or not model:
            raise _bad(
                "model", "a draft model's path (a .gguf file or an HF directory) with method 'draft_model'", model
            )
        given = [key for key in NGRAM_KEYS if value.get(key) is not None]
        if given:
            raise ValueError(f"speculative_config: {', '.join(given)} apply to method 'ngram' only")
        _int("draft_tensor_parallel_size", value.get("draft_tensor_parallel_size", 1), 1, 1)
        return SpeculativeConfig(method, k, disable_by_batch_size=batch, model=model)
    if model is not None:
        raise ValueError("speculative_config.model: names a draft model, which method 'ngram' does not use")
    if value.get("draft_tensor_parallel_size", 1) != 1:
        raise _bad(
            "draft_tensor_parallel_size", "1 (and applies to a draft model only)", value["draft_tensor_parallel_size"]
        )
    low, high = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = DEFAULT_LOOKUP
    low = _int("prompt_lookup_min", high if low is None else low, 1, MAX_LOOKUP)
    high = _int("prompt_lookup_max", low if high is None else high, low, MAX_LOOKUP)
    return SpeculativeConfig(method, k, low, high, batch)


def _int(name: str, value: Any, low: int, high: Optional[int]) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        raise _bad(name, f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}", value)
    return value


def _bad(name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"speculative_config.{name} must be {allowed}, got {value!r}")
