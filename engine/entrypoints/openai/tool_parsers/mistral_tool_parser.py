"""``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` after optional text.
``[TOOL_CALLS]`` is a special token, so the reply is detokenized with special tokens kept (as
vLLM does for this parser); call ids are 9 letters and digits, which Mistral's chat templates
check when the calls come back in the history."""
from __future__ import annotations

import secrets
import string

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedReply, ToolParser, ToolParserManager,
                                                                         hold_back)
from engine.entrypoints.openai.tool_parsers.json_calls import calls_in_array
from engine.entrypoints.openai.tool_parsers.partial_json import skip_ws

BOT = "[TOOL_CALLS]"
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
                        raise ValueError("no calls after [TOOL_CALLS]")
                    break
                end = calls_in_array(text, start, final, reply.calls, ("arguments",), self.memo_for(text))
            except ValueError:
                if final:
                    raise
                break
            if end is None:
                break
            marker = text.find(BOT, end)  # some models write one marker per call
        return reply

    def make_tool_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
