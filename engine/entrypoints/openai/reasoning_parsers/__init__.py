"""Reasoning: the parsers ``--reasoning-parser`` names (deepseek_r1, qwen3), which move a reply's
thinking into ``reasoning_content`` (chat) or a reasoning item (responses)."""

from engine.entrypoints.openai.reasoning_parsers.abstract_reasoning_parser import (
    ReasoningParser,
    ReasoningParserManager,
    ReasoningStreamer,
)
from engine.entrypoints.openai.reasoning_parsers.think_parsers import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

__all__ = [
    "DeepSeekR1ReasoningParser",
    "Qwen3ReasoningParser",
    "ReasoningParser",
    "ReasoningParserManager",
    "ReasoningStreamer",
]
