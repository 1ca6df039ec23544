"""xgrammar: compiles JSON schemas, regexes, EBNF/Lark grammars, choices and structural tags
into an adaptive token-mask cache. Its compile is heavier than llguidance's but its masks are
the cheapest to fill (measured in README, "Structured outputs"). Compiling releases the GIL.

Matchers follow the ``Matcher`` interface of engine/structured_output/backend.py.
"""

from __future__ import annotations

import json
from typing import Any

from engine.structured_output.errors import GrammarError, shorten
from engine.structured_output.grammar_text import choice_ebnf, is_ebnf
from engine.structured_output.params import StructuredOutputsParams
from engine.structured_output.structural_tag import to_xgrammar
from engine.structured_output.vocab import Vocabulary


class XgrammarBackend:
    name = "xgrammar"

    def __init__(self, vocab: Vocabulary) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(vocab.tokenizer_json)
        info = xgr.TokenizerInfo(
            vocab.tokens,
            vocab_type=meta["vocab_type"],
            vocab_size=vocab.vocab_size,
            stop_token_ids=vocab.stop_token_ids or None,
            add_prefix_space=meta["add_prefix_space"],
        )
        # Our compile pool caches by spec; xgrammar's own cache would hold a second copy.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    @staticmethod
    def unsupported(params: StructuredOutputsParams) -> str:
        """Why xgrammar cannot take ``params`` (""; it can): checked before compiling, so the
        guidance backend can take it instead under ``auto``."""
        if params.whitespace_pattern is not None:
            return "whitespace_pattern is not supported by xgrammar (use the guidance backend)"
        return ""

    def compile(self, params: StructuredOutputsParams) -> "XgrammarGrammar":
        reason = self.unsupported(params)
        if reason:
            raise GrammarError(f"structured_outputs: {reason}")
        c, kind = self._compiler, params.kind
        try:
            if kind == "json":
                compiled = c.compile_json_schema(params.schema_text(), any_whitespace=not params.disable_any_whitespace)
            elif kind == "json_object":
                compiled = c.compile_json_schema('{"type": "object"}', any_whitespace=not params.disable_any_whitespace)
            elif kind == "regex":
                compiled = c.compile_regex(params.regex)
            elif kind == "choice":
                compiled = c.compile_grammar(choice_ebnf(params.choice))
            elif kind == "grammar":
                compiled = (
                    c.compile_grammar(params.grammar) if is_ebnf(params.grammar) else c.compile_lark(params.grammar)
                )
            else:  # structural_tag
                compiled = c.compile_structural_tag(to_xgrammar(json.loads(params.structural_tag)))
        except Exception as e:  # xgrammar raises RuntimeError, ValueError and its own types
            raise GrammarError(f"structured_outputs.{kind}: xgrammar cannot compile it: {shorten(e)}") from None
        return XgrammarGrammar(self._xgr, compiled)


class XgrammarGrammar:
    backend = "xgrammar"

    def __init__(self, xgr: Any, compiled: Any) -> None:
        self._xgr = xgr
        self._compiled = compiled
        self.nbytes = compiled.memory_size_bytes  # xgrammar's own figure (its token-mask cache)

    def matcher(self) -> "XgrammarMatcher":
        return XgrammarMatcher(self._xgr.GrammarMatcher(self._compiled))


class XgrammarMatcher:
    __slots__ = ("_m",)

    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    def accept(self, token_id: int) -> bool:
        return self._m.accept_token(token_id)

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()
