"""Constraint text both backends share: a choice as a grammar, and telling EBNF from Lark."""
from __future__ import annotations

import json


def choice_ebnf(choices: list[str]) -> str:
    """``root ::= "a" | "b"``: JSON string escapes are the escapes EBNF string literals take."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def choice_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def is_ebnf(grammar: str) -> bool:
    """GBNF/EBNF names rules with ``::=``; Lark with ``:`` (vLLM's rule of thumb)."""
    return "::=" in grammar
