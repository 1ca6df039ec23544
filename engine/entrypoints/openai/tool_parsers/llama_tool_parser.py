"""``llama3_json``: Llama 3.1/3.2's JSON calls, ``{"name": ..., "parameters": {...}}`` (or
``"arguments"``), optionally after ``<|python_tag|>``, several separated by ``;``. A reply is
calls only when it starts with one, as vLLM's streaming path reads it; any other reply is content.
(vLLM's non-streaming path also picks JSON out of prose, with a regex that misses objects nested
more than two deep, so its two paths disagree; here both read the same.)"""

from __future__ import annotations

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import ParsedReply, ToolParser, ToolParserManager
from engine.entrypoints.openai.tool_parsers.json_calls import call_from_object
from engine.entrypoints.openai.partial_json import skip_ws

BOT = "<|python_tag|>"


@ToolParserManager.register_module("llama3_json")
class Llama3JsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedReply:
        pos = skip_ws(text, 0)
        if text.startswith(BOT, pos):
            pos = skip_ws(text, pos + len(BOT))
        elif not final and pos < len(text) and BOT.startswith(text[pos:]):
            return ParsedReply("")  # maybe the tag: wait
        if pos == len(text):
            return ParsedReply("" if not final else text)
        if text[pos] != "{":
            return ParsedReply(text)  # prose: content
        reply = ParsedReply("")
        try:
            while True:
                call, end = call_from_object(text, pos, final, memo=self.memo_for(text))
                reply.calls.append(call)
                if end is None:
                    break
                pos = skip_ws(text, end)
                if pos == len(text):
                    break
                if text[pos] != ";":
                    raise ValueError("text after a tool call")
                pos = skip_ws(text, pos + 1)
                if pos == len(text):
                    break
                if text[pos] != "{":
                    raise ValueError("a ';' not followed by a tool call")
        except ValueError:
            if final:
                raise
        return reply
