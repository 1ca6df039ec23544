"""``pythonic``: calls as a Python list, ``[get_weather(city="Paris", days=3), now()]`` (Llama 3.2
and 4, ToolACE). The whole reply is read with ``ast`` and each argument with
``ast.literal_eval``: literals only, nothing is ever evaluated. While streaming, an argument is
sent once the text reaches the comma or parenthesis that ends it; the arguments are the JSON
object of the keywords, in order, so every prefix sent is a prefix of the final text."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ParsedCall,
    ParsedReply,
    ToolParser,
    ToolParserManager,
)
from engine.entrypoints.openai.partial_json import MAX_DEPTH, Unfinished, skip_ws

_NAME = re.compile(r"[A-Za-z_]\w*")
_OPEN, _CLOSE = "([{", ")]}"


@ToolParserManager.register_module("pythonic")
class PythonicToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedReply:
        start = skip_ws(text, 0)
        if start == len(text) or text[start] != "[":
            return ParsedReply(text if final or start < len(text) else "")
        if final:  # read as a stream reads it first: the same refusals (nesting), and where it ends
            if _scan_calls(text, start + 1, [], self.memo_for(text)) is None:
                raise Unfinished("the text ends inside the list of calls")
            return ParsedReply("", _calls_of_list(text[start:]))
        reply = ParsedReply("")
        try:
            _scan_calls(text, start + 1, reply.calls, self.memo_for(text))
        except ValueError:
            if not reply.calls:  # "[1] a footnote": prose after all
                return ParsedReply(text)
        return reply


def _calls_of_list(source: str) -> list[ParsedCall]:
    tree = _expression(source.strip(), "a Python list of calls")
    if not isinstance(tree, ast.List):
        raise ValueError("not a Python list of calls")
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            raise ValueError("each element must be a call with keyword arguments")
        kwargs = {kw.arg: _literal(kw.value) for kw in node.keywords}
        if None in kwargs:
            raise ValueError("**kwargs in a tool call")
        calls.append(ParsedCall(node.func.id, _dumps(kwargs), True))
    return calls


def _scan_calls(text: str, pos: int, calls: list[ParsedCall], memo: dict) -> Optional[int]:
    """Append the calls of an unfinished ``[f(a=1), ...`` (from after its ``[``) as far as the
    text settles them; where its ``]`` is, or None if the text ends first. ``memo``: the calls
    and arguments already read, by offset."""
    while True:
        pos = skip_ws(text, pos)
        if pos == len(text) or text[pos] == "]":
            return None if pos == len(text) else pos
        if ("call", pos) in memo:  # finished before: its end, and the call
            pos, done = memo[("call", pos)]
            calls.append(ParsedCall(done.name, done.arguments, True))
        else:
            pos = _scan_call(text, pos, calls, memo)
            if pos is None:
                return None
        pos = skip_ws(text, pos)
        if pos == len(text) or text[pos] == "]":
            return None if pos == len(text) else pos
        if text[pos] != ",":
            raise ValueError("expected ',' between calls")
        pos += 1


def _scan_call(text: str, start: int, calls: list[ParsedCall], memo: dict) -> Optional[int]:
    """Append the call at ``start`` as far as the text settles it; where it ends, or None while
    it is unfinished."""
    name = _NAME.match(text, start)
    if name is None:
        raise ValueError("expected a function name")
    pos = skip_ws(text, name.end())
    if pos == len(text):
        return None  # the name may go on
    if text[pos] != "(":
        raise ValueError("expected '(' after a function name")
    kwargs: dict[str, Any] = {}
    call = ParsedCall(name.group(), "{", False)
    calls.append(call)
    pos += 1
    while True:
        pos = skip_ws(text, pos)
        if pos == len(text):
            break
        if text[pos] == ")":
            call.complete = True
            break
        if ("arg", pos) in memo:
            end, key, value = memo[("arg", pos)]
        else:
            end = _argument_end(text, pos, memo)
            if end is None:
                break
            key, value = _keyword(text[pos:end])
            memo[("arg", pos)] = (end, key, value)
        kwargs[key] = value
        pos = end + 1 if text[end] == "," else end
    if call.complete:
        call.arguments = _dumps(kwargs)
        memo[("call", start)] = (pos + 1, call)
        return pos + 1
    # Unfinished, without the closing brace: more arguments may follow. It changes only
    # when an argument is added.
    if memo.get(("partial", start), (None,))[0] != len(kwargs):
        memo[("partial", start)] = (len(kwargs), _dumps(kwargs)[:-1])
    call.arguments = memo[("partial", start)][1]
    return None


def _argument_end(text: str, start: int, memo: dict) -> Optional[int]:
    """The index of the ``,`` or ``)`` that ends the argument at ``start`` (outside brackets and
    string literals), or None if the text ends first; then where the scan may resume (outside
    any string) is kept in ``memo``, so a long argument is not read again from its start."""
    pos, depth = memo.get(("scan", start), (start, 0))
    while pos < len(text):
        memo[("scan", start)] = (pos, depth)
        ch = text[pos]
        if ch in "'\"":
            quote = ch * 3 if text.startswith(ch * 3, pos) else ch
            pos += len(quote)
            while True:
                if pos >= len(text):
                    return None
                if text[pos] == "\\":
                    pos += 2
                    continue
                if text.startswith(quote, pos):
                    pos += len(quote)
                    break
                pos += 1
            continue
        if ch in _OPEN:
            depth += 1
            if depth > MAX_DEPTH:  # as deep as partial_json reads; Python's parser stops at 200
                raise ValueError(f"an argument nested deeper than {MAX_DEPTH} levels")
        elif ch in _CLOSE:
            if depth == 0:
                if ch == ")":
                    return pos
                raise ValueError(f"unbalanced {ch!r}")
            depth -= 1
        elif ch == "," and depth == 0:
            return pos
        pos += 1
    return None


def _keyword(source: str) -> tuple[str, Any]:
    node = _expression(f"f({source})", "a keyword argument")
    if node.args or len(node.keywords) != 1 or node.keywords[0].arg is None:
        raise ValueError("tool call arguments must be keyword arguments")
    return node.keywords[0].arg, _literal(node.keywords[0].value)


def _expression(source: str, what: str) -> ast.AST:
    """``source`` parsed as one Python expression, or a ValueError saying it is not ``what``.
    Python's parser refuses deep nesting with more than a SyntaxError: ``-`` or ``not`` a few
    thousand times over is a MemoryError ("too complex"), and a RecursionError is possible."""
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not {what}: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # ValueError: a NUL character
        raise ValueError(f"not {what} ({type(exc).__name__})") from None


def _literal(node: ast.AST) -> Any:
    try:
        value = ast.literal_eval(node)
        json.dumps(value)  # tuples become lists; sets, bytes and complex numbers are refused
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"a tool call argument must be a JSON-like literal ({type(exc).__name__})") from None
    return value


def _dumps(kwargs: dict[str, Any]) -> str:
    return json.dumps(kwargs, ensure_ascii=False)
