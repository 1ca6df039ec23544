"""Canonical JSON text from the prefix of a model's JSON, so streamed arguments never take a byte back.

A tool call's ``arguments`` stream in pieces that a client concatenates, and the concatenation
must be the same valid JSON as the non-streaming answer. Forwarding the model's raw text does
not give that: a parser cannot know where the raw arguments end before they end, and vLLM's
parsers have streamed stray braces, dropped quotes and sent whitespace twice because of it.
Here both paths emit one canonical spelling (``json.dumps(..., ensure_ascii=False)``'s:
``", "`` and ``": "`` separators, no other whitespace) and a prefix of the model's text is
turned into the part of that spelling it already determines: whole keys and values, the
decoded part of an unfinished string, but never an unfinished number or literal (``1`` may
still become ``1.5``, ``2e-1`` is ``0.2``). So every streamed prefix is a prefix of the final
text, which is exactly ``canonical(text)``.

A stream re-reads its growing reply on every piece, so each finished value is remembered by its
offset (``memo``, one per reply): the next read jumps over it, and only the unfinished path from
the outermost value to the end of the text is read again.

The reader recurses once per level of nesting, so a value nested deeper than ``MAX_DEPTH``
(counted from where a read starts: a call's arguments) is a ValueError like any other text
that is not JSON, before Python's recursion limit is near: a model can write ``[[[[...`` for
as long as its budget allows, and a RecursionError would be a 500 with a traceback.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = re.compile(r"[0-9+\-.eE]*")
_STRING_RUN = re.compile(r'[^"\\]*')
_LITERALS = ("true", "false", "null")
# Models write raw control characters (newlines) inside strings; json.dumps escapes them again.
_DECODER = json.JSONDecoder(strict=False)
# Arguments nest a few levels; each level costs two Python frames of the reader's recursion.
MAX_DEPTH = 128


def nesting(value: Any) -> int:
    """How many levels of objects and arrays a decoded ``value`` holds (without recursing), to
    refuse before code that recurses once per level (templates, copies, constraints) meets it."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


class Unfinished(ValueError):
    """The whole text ends inside a value or a call: cut (``max_tokens``, a stop string, the
    end-of-text token), not malformed, so what its prefix settles still stands."""


class _End(Exception):
    """The text ended inside a value."""


class _Canonical:
    """One recursive-descent pass over ``text`` from ``pos``, writing the canonical spelling."""

    def __init__(self, text: str, pos: int, memo: Optional[dict[int, tuple[str, int]]]) -> None:
        self.text, self.pos, self.out, self.memo = text, pos, [], memo
        self.depth = 0

    def skip_ws(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        self.pos = pos
        if pos == len(text):
            raise _End

    def value(self) -> None:
        self.skip_ws()
        start, ch = self.pos, self.text[self.pos]
        if self.memo is not None and start in self.memo:
            spelling, self.pos = self.memo[start]
            self.out.append(spelling)
            return
        if ch == "{" or ch == "[" or ch == '"':
            mark = len(self.out)
            if ch == '"':
                self.string()
            else:
                self.container("}" if ch == "{" else "]", member=ch == "{")
            if self.memo is not None:  # finished: the same for every longer text
                self.out[mark:] = ["".join(self.out[mark:])]
                self.memo[start] = (self.out[mark], self.pos)
        elif ch == "-" or ch.isdigit():
            self.number()
        else:
            self.literal()

    def container(self, close: str, member: bool) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels at {self.pos}")
        self.out.append(self.text[self.pos])
        self.pos += 1
        self.skip_ws()
        if self.text[self.pos] == close:
            self.out.append(close)
            self.pos += 1
            self.depth -= 1
            return
        while True:
            if member:
                self.skip_ws()
                if self.text[self.pos] != '"':
                    raise ValueError(f"expected a key at {self.pos}")
                self.string()
                self.skip_ws()
                if self.text[self.pos] != ":":
                    raise ValueError(f"expected ':' at {self.pos}")
                self.pos += 1
                self.out.append(": ")
            self.value()
            self.skip_ws()
            ch = self.text[self.pos]
            self.pos += 1
            if ch == close:
                self.out.append(close)
                self.depth -= 1
                return
            if ch != ",":
                raise ValueError(f"expected ',' or {close!r} at {self.pos - 1}")
            self.out.append(", ")

    def string(self) -> None:
        text, start = self.text, self.pos
        pos = start + 1
        while True:
            pos = _STRING_RUN.match(text, pos).end()
            if pos >= len(text):
                return self._partial_string(text[start + 1 :])
            if text[pos] == '"':
                break
            pos += 2  # a backslash and the character it escapes (\uXXXX is checked by the decoder)
        pos += 1
        decoded, _ = _DECODER.raw_decode(text, start)
        self.out.append(json.dumps(decoded, ensure_ascii=False))
        self.pos = pos

    def _partial_string(self, body: str) -> None:
        """The decoded part of an unfinished string, without its closing quote; then stop."""
        body = body[: _whole_escapes_end(body)]
        decoded = _DECODER.decode(f'"{body}"')
        if decoded and "\ud800" <= decoded[-1] <= "\udbff":  # half of a surrogate pair
            decoded = decoded[:-1]
        self.out.append(json.dumps(decoded, ensure_ascii=False)[:-1])
        raise _End

    def number(self) -> None:
        end = _NUMBER_CHARS.match(self.text, self.pos).end()
        if end == len(self.text):
            raise _End  # more digits may follow
        token = self.text[self.pos : end]
        if not _NUMBER.fullmatch(token):
            raise ValueError(f"invalid number {token!r}")
        number = json.loads(token)
        self.out.append(json.dumps(number) if not isinstance(number, float) or math.isfinite(number) else token)
        self.pos = end

    def literal(self) -> None:
        rest = self.text[self.pos : self.pos + 5]
        for word in _LITERALS:
            if rest.startswith(word):
                self.out.append(word)
                self.pos += len(word)
                return
            if word.startswith(rest) and self.pos + len(rest) == len(self.text):
                raise _End
        raise ValueError(f"unexpected {rest[:1]!r} at {self.pos}")


def _whole_escapes_end(body: str) -> int:
    """Where the part of an unfinished string's body ends whose escapes are all complete."""
    pos = 0
    while True:
        slash = body.find("\\", pos)
        if slash < 0:
            return len(body)
        width = 6 if body.startswith("u", slash + 1) else 2  # \uXXXX or \n, \", ...
        if slash + width > len(body):
            return slash
        pos = slash + width


def canonical_prefix(
    text: str, start: int = 0, memo: Optional[dict[int, tuple[str, int]]] = None
) -> tuple[str, Optional[int]]:
    """The canonical spelling of the JSON value at ``text[start:]`` as far as the text settles
    it, and where the value ends (None while it is unfinished). ValueError if it is not JSON.
    ``memo``: the finished values of this text or of a text it extends, by offset."""
    parser = _Canonical(text, start, memo)
    try:
        parser.value()
    except _End:
        return "".join(parser.out), None
    return "".join(parser.out), parser.pos


def value_end(text: str, start: int, memo: Optional[dict] = None) -> Optional[int]:
    """Where the JSON value at ``text[start:]`` ends, or None if the text ends first."""
    return canonical_prefix(text, start, memo)[1]


def canonical(text: str) -> str:
    """The canonical spelling of a whole JSON text (whitespace around it allowed); ValueError if
    it is unfinished or has anything after the value."""
    out, end = canonical_prefix(text + " ")  # the end of the text ends a bare number too
    if end is None:
        raise Unfinished("the JSON text is unfinished")
    if text[end:].strip(_WS):
        raise ValueError(f"unexpected text after the JSON value at {end}")
    return out


def object_members(
    text: str, start: int, memo: Optional[dict] = None
) -> tuple[dict[str, tuple[int, Optional[int]]], Optional[int]]:
    """The members of the JSON object at ``text[start]`` (a ``{``) that the text has reached:
    ``{key: (value start, value end or None)}``, and the object's end (None while unfinished).
    A key is listed once its value has begun. ValueError if it is not a JSON object."""
    members: dict[str, tuple[int, Optional[int]]] = {}
    if text[start] != "{":
        raise ValueError("expected a JSON object")
    pos = start + 1
    while True:
        pos = skip_ws(text, pos)
        if pos == len(text):
            return members, None
        if text[pos] == "}" and not members:
            return members, pos + 1
        if text[pos] != '"':
            raise ValueError("expected a key")
        key_end = value_end(text, pos, memo)
        if key_end is None:
            return members, None
        key = _DECODER.decode(text[pos:key_end])
        pos = skip_ws(text, key_end)
        if pos == len(text):
            return members, None
        if text[pos] != ":":
            raise ValueError("expected ':'")
        pos = skip_ws(text, pos + 1)
        if pos == len(text):
            return members, None
        end = value_end(text, pos, memo)
        members[key] = (pos, end)
        if end is None:
            return members, None
        pos = skip_ws(text, end)
        if pos == len(text):
            return members, None
        if text[pos] == "}":
            return members, pos + 1
        if text[pos] != ",":
            raise ValueError("expected ',' or '}'")
        pos += 1


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos
