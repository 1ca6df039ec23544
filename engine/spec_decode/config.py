"""``speculative_config``: vLLM's speculative decoding settings, validated in the frontend by
``create_engine_config`` before any process starts, and carried to the EngineCore with the other
EngineArgs as a plain JSON object.

    LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 5})

Only vLLM's n-gram prompt lookup runs today. A draft model (``method: "draft_model"`` or a
``model`` path, vLLM's other spelling of it) is refused by name as not yet supported, and so is
any key vLLM has that ringllm does not carry out: a setting is done as asked or refused.
It imports nothing of the engine (config.py reads it at module level).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

METHODS = ("ngram",)
NOT_YET = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "suffix")
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size")

# Bounds that keep a step's work bounded: the lookup compares up to prompt_lookup_max tokens per
# candidate position, and a step verifies at most 1 + MAX_SPECULATIVE_TOKENS tokens per request.
MAX_SPECULATIVE_TOKENS = 32
MAX_LOOKUP = 64
DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min/max when neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    # No drafts in a step whose running batch has at least this many requests (vLLM's name): a
    # large batch already reads the weights once for many tokens. None: always speculate.
    disable_by_batch_size: Optional[int] = None


def resolve_speculative_config(value: Any) -> Optional[SpeculativeConfig]:
    """None (no speculation), a dict of vLLM's keys, or a SpeculativeConfig; ValueError naming the
    key for anything unknown, unsupported or out of range."""
    if value is None:
        return None
    if isinstance(value, SpeculativeConfig):
        value = {k: getattr(value, k) for k in KEYS}
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config must be a dict (a JSON object), got {value!r}")
    if value.get("model") is not None or value.get("method") in NOT_YET:
        raise ValueError(f"speculative_config: a draft model (method {value.get('method')!r}, model "
                         f"{value.get('model')!r}) is not yet supported; supported: method 'ngram' (prompt lookup)")
    unknown = sorted(str(k) for k in value if k not in KEYS and not (k == "model" and value[k] is None))
    if unknown:
        raise ValueError(f"speculative_config: {', '.join(unknown)} not supported; supported keys: {', '.join(KEYS)}")
    method = value.get("method")
    if method not in METHODS:
        raise _bad("method", f"one of {METHODS}", method)
    k = _int("num_speculative_tokens", value.get("num_speculative_tokens"), 1, MAX_SPECULATIVE_TOKENS)
    low, high = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = DEFAULT_LOOKUP
    low = _int("prompt_lookup_min", high if low is None else low, 1, MAX_LOOKUP)
    high = _int("prompt_lookup_max", low if high is None else high, low, MAX_LOOKUP)
    batch = value.get("disable_by_batch_size")
    if batch is not None:
        batch = _int("disable_by_batch_size", batch, 1, None)
    return SpeculativeConfig(method, k, low, high, batch)


def _int(name: str, value: Any, low: int, high: Optional[int]) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        raise _bad(name, f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}", value)
    return value


def _bad(name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"speculative_config.{name} must be {allowed}, got {value!r}")
