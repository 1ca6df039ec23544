"""``hermes``: Hermes 2 Pro / Qwen style, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, after optional text (the content)."""

from __future__ import annotations

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ParsedReply,
    ToolParser,
    ToolParserManager,
    hold_back,
)
from engine.entrypoints.openai.tool_parsers.json_calls import call_from_object
from engine.entrypoints.openai.partial_json import Unfinished, skip_ws

START, END = "<tool_call>", "</tool_call>"


@ToolParserManager.register_module("hermes")
class Hermes2ProToolParser(ToolParser):
    keeps_special_tokens = True  # some tokenizers make <tool_call> a special token

    def parse(self, text: str, final: bool) -> ParsedReply:
        first = text.find(START)
        if first < 0:
            return ParsedReply(text if final else hold_back(text, START))
        reply = ParsedReply(text[:first])
        block = first
        while block >= 0:
            body = skip_ws(text, block + len(START))
            try:
                if body == len(text):
                    raise Unfinished("an empty tool call block")
                if text[body] != "{":
                    raise ValueError("a tool call block that is not a JSON object")
                call, end = call_from_object(text, body, final, memo=self.memo_for(text))
            except ValueError:
                if final:
                    raise
                break
            reply.calls.append(call)
            if end is None:
                break
            block = text.find(START, end)  # text between blocks (and END itself) is not content
        return reply
