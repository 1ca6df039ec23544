"""Reading the output of ``tool_choice="required"`` and of a named ``tool_choice``.

Those requests are generated under a JSON-schema constraint (``tool_choice.py`` builds it), so
the output is known JSON: for ``required`` an array of ``{"name": ..., "parameters": {...}}``
(vLLM's shape), for a named function the arguments object itself. They are parsed like any
other model's calls, so the streaming path is the same.
"""

from __future__ import annotations

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import ParsedCall, ParsedReply, ToolParser
from engine.entrypoints.openai.tool_parsers.json_calls import calls_in_array
from engine.entrypoints.openai.partial_json import canonical, canonical_prefix, skip_ws


class RequiredToolCallParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedReply:
        reply = ParsedReply("")
        start = skip_ws(text, 0)
        if start < len(text):
            try:
                end = calls_in_array(text, start, final, reply.calls, ("parameters",), self.memo_for(text))
            except ValueError:
                if final:
                    raise
                return reply
            if final and text[end:].strip():
                raise ValueError("text after the array of tool calls")
        return reply


class NamedToolCallParser(ToolParser):
    def __init__(self, name: str, tokenizer=None) -> None:
        super().__init__(tokenizer)
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedReply:
        if final:
            return ParsedReply("", [ParsedCall(self.name, canonical(text), True)])
        start = skip_ws(text, 0)
        if start == len(text):
            return ParsedReply("")
        try:
            arguments, end = canonical_prefix(text, start, self.memo_for(text))
        except ValueError:
            return ParsedReply("")
        return ParsedReply("", [ParsedCall(self.name, arguments, end is not None)])
