"""``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` after optional text, or
the form of Mistral's newer tokenizers (v11+), ``[TOOL_CALLS]name[ARGS]{...}`` once per call.
``[TOOL_CALLS]`` is a special token, so the reply is detokenized with special tokens kept (as
vLLM does for this parser); call ids are 9 letters and digits, which Mistral's chat templates
check when the calls come back in the history."""

from __future__ import annotations

import re
import secrets
import string
from typing import Optional

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ParsedReply,
    ToolParser,
    ToolParserManager,
    hold_back,
)
from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import ParsedCall
from engine.entrypoints.openai.tool_parsers.json_calls import calls_in_array
from engine.entrypoints.openai.partial_json import Unfinished, canonical_prefix, skip_ws

BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z_][\w.-]*")
_ID_ALPHABET = string.ascii_letters + string.digits


@ToolParserManager.register_module("mistral")
class MistralToolParser(ToolParser):
    keeps_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedReply:
        first = text.find(BOT)
        if first < 0:
            return ParsedReply(text if final else hold_back(text, BOT))
        reply = ParsedReply(text[:first])
        marker = first
        while marker >= 0:
            start = skip_ws(text, marker + len(BOT))
            try:
                if start == len(text):
                    if final:
                        raise Unfinished("no calls after [TOOL_CALLS]")
                    break
                if text[start] == "[":
                    end = calls_in_array(text, start, final, reply.calls, ("arguments",), self.memo_for(text))
                else:
                    end = self._named_call(text, start, final, reply.calls)
            except ValueError:
                if final:
                    raise
                break
            if end is None:
                break
            marker = text.find(BOT, end)  # some models write one marker per call
        return reply

    def _named_call(self, text: str, start: int, final: bool, calls: list[ParsedCall]) -> Optional[int]:
        """``name[ARGS]{...}`` at ``start``: append the call, return where it ends (None while
        unfinished; the name is complete once ``[ARGS]`` follows it)."""
        args_at = text.find(ARGS, start)
        if args_at < 0:
            rest = hold_back(text[start:], ARGS).rstrip()
            if rest and not _NAME.fullmatch(rest):
                raise ValueError("expected name[ARGS]{...} after [TOOL_CALLS]")
            if final:
                raise Unfinished("a tool name without [ARGS]")
            return None
        name = text[start:args_at].strip()
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid tool name {name!r}")
        pos = skip_ws(text, args_at + len(ARGS))
        arguments, end = canonical_prefix(text, pos, self.memo_for(text)) if pos < len(text) else ("", None)
        calls.append(ParsedCall(name, arguments, end is not None))
        if end is None and final:
            raise Unfinished("unfinished tool call arguments")
        return end

    def make_tool_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
