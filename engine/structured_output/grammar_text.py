"""Constraint text both backends share: a choice as a grammar, and telling EBNF from Lark."""

from __future__ import annotations

import json


def choice_ebnf(choices: list[str]) -> str:
    """``root ::= "a" | "b"``: JSON string escapes are the escapes EBNF string literals take."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def choice_lark(choices: list[str]) -> str:
    """One terminal (one lexeme) of every choice. As a rule of alternatives (``start: "a" | "b"``)
    llguidance's Earley parser refused more than 2,000 choices at the first token ("Current row
    has 40001 items; max is 2000"), and many choices compiled and started a matcher over ten times
    slower than as one terminal (benchmarks/RESULTS.md, "Kernel choices")."""
    return "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def is_ebnf(grammar: str) -> bool:
    """GBNF/EBNF names rules with ``::=``; Lark with ``:`` (vLLM's rule of thumb)."""
    return "::=" in grammar
