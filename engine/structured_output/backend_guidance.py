"""llguidance: an Earley parser over a lazily built lexer. Its compile is near free (no
per-vocabulary precomputation) and it takes JSON-schema features and options xgrammar does not
(``whitespace_pattern``, more of JSON Schema); its masks cost more to fill per token (measured in
README, "Structured outputs"). It imports no torch, so the frontend validates with it too
(engine/structured_output/validate.py).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from engine.structured_output.errors import GrammarError, shorten
from engine.structured_output.grammar_text import choice_lark, is_ebnf
from engine.structured_output.params import StructuredOutputsParams
from engine.structured_output.vocab import Vocabulary


def grammar_spec(params: StructuredOutputsParams) -> str:
    """The llguidance grammar (its JSON form) for ``params``; GrammarError for a malformed spec."""
    import llguidance

    kind = params.kind
    try:
        if kind in ("json", "json_object"):
            schema: Any = json.loads(params.schema_text()) if kind == "json" else {"type": "object"}
            if params.disable_additional_properties:
                schema = _closed_objects(schema)
            options = {"whitespace_flexible": not params.disable_any_whitespace}
            if params.whitespace_pattern is not None:
                options["whitespace_pattern"] = params.whitespace_pattern
            return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(params.regex)
        if kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(choice_lark(params.choice))
        if kind == "grammar":
            fmt = "gbnf" if is_ebnf(params.grammar) else "lark"
            return llguidance.grammar_from(fmt, params.grammar)
    except Exception as e:
        raise GrammarError(f"structured_outputs.{kind}: {shorten(e)}") from None
    raise GrammarError("structured_outputs.structural_tag is supported by the xgrammar backend only")


def check_spec(spec: str, kind: str, tokenizer: Optional[Any] = None) -> None:
    """GrammarError with llguidance's reason if ``spec`` does not compile (bounded by the parser's
    default limits on lexer fuel and grammar size, so no spec can make this run long)."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(spec, tokenizer)
    if error:
        raise GrammarError(f"structured_outputs.{kind}: {shorten(error)}")


def _closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that does not say."""
    if isinstance(schema, list):
        return [_closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed_objects(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


class GuidanceBackend:
    name = "guidance"

    def __init__(self, vocab: Vocabulary) -> None:
        import llguidance

        self._llg = llguidance
        self._stop_ids = frozenset(vocab.stop_token_ids)
        self._tokenizer = llguidance.LLTokenizer(
            vocab.tokenizer_json, n_vocab=vocab.vocab_size, eos_token=vocab.stop_token_ids or None
        )

    def compile(self, params: StructuredOutputsParams) -> "GuidanceGrammar":
        spec = grammar_spec(params)
        check_spec(spec, params.kind, self._tokenizer)
        return GuidanceGrammar(self._llg, self._tokenizer, spec, self._stop_ids)


class GuidanceGrammar:
    backend = "guidance"

    def __init__(self, llg: Any, tokenizer: Any, spec: str, stop_ids: frozenset) -> None:
        self._stop_ids = stop_ids
        # Built here, on the compile lane: starting a matcher parses the grammar (250 ms for a 30k-
        # string enum), a copy of this one takes ~0.1 ms on the step loop.
        self._first = llg.LLMatcher(tokenizer, spec, log_level=0)
        # What it holds, estimated from the grammar's text (llguidance gives no figure): measured
        # 7.6 MB for a 30k-string enum and 11.8 MB for a 40k choice, ~24 bytes per byte of text.
        self.nbytes = 24 * len(spec) + (16 << 10)

    def matcher(self) -> "GuidanceMatcher":
        return GuidanceMatcher(self._first.deep_copy(), self._stop_ids)


class GuidanceMatcher:
    __slots__ = ("_m", "_stop_ids", "_ended")

    def __init__(self, matcher: Any, stop_ids: frozenset) -> None:
        self._m = matcher
        self._stop_ids = stop_ids
        self._ended = False

    def accept(self, token_id: int) -> bool:
        ok = self._m.consume_token(token_id)
        self._ended = ok and token_id in self._stop_ids
        return ok

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        v = bitmask[row]
        self._m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())

    def is_terminated(self) -> bool:
        """The grammar ended with a stop token (as xgrammar's ``is_terminated``)."""
        return self._ended
