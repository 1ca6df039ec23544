"""``StructuredOutputsParams``: what a request asks its output to match (vLLM 0.33's fields).

A msgspec Struct because it crosses the ring inside ``SamplingParams``. Exactly one constraint
is set (``json``, ``regex``, ``choice``, ``grammar``, ``json_object`` or ``structural_tag``);
the other fields tune how a JSON schema becomes a grammar. ``key()`` is the canonical spelling
the core caches compiled grammars by, so the same schema sent by many clients compiles once.
"""

from __future__ import annotations

import hashlib
import json as _json
from typing import Any, Optional, Union

import msgspec

from engine.exceptions import ParameterError
from engine.structured_output.config import MAX_SPEC_BYTES

# The constraint fields, in the order their kinds are named in messages.
CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# ringllm's bound (vLLM has none): both backends' work on a choice grows faster than its length.
# Measured: xgrammar's compile 4,000 choices 0.24 s, 8,000 2.9 s, 16,000 6.7 s (past the core's
# compile timeout); llguidance's validation of the frontend, quadratic in the number of
# alternatives, 10,000 0.07 s, 20,000 0.24 s (80,000 took ~16 s).
MAX_CHOICES = 4096


class StructuredOutputsParams(msgspec.Struct, array_like=True, omit_defaults=True):
    json: Optional[Union[str, dict]] = None  # a JSON schema, as a dict or its JSON text
    regex: Optional[str] = None
    choice: Optional[list[str]] = None  # the output is exactly one of these strings
    grammar: Optional[str] = None  # EBNF (GBNF) or Lark
    json_object: Optional[bool] = None  # any JSON object
    disable_fallback: bool = False  # accepted for vLLM compatibility; there is no fallback to skip
    disable_any_whitespace: bool = False  # JSON without free whitespace between tokens
    disable_additional_properties: bool = False  # a schema's objects allow no property it does not name
    whitespace_pattern: Optional[str] = None  # the regex free JSON whitespace must match
    structural_tag: Optional[str] = None  # xgrammar's structural-tag format, as JSON text

    def __post_init__(self) -> None:
        self.verify()

    def verify(self) -> None:
        """Exactly one constraint, each of the right type; ParameterError naming the field."""
        chosen = [name for name in CONSTRAINT_FIELDS if _is_set(getattr(self, name))]
        if not chosen:
            raise ParameterError(
                "structured_outputs: you must use one kind of structured outputs constraint "
                f"but none are specified (one of {', '.join(CONSTRAINT_FIELDS)})",
                parameter="structured_outputs",
            )
        if len(chosen) > 1:
            raise ParameterError(
                "structured_outputs: you can only use one kind of structured outputs constraint "
                f"but multiple are specified: {', '.join(chosen)}",
                parameter="structured_outputs",
            )
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    schema = _json.loads(self.json)
                except ValueError as e:
                    raise _bad("json", f"a JSON schema; its text is not valid JSON ({e})") from None
            else:
                schema = self.json
            if not isinstance(schema, (dict, bool)):
                raise _bad("json", f"a JSON schema (an object), got {type(schema).__name__}")
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or (name != "whitespace_pattern" and not value)):
                raise _bad(name, "a non-empty string")
        if isinstance(self.choice, list) and len(self.choice) > MAX_CHOICES:  # first: O(1) for a huge list
            raise ParameterError(
                f"structured_outputs.choice: at most {MAX_CHOICES} choices, got {len(self.choice)}",
                parameter="structured_outputs",
            )
        if self.choice is not None and (
            not isinstance(self.choice, list) or not self.choice or not all(isinstance(c, str) for c in self.choice)
        ):
            raise _bad("choice", "a non-empty list of strings")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise _bad("json_object", "a bool")
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "a bool")

    @property
    def kind(self) -> str:
        """The constraint's field name: json, regex, choice, grammar, json_object or structural_tag."""
        return next(name for name in CONSTRAINT_FIELDS if _is_set(getattr(self, name)))

    def schema_text(self) -> Optional[str]:
        """The JSON schema as compact text, or None without one. Key order is kept: it is the
        order in which properties are generated."""
        if self.json is None:
            return None
        schema = _json.loads(self.json) if isinstance(self.json, str) else self.json
        return _json.dumps(schema, separators=(",", ":"), ensure_ascii=False)

    def key(self) -> tuple:
        """What a compiled grammar is cached by: the constraint and every option that shapes it."""
        kind = self.kind
        spec: Any
        if kind == "json":
            spec = self.schema_text()
        elif kind == "choice":
            spec = tuple(self.choice)
        else:
            spec = getattr(self, kind)
        return (kind, spec, self.disable_any_whitespace, self.disable_additional_properties, self.whitespace_pattern)


def key_bytes(key: tuple) -> int:
    """The size of a ``key()``'s constraint and whitespace pattern in UTF-8 bytes (a choice: its
    strings, 3 bytes apart): what the size bound and the compile lanes go by."""
    spec, pattern = key[1], key[4]
    size = len(pattern.encode()) if pattern is not None else 0
    if isinstance(spec, tuple):
        return size + sum(len(c.encode()) + 3 for c in spec)
    return size + (len(spec.encode()) if isinstance(spec, str) else 0)


def key_digest(key: tuple) -> bytes:
    """32 bytes standing for a ``key()`` in caches: a cache entry then costs the same whatever
    the spec's size, and holds no copy of a client's text."""
    return hashlib.sha256(msgspec.msgpack.encode(key)).digest()


def oversize(key: tuple) -> str:
    """Why the spec of ``key`` is refused for its size ("": it is not)."""
    size = key_bytes(key)
    if size <= MAX_SPEC_BYTES:
        return ""
    return f"structured_outputs.{key[0]} is {size} bytes, over the server's limit of {MAX_SPEC_BYTES} (max_spec_bytes)"


def _is_set(value: Any) -> bool:
    return value is not None and value is not False


def _bad(field: str, allowed: str) -> ParameterError:
    return ParameterError(f"structured_outputs.{field} must be {allowed}", parameter="structured_outputs")
