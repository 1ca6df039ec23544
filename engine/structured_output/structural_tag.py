"""Structural tags (xgrammar's format, and vLLM's legacy ``structures``/``triggers`` form) and
the frontend's check of one, so that a bad tag is a 400 naming the problem before it crosses to
the core, as every other kind of constraint is.

The frontend cannot import xgrammar (its import pulls in torch, ~4.6 s). The tag's shape is
checked against xgrammar's own pydantic models, read from the installed package's
``structural_tag.py`` (which imports nothing but pydantic) without importing the package; the
JSON schemas, regexes and grammars inside it are checked by llguidance, as a top-level one is.
The core's xgrammar compile stays the final word.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from typing import Any

from engine.structured_output.errors import GrammarError, shorten
from engine.structured_output.params import StructuredOutputsParams

_MODELS_MODULE = "_ringllm_xgrammar_structural_tag"
_load_lock = threading.Lock()  # the renderer's threads validate concurrently
_TOO_DEEP = "structured_outputs.structural_tag is nested too deeply"


def to_xgrammar(tag: Any) -> Any:
    """vLLM's legacy form (``structures`` of begin/schema/end, and ``triggers``) as xgrammar's
    ``structural_tag`` format; the current form passes as it is."""
    if isinstance(tag, dict) and "structures" in tag and "format" not in tag:
        return {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": tag.get("triggers", []),
                "tags": [
                    {
                        "begin": s.get("begin", ""),
                        "end": s.get("end", ""),
                        "content": {"type": "json_schema", "json_schema": s.get("schema", {})},
                    }
                    for s in tag["structures"]
                    if isinstance(s, dict)
                ],
            },
        }
    return tag


def check_structural_tag(text: str) -> str:
    """Why xgrammar would refuse the structural tag ``text`` ("": as far as can be told without
    compiling it, it would not)."""
    import pydantic

    try:
        tag = to_xgrammar(json.loads(text))
    except ValueError as e:
        return f"structured_outputs.structural_tag is not valid JSON ({shorten(e)})"
    except RecursionError:
        return _TOO_DEEP
    try:
        parsed = _models().StructuralTag.model_validate(tag)
        for so in _inner_specs(parsed):
            _check_inner(so)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return shorten(f"structured_outputs.structural_tag{'.' + where if where else ''}: {first['msg']}")
    except GrammarError as e:
        return str(e)
    except RecursionError:
        return _TOO_DEEP
    return ""


def _inner_specs(node: Any):
    """The JSON schemas, regexes and grammars a parsed tag holds, as StructuredOutputsParams."""
    import pydantic

    if isinstance(node, (list, tuple)):
        for item in node:
            yield from _inner_specs(item)
        return
    if not isinstance(node, pydantic.BaseModel):
        return
    kind = getattr(node, "type", None)
    if kind == "json_schema" and isinstance(node.json_schema, dict):
        yield StructuredOutputsParams(json=node.json_schema)
    elif kind == "regex":
        yield StructuredOutputsParams(regex=node.pattern)
    elif kind == "grammar":
        yield StructuredOutputsParams(grammar=node.grammar)
    for value in node.__dict__.values():
        yield from _inner_specs(value)


def _check_inner(so: StructuredOutputsParams) -> None:
    from engine.structured_output.backend_guidance import check_spec, grammar_spec

    try:
        check_spec(grammar_spec(so), so.kind)
    except GrammarError as e:  # named as the structural tag's part it is
        raise GrammarError(str(e).replace("structured_outputs.", "structured_outputs.structural_tag: ", 1)) from None


def _models() -> Any:
    """xgrammar's structural_tag.py, loaded on its own (once per process)."""
    with _load_lock:
        module = sys.modules.get(_MODELS_MODULE)
        if module is None:
            package = importlib.util.find_spec("xgrammar")
            if package is None or not package.submodule_search_locations:
                raise GrammarError("structured_outputs.structural_tag needs xgrammar installed")
            path = os.path.join(package.submodule_search_locations[0], "structural_tag.py")
            spec = importlib.util.spec_from_file_location(_MODELS_MODULE, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[_MODELS_MODULE] = module  # pydantic resolves the models' forward references here
            spec.loader.exec_module(module)
        return module
