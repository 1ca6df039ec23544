"""The frontend's check of a request's constraint, before it reaches the scheduler: the spec is
turned into llguidance's grammar and validated (no tokenizer, no torch; the parser's default
limits on lexer fuel and grammar size bound the work, ~1 ms for a typical schema). What fails
here would fail to compile in the core: the caller gets a ValueError naming
``structured_outputs`` with the backend's reason, shortened (HTTP 400).

Under ``backend="xgrammar"`` a spec llguidance accepts can still fail in xgrammar's compile;
that request then finishes with the compile error from the core (also a 400 over HTTP).
Results are cached by the spec, so a schema shared by many clients is checked once.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from engine.exceptions import ParameterError
from engine.structured_output.errors import GrammarError
from engine.structured_output.params import StructuredOutputsParams

_MAX_CACHED = 1024
_cache: OrderedDict[tuple, str] = OrderedDict()  # key -> error ("" if valid)
_lock = threading.Lock()  # the renderer's threads validate concurrently


def validate_structured_outputs(params: StructuredOutputsParams, backend: str = "auto") -> None:
    if params.kind == "structural_tag":
        if backend == "guidance":
            raise ParameterError("structured_outputs.structural_tag is supported by the xgrammar backend only",
                                 parameter="structured_outputs")
        return  # xgrammar alone compiles these: its compile in the core is the check
    key = params.key()
    with _lock:
        error = _cache.get(key)
        if error is not None:
            _cache.move_to_end(key)
    if error is None:
        error = _check(params)
        with _lock:
            _cache[key] = error
            while len(_cache) > _MAX_CACHED:
                _cache.popitem(last=False)
    if error:
        raise ParameterError(error, parameter="structured_outputs")


def _check(params: StructuredOutputsParams) -> str:
    from engine.structured_output.backend_guidance import check_spec, grammar_spec

    try:
        check_spec(grammar_spec(params), params.kind)
    except GrammarError as e:
        return str(e)
    return ""
