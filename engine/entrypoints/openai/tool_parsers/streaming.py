"""The incremental extractor: tool-call deltas in OpenAI's streaming shape from a growing reply.

Each piece of text re-parses the reply so far (``ToolParser.parse``) and sends the difference
from what was already sent: new content, a call's opening delta (``index``, ``id``,
``type: "function"``, the whole ``name``, ``arguments: ""``) once its name is complete, then
pieces of its ``arguments``. The parser only ever reports settled text, so what was sent is
always a prefix of what it reports next and nothing is taken back; at the end the whole reply is
parsed as the non-streaming path parses it, and whatever that adds is the last delta. The
concatenated pieces are therefore the non-streaming answer, a reply cut inside a call included
(abstract_tool_parser's docstring has the rules); the one exception is a call opened before the
text went wrong, which stays sent. Re-parsing costs time linear in the reply per piece; replies
are bounded by max_tokens, and a call is a few hundred characters.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from engine.entrypoints.openai.http_bodies import DeltaFunctionCall, DeltaMessage, DeltaToolCall

if TYPE_CHECKING:
    from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import ExtractedToolCalls, ToolParser

logger = logging.getLogger(__name__)


class _SentCall:
    def __init__(self, call_id: str, name: str) -> None:
        self.id, self.name, self.arguments = call_id, name, ""


class ToolCallStreamer:
    def __init__(self, parser: "ToolParser", max_calls: Optional[int] = None) -> None:
        self.parser = parser
        self.max_calls = max_calls
        self.text = ""
        self.content_sent = ""
        self.sent: list[_SentCall] = []
        self.final: Optional["ExtractedToolCalls"] = None  # the whole reply's answer, once finished

    def feed(self, delta_text: str) -> Optional[DeltaMessage]:
        """The delta that ``delta_text`` adds, or None when it settles nothing new yet."""
        if not delta_text:
            return None
        self.text += delta_text
        reply = self.parser.read(self.text, final=False)
        if reply is None:  # a parser that refuses a prefix: wait for more text
            return None
        calls = []
        for call in reply.calls:
            if call.name is None:
                break  # later calls wait for this one's name: indexes stay in order
            calls.append((call.name, call.arguments))
        return self._delta(reply.content, calls)

    def finish(self) -> Optional[DeltaMessage]:
        """The last delta: what parsing the whole reply adds to what was sent."""
        self.final = final = self.parser.extract_tool_calls(self.text)
        if final.tools_called:
            return self._delta(final.content or "", [(c.function.name, c.function.arguments) for c in final.tool_calls])
        if self.sent:  # a call sent cannot be taken back; the rest of the reply still comes as content
            logger.info("a streamed reply's tool calls did not parse once it was whole")
        return self._delta(self.text, [])

    def _delta(self, content: str, calls: list[tuple[str, str]]) -> Optional[DeltaMessage]:
        new_content = None
        if content.strip() and content.startswith(self.content_sent) and len(content) > len(self.content_sent):
            new_content = content[len(self.content_sent) :]
            self.content_sent = content
        deltas = []
        for index, (name, arguments) in enumerate(calls[: self.max_calls]):
            delta = None
            if index == len(self.sent):
                self.sent.append(_SentCall(self.parser.make_tool_call_id(), name))
                delta = DeltaToolCall(
                    index, id=self.sent[index].id, type="function", function=DeltaFunctionCall(name=name, arguments="")
                )
            sent = self.sent[index]
            if len(arguments) > len(sent.arguments):
                if arguments.startswith(sent.arguments):
                    piece = arguments[len(sent.arguments) :]
                    sent.arguments = arguments
                    if delta is None:
                        delta = DeltaToolCall(index, function=DeltaFunctionCall(arguments=piece))
                    else:
                        delta.function.arguments = piece
                else:
                    logger.warning("tool call %d: the parser's arguments no longer extend what was sent", index)
            if delta is not None:
                deltas.append(delta)
        if new_content is None and not deltas:
            return None
        return DeltaMessage(content=new_content, tool_calls=deltas or None)
