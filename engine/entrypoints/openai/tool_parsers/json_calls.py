"""Reading calls written as JSON objects (``{"name": ..., "arguments": {...}}``), alone or in an
array: what the hermes, llama3_json, mistral and forced (``required``) formats share."""

from __future__ import annotations

import json
from typing import Optional

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import ParsedCall
from engine.entrypoints.openai.partial_json import Unfinished, canonical, canonical_prefix, object_members, skip_ws

ARGUMENT_KEYS = ("arguments", "parameters")


def call_from_object(
    text: str, start: int, final: bool, argument_keys: tuple[str, ...] = ARGUMENT_KEYS, memo: Optional[dict] = None
) -> tuple[ParsedCall, Optional[int]]:
    """The call written as the JSON object at ``text[start]``, and where the object ends (None
    while unfinished). Its arguments are the first of ``argument_keys`` it writes; none at all
    is ``{}`` (a call without parameters). ValueError: not a call; Unfinished: the text ends
    inside it when ``final``.
    ``memo``: the reply's finished JSON values (partial_json)."""
    members, end = object_members(text, start, memo)
    name = None
    if "name" in members and members["name"][1] is not None:
        value = json.loads(text[members["name"][0] : members["name"][1]])
        if not isinstance(value, str) or not value:
            raise ValueError("a tool call's name must be a non-empty string")
        name = value
    key = next((k for k in members if k in argument_keys), None)  # the first one written
    arguments, settled = "", False
    if key is not None:
        value_start, value_end = members[key]
        if text[value_start] == '"':  # arguments written as a JSON string: known only once whole
            if value_end is not None:
                arguments, settled = _string_arguments(text[value_start:value_end]), True
        else:
            arguments, args_end = canonical_prefix(text, value_start, memo)
            settled = args_end is not None
    elif end is not None:
        arguments, settled = "{}", True
    if end is not None and name is None:
        raise ValueError("a tool call without a name")
    complete = end is not None and settled
    if final and not complete:
        raise Unfinished("an unfinished tool call")
    return ParsedCall(name, arguments, complete), end


def _string_arguments(raw: str) -> str:
    """Arguments the model wrote as a string: the JSON inside it when there is some."""
    inner = json.loads(raw, strict=False)
    try:
        return canonical(inner)
    except ValueError:
        return json.dumps(inner, ensure_ascii=False)


def calls_in_array(
    text: str,
    start: int,
    final: bool,
    calls: list[ParsedCall],
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
    memo: Optional[dict] = None,
) -> Optional[int]:
    """Append the calls of the JSON array at ``text[start]`` (a ``[``) to ``calls`` as far as the
    text goes, and return where the array ends (None while unfinished). ValueError: not an
    array of calls; Unfinished: the text ends inside it when ``final``. Calls read before an
    error stay appended."""
    if text[start] != "[":
        raise ValueError("expected a JSON array of tool calls")
    pos, first = start + 1, True
    while True:
        pos = skip_ws(text, pos)
        if pos == len(text):
            break
        if text[pos] == "]" and first:
            return pos + 1
        first = False
        if text[pos] != "{":
            raise ValueError("expected a tool call object")
        call, end = call_from_object(text, pos, final, argument_keys, memo)
        calls.append(call)
        if end is None:
            break
        pos = skip_ws(text, end)
        if pos == len(text):
            break
        if text[pos] == "]":
            return pos + 1
        if text[pos] != ",":
            raise ValueError("expected ',' or ']' between tool calls")
        pos += 1
    if final:
        raise Unfinished("an unfinished array of tool calls")
    return None
