"""``structured_outputs_config``: the engine-wide choice of backend (vLLM's field), validated in
the frontend before any process starts. Plain data: it travels to the core in EngineArgs."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

BACKENDS = ("auto", "xgrammar", "guidance")

# Limits (README, "Structured outputs"), set from compile times (benchmarks/RESULTS.md, "Kernel
# choices"): xgrammar's grow steeply with a spec's size, to seconds and hundreds of MB for large
# enums, where llguidance's stay small; and bytes are only a proxy for xgrammar's cost (a short
# regex with a large repeat count takes about a second).
MAX_SPEC_BYTES = 1 << 20  # a constraint (schema text, regex, grammar, choices, tag) longer is refused
LARGE_SPEC_BYTES = 64 << 10  # a larger spec compiles on the large lane; under auto, never in xgrammar
MAX_QUEUED_COMPILES = 8  # per lane of the compile pool: past it a request is refused (or stays on llguidance)
MAX_CACHED_GRAMMAR_BYTES = 256 << 20  # the core's compiled grammars, by their own memory figure
MAX_VALIDATED_BYTES = 4 << 20  # the frontend's cache of checked specs (a digest and the error each)
MAX_KNOWN_SLOW = 4096  # specs remembered as slower than compile_timeout_s to compile: never retried


@dataclass(frozen=True)
class StructuredOutputsConfig:
    # auto: xgrammar, and guidance for what xgrammar cannot take (vLLM's rule) or should not (a spec
    # over LARGE_SPEC_BYTES); a request starts on guidance's grammar meanwhile (compile_pool.py).
    # "llguidance" is accepted as another name of "guidance".
    backend: str = "auto"
    disable_fallback: bool = False  # auto: a spec xgrammar cannot compile fails instead of going to guidance
    disable_any_whitespace: bool = False  # the default for requests (JSON without free whitespace)
    disable_additional_properties: bool = False  # the default for requests (guidance: closed objects)
    # A request whose grammar has not compiled after this long fails with an error; the compile
    # lane finishes the compile in the background (its result is cached), and a spec known to take
    # this long is never compiled again.
    compile_timeout_s: float = 10.0
    # ``--reasoning-parser``'s markers (reasoning.py): a grammar applies only after the end marker
    # in the output, or from the start when the prompt already closed reasoning. "": no reasoning.
    reasoning_start: str = ""
    reasoning_end: str = ""

    def __post_init__(self) -> None:
        if self.backend == "llguidance":
            object.__setattr__(self, "backend", "guidance")
        if self.backend not in BACKENDS:
            raise _bad("backend", f"one of {', '.join(BACKENDS)}", self.backend)
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "a bool", getattr(self, name))
        for name in ("reasoning_start", "reasoning_end"):
            if not isinstance(getattr(self, name), str):
                raise _bad(name, "a string", getattr(self, name))
        if self.reasoning_start and not self.reasoning_end:
            raise _bad("reasoning_end", "set with reasoning_start", self.reasoning_end)
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
        raise ValueError(
            f"structured_outputs_config: unknown field(s) {', '.join(map(str, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return StructuredOutputsConfig(**value)


def _bad(name: str, allowed: str, value: Optional[Any]) -> ValueError:
    return ValueError(f"structured_outputs_config.{name} must be {allowed}, got {value!r}")
