"""HTTP request fields -> ``StructuredOutputsParams`` and the logit controls of SamplingParams.

Where a constraint can come from, as vLLM 0.33's server reads them:
- ``response_format``: ``text`` (none), ``json_object``, ``json_schema`` (``strict`` closes every
  object to the properties it names);
- ``structured_outputs``: vLLM's object, the fields of StructuredOutputsParams;
- the older ``guided_json``/``guided_regex``/``guided_choice``/``guided_grammar`` (and
  ``guided_whitespace_pattern``), mapped onto it, with a deprecation warning in the log.
At most one of them may ask for a constraint: two are a 400. Beside a forced tool call
(``tool_choice`` ``required`` or named), the call's grammar takes ``response_format``'s place and
the others are a 400 (tool_parsers/tool_choice.py). ``json_schema_constraint`` is the
entry point for code that builds a constraint itself (tool calling's ``required`` and named
``tool_choice``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

from engine.entrypoints.openai.errors import OpenAIError
from engine.exceptions import ParameterError
from engine.sampling_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_STRUCTURED_FIELDS = frozenset(StructuredOutputsParams.__struct_fields__)
_warned: set[str] = set()  # deprecated fields already warned about (once per process each)


def json_schema_constraint(
    schema: Any, *, strict: bool = False, param: str = "response_format"
) -> StructuredOutputsParams:
    """The constraint "output one JSON value of ``schema``" (a dict or its JSON text); ``strict``:
    objects take no property they do not name. A 400 naming ``param`` if it is not a schema."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise _error(f"{param}: the JSON schema is not valid JSON ({e})", param) from None
    if not isinstance(schema, dict):
        raise _error(f"{param}: the JSON schema must be an object, got {type(schema).__name__}", param)
    try:
        return StructuredOutputsParams(json=schema, disable_additional_properties=strict)
    except ParameterError as e:
        raise _error(str(e), param) from None


def explicit_constraint_field(req: Any) -> Optional[str]:
    """The first field of ``req`` other than ``response_format`` that asks for a constraint
    (``structured_outputs`` or a ``guided_*`` field), or None."""
    return next((name for name in ("structured_outputs", *_GUIDED) if getattr(req, name, None) is not None), None)


def structured_outputs_from_request(req: Any) -> Optional[StructuredOutputsParams]:
    """The one constraint ``req`` asks for (None: none); a 400 naming the field otherwise."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    fmt = _from_response_format(getattr(req, "response_format", None))
    if fmt is not None:
        found.append(("response_format", fmt))
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        found.append(("structured_outputs", _from_structured_outputs(so)))
    guided = {name: getattr(req, name, None) for name in _GUIDED}
    guided = {name: value for name, value in guided.items() if value is not None}
    whitespace = getattr(req, "guided_whitespace_pattern", None)
    for name, value in guided.items():
        _warn_deprecated(name)
        found.append((name, _build({_GUIDED[name]: value, "whitespace_pattern": whitespace}, name)))
    if whitespace is not None and not guided:
        raise _error("guided_whitespace_pattern needs guided_json", "guided_whitespace_pattern")
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise _error(f"only one structured output constraint may be given, got {names}", found[1][0])
    return found[0][1] if found else None


def logit_bias_from_request(value: Any) -> Optional[dict[int, float]]:
    """OpenAI's ``logit_bias``: token ids as strings -> bias, clamped to [-100, 100] as vLLM does."""
    if not value:
        return None
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise _error(f"logit_bias: key {str(key)[:40]!r} is not a token id", "logit_bias") from None
        if token < 0:
            raise _error(f"logit_bias: key {token} is not a token id", "logit_bias")
        out[token] = min(100.0, max(-100.0, float(bias)))
    return out


def sampling_extras(req: Any) -> dict[str, Any]:
    """The SamplingParams keywords of ``req``'s constraint and logit controls."""
    extras: dict[str, Any] = {}
    so = structured_outputs_from_request(req)
    if so is not None:
        extras["structured_outputs"] = so
    bias = logit_bias_from_request(getattr(req, "logit_bias", None))
    if bias is not None:
        extras["logit_bias"] = bias
    for name in ("allowed_token_ids", "bad_words"):
        value = getattr(req, name, None)
        if value is not None:
            extras[name] = value
    return extras


def _from_response_format(fmt: Any) -> Optional[StructuredOutputsParams]:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise _error("response_format must be an object with a type", "response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise _error("response_format: type json_schema needs json_schema.schema", "response_format")
        return json_schema_constraint(spec["schema"], strict=bool(spec.get("strict")), param="response_format")
    raise _error(
        f"response_format: unknown type {kind[:40]!r}; supported: text, json_object, json_schema", "response_format"
    )


def _from_structured_outputs(value: Any) -> StructuredOutputsParams:
    if not isinstance(value, dict):
        raise _error("structured_outputs must be an object", "structured_outputs")
    unknown = sorted(k for k in value if k not in _STRUCTURED_FIELDS)
    if unknown:
        raise _error(f"structured_outputs: unknown field(s) {', '.join(map(str, unknown))[:200]}", "structured_outputs")
    return _build(value, "structured_outputs")


def _build(fields: dict[str, Any], param: str) -> StructuredOutputsParams:
    try:  # the constructor checks every field's type and value
        return StructuredOutputsParams(**{k: v for k, v in fields.items() if v is not None})
    except ParameterError as e:
        raise _error(str(e) if param == "structured_outputs" else f"{param}: {e}", param) from None


def _warn_deprecated(name: str) -> None:
    if name not in _warned:
        _warned.add(name)
        logger.warning(
            "%s is deprecated: use structured_outputs={%r: ...} (vLLM's field); it is mapped onto it",
            name,
            _GUIDED[name],
        )


def _error(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")
