"""The tool-call parser interface, and the registry ``--tool-call-parser NAME`` picks from.

A parser knows one model family's way of writing calls (``<tool_call>{...}</tool_call>``,
``[TOOL_CALLS][...]``, ``[f(a=1)]``). It implements one method, ``parse(text, final)``: what
a reply, or the prefix of one, already settles — the plain content before the calls, and each
call's name and the canonical prefix of its arguments (``partial_json``). Both ways of
answering are built on it, so they cannot disagree: ``extract_tool_calls`` parses the whole
reply, and ``streamer()`` re-parses the growing text and sends only what is new
(``streaming.ToolCallStreamer``). One parser serves one reply (a stream keeps state).

What a whole reply answers, and so what its stream ends with (``extract_tool_calls``):

- ``parse(text, final=True)`` reads it: its calls, all complete. Only such a reply that the
  engine ended with ``stop`` finishes as ``tool_calls``.
- The text ends inside a call (the parser raises ``Unfinished``): cut by ``max_tokens``, a stop
  string or the end-of-text token. The answer is what the text settles, exactly what its stream
  has sent by then: the content before the calls, each call whose name is complete, the last
  one's ``arguments`` the canonical prefix read so far (not valid JSON). The finish reason stays
  the engine's (``length`` when cut by max_tokens), never ``tool_calls``.
- Any other refusal (malformed calls, JSON nested deeper than ``partial_json.MAX_DEPTH``): the
  whole text is content. A stream may have opened a call before the text went wrong; it cannot
  take that back, but its content still adds up to the whole text, and it finishes as the
  engine ended it.

Parsing never raises into the server: a parser refuses a text with ValueError, and a
RecursionError or MemoryError (a plugin parser's recursion on deep nesting) counts as one.

The registry is vLLM's ``ToolParserManager``: built-in parsers register with
``@ToolParserManager.register_module("name")``, and ``--tool-parser-plugin FILE`` runs a Python
file that does the same for its own parser.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from engine.entrypoints.openai.http_bodies import FunctionCall, ToolCall, random_id
from engine.entrypoints.openai.partial_json import Unfinished
from engine.entrypoints.openai.tool_parsers.streaming import ToolCallStreamer

# How a parser refuses a text: ValueError (Unfinished among them); Python's own refusals of deep
# nesting, from a plugin parser that recurses, count the same.
REFUSALS = (ValueError, RecursionError, MemoryError)


@dataclass
class ParsedCall:
    """One call as far as the text settles it: ``name`` None until it is complete; ``arguments``
    a prefix of the final arguments text (all of it once ``complete``)."""

    name: Optional[str]
    arguments: str
    complete: bool


@dataclass
class ParsedReply:
    content: str  # plain text the reply settles as content (before its calls)
    calls: list[ParsedCall] = field(default_factory=list)


@dataclass
class ExtractedToolCalls:
    """vLLM's ``ExtractedToolCallInformation``: the calls of a whole reply, and its content (the
    whole text when it holds no call; None when only calls). ``unfinished``: the reply ends
    inside its last call, whose arguments are a prefix."""

    tools_called: bool
    tool_calls: list[ToolCall]
    content: Optional[str]
    unfinished: bool = False


class ToolParser:
    # True where the model writes its call markers as special tokens (``[TOOL_CALLS]``), which
    # detokenizing would otherwise drop before the parser sees them.
    keeps_special_tokens = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, final: bool) -> ParsedReply:
        """What ``text`` settles. ``final``: the reply is whole, so a malformed call is a
        ValueError, and a text that ends inside a call is ``Unfinished`` (a ValueError too);
        otherwise the calls stop at the first one not yet readable."""
        raise NotImplementedError

    def extract_tool_calls(self, model_output: str, request: Any = None) -> ExtractedToolCalls:
        """The calls of a whole reply (the rules are in this module's docstring). A reply whose
        calls do not parse is plain content, as in vLLM: the client sees what the model wrote
        rather than an error."""
        unfinished = False
        try:
            reply = self.parse(model_output, final=True)
        except Unfinished:
            reply, unfinished = self.read(model_output, final=False), True
        except REFUSALS:
            reply = None
        calls = []
        for call in reply.calls if reply is not None else ():
            if call.name is None:
                break  # as a stream: later calls wait for this one's name
            calls.append(ToolCall(id=self.make_tool_call_id(), function=FunctionCall(call.name, call.arguments)))
        if not calls:
            return ExtractedToolCalls(False, [], model_output)
        return ExtractedToolCalls(True, calls, reply.content if reply.content.strip() else None, unfinished)

    def read(self, text: str, final: bool) -> Optional[ParsedReply]:
        """``parse``, or None where the parser refuses the text."""
        try:
            return self.parse(text, final)
        except REFUSALS:
            return None

    def streamer(self, max_calls: Optional[int] = None) -> ToolCallStreamer:
        """The incremental extractor of one streamed reply: ``feed(delta_text)`` and, at the end,
        ``finish()`` each return a DeltaMessage or None; after ``finish()``, ``final`` is the
        reply's ExtractedToolCalls. ``max_calls``: calls beyond it are not sent
        (parallel_tool_calls=false)."""
        return ToolCallStreamer(self, max_calls)

    def make_tool_call_id(self) -> str:
        return random_id("chatcmpl-tool")

    def memo_for(self, text: str) -> dict:
        """What this reply has finished (JSON values by offset, see ``partial_json``), for a parser
        to read again at no cost: a stream parses a text that only grows, and a value finished
        once stays finished. Valid while ``text`` extends the last one, started afresh otherwise."""
        seen, memo = self.__dict__.get("_memo", ("", {}))
        if not text.startswith(seen):
            memo = {}
        self.__dict__["_memo"] = (text, memo)
        return memo


def hold_back(text: str, marker: str) -> str:
    """``text`` without a tail that may be the start of ``marker`` (``"Sure <tool_"``): that
    part is not content until the next piece shows what it is."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


class ToolParserManager:
    """Parsers by name. ``register_module`` is a decorator, as vLLM's is."""

    tool_parsers: dict[str, type[ToolParser]] = {}

    @classmethod
    def register_module(
        cls, name: Union[str, list[str], None] = None, force: bool = True, module: Optional[type[ToolParser]] = None
    ) -> Any:
        """``@ToolParserManager.register_module("name")`` (or a list of names; default: the class
        name). ``force=False`` refuses to replace a parser already registered under a name."""

        def register(parser: type[ToolParser]) -> type[ToolParser]:
            if not (isinstance(parser, type) and issubclass(parser, ToolParser)):
                raise TypeError(f"a tool parser must subclass ToolParser, got {parser!r}")
            names = [parser.__name__] if name is None else [name] if isinstance(name, str) else list(name)
            for each in names:
                if not force and each in cls.tool_parsers:
                    raise KeyError(f"a tool parser is already registered as {each!r}")
                cls.tool_parsers[each] = parser
            return parser

        return register(module) if module is not None else register

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        try:
            return cls.tool_parsers[name]
        except KeyError:
            raise ValueError(f"invalid tool call parser: {name} (choose from {', '.join(cls.names())})") from None

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls.tool_parsers)

    @classmethod
    def import_tool_parser(cls, plugin_path: str) -> None:
        """Run the Python file at ``plugin_path`` (``--tool-parser-plugin``), whose
        ``register_module`` decorators add its parsers. Any failure is one ValueError."""
        if not os.path.isfile(plugin_path):
            raise ValueError(f"--tool-parser-plugin: no such file: {plugin_path}")
        module_name = "ringllm_tool_parser_plugin_" + os.path.splitext(os.path.basename(plugin_path))[0]
        spec = importlib.util.spec_from_file_location(module_name, plugin_path)
        if spec is None or spec.loader is None:
            raise ValueError(f"--tool-parser-plugin: {plugin_path} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ValueError(
                f"--tool-parser-plugin: {plugin_path} failed to load: {type(exc).__name__}: {exc}"
            ) from None
