"""The two checks every config field shares, so that each refusal reads the same: a ValueError
naming the field, what is allowed and what was given."""

from __future__ import annotations

from typing import Any, Optional


def bad_value(field_name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"{field_name} must be {allowed}, got {value!r}")


def positive_int(name: str, value: Any, low: int = 1, high: Optional[int] = None) -> int:
    """``value`` if it is an int (not a bool) in [low, high], else the ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise bad_value(name, f"an int {rng}", value)
    return value
