"""``structured_outputs_config``: the engine-wide choice of backend (vLLM's field), validated in
the frontend before any process starts. Plain data: it travels to the core in EngineArgs."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

BACKENDS = ("auto", "xgrammar", "guidance")


@dataclass(frozen=True)
class StructuredOutputsConfig:
    # auto: xgrammar, and guidance for what xgrammar cannot take (vLLM's rule). "llguidance" is
    # accepted as another name of "guidance".
    backend: str = "auto"
    disable_fallback: bool = False  # auto: a spec xgrammar cannot compile fails instead of going to guidance
    disable_any_whitespace: bool = False  # the default for requests (JSON without free whitespace)
    disable_additional_properties: bool = False  # the default for requests (guidance: closed objects)
    # A request whose grammar has not compiled after this long fails with an error; the compile
    # pool thread finishes the compile in the background and its result is cached.
    compile_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.backend == "llguidance":
            object.__setattr__(self, "backend", "guidance")
        if self.backend not in BACKENDS:
            raise _bad("backend", f"one of {', '.join(BACKENDS)}", self.backend)
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "a bool", getattr(self, name))
        t = self.compile_timeout_s
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t < float("inf"):
            raise _bad("compile_timeout_s", "a finite number of seconds > 0", t)


def resolve_structured_outputs_config(value: Any) -> StructuredOutputsConfig:
    """None, a dict of the fields above, or a StructuredOutputsConfig; ValueError naming the field."""
    if value is None:
        return StructuredOutputsConfig()
    if isinstance(value, StructuredOutputsConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"structured_outputs_config must be a dict or StructuredOutputsConfig, got {value!r}")
    known = {f.name for f in fields(StructuredOutputsConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"structured_outputs_config: unknown field(s) {', '.join(map(str, unknown))}; "
                         f"known: {', '.join(sorted(known))}")
    return StructuredOutputsConfig(**value)


def _bad(name: str, allowed: str, value: Optional[Any]) -> ValueError:
    return ValueError(f"structured_outputs_config.{name} must be {allowed}, got {value!r}")
