"""The frontend's check of a request's constraint, before it reaches the scheduler: the spec is
turned into llguidance's grammar and validated (no tokenizer, no torch; the parser's default
limits on lexer fuel and grammar size bound the work, ~1 ms for a typical schema). What fails
here would fail to compile in the core: the caller gets a ValueError naming
``structured_outputs`` with the backend's reason, shortened (HTTP 400).

A structural tag is checked by structural_tag.py (its shape against xgrammar's models, what it
holds by llguidance). Under ``backend="xgrammar"`` a spec llguidance accepts can still fail in
xgrammar's compile; that request then finishes with the compile error from the core (also a 400
over HTTP).
Results are cached by a digest of the spec, so a schema shared by many clients is checked once
and the cache holds no client's text: each entry costs a few hundred bytes at most, and the
whole is bounded by bytes (MAX_VALIDATED_BYTES). A spec over MAX_SPEC_BYTES is refused first.
"""

from __future__ import annotations

import sys
import threading

from engine.exceptions import ParameterError
from engine.structured_output.byte_lru import ByteLRU
from engine.structured_output.config import MAX_VALIDATED_BYTES
from engine.structured_output.errors import GrammarError
from engine.structured_output.params import StructuredOutputsParams, key_digest, oversize

_cache = ByteLRU(MAX_VALIDATED_BYTES)  # digest of the key -> error ("" if valid)
_lock = threading.Lock()  # the renderer's threads validate concurrently
_ENTRY_OVERHEAD = 100  # the LRU's own record of an entry (a tuple and a dict slot), in bytes


def validate_structured_outputs(params: StructuredOutputsParams, backend: str = "auto") -> None:
    if params.kind == "structural_tag" and backend == "guidance":
        raise ParameterError(
            "structured_outputs.structural_tag is supported by the xgrammar backend only",
            parameter="structured_outputs",
        )
    key = params.key()
    error = oversize(key)
    if error:
        raise ParameterError(error, parameter="structured_outputs")
    digest = key_digest(key)
    with _lock:
        error = _cache.get(digest)
    if error is None:
        error = _check(params)
        with _lock:
            _cache.put(digest, error, sys.getsizeof(digest) + sys.getsizeof(error) + _ENTRY_OVERHEAD)
    if error:
        raise ParameterError(error, parameter="structured_outputs")


def _check(params: StructuredOutputsParams) -> str:
    from engine.structured_output.backend_guidance import check_spec, grammar_spec

    if params.kind == "structural_tag":
        from engine.structured_output.structural_tag import check_structural_tag

        return check_structural_tag(params.structural_tag)
    try:
        check_spec(grammar_spec(params), params.kind)
    except GrammarError as e:
        return str(e)
    return ""
