"""Tool calling: the parsers ``--tool-call-parser`` names (hermes, llama3_json, mistral,
pythonic, and any a ``--tool-parser-plugin`` file registers), and the readers of forced calls.
Importing the package registers the built-in parsers."""

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ParsedCall,
    ParsedReply,
    ToolParser,
    ToolParserManager,
)
from engine.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from engine.entrypoints.openai.tool_parsers.llama_tool_parser import Llama3JsonToolParser
from engine.entrypoints.openai.tool_parsers.mistral_tool_parser import MistralToolParser
from engine.entrypoints.openai.partial_json import Unfinished
from engine.entrypoints.openai.tool_parsers.pythonic_tool_parser import PythonicToolParser

__all__ = [
    "ExtractedToolCalls",
    "Hermes2ProToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedCall",
    "ParsedReply",
    "PythonicToolParser",
    "ToolParser",
    "ToolParserManager",
    "Unfinished",
]
