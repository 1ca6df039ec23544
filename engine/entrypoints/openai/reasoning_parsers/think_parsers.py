"""The ``<think>...</think>`` parsers: ``deepseek_r1`` and ``qwen3``, with vLLM's behaviour.

Both read the markers as text, so they work whether the tokenizer has ``<think>`` and
``</think>`` as single special tokens (Qwen3, DeepSeek-R1) or spells them in several tokens.
A ``<think>`` at the start of the reply is dropped (older templates let the model open it);
everything up to ``</think>`` is reasoning, the rest content. While the reply grows, a tail that
may be the start of ``</think>`` waits for the next piece, and a reply that may still become
``<think>`` settles nothing yet.

- ``deepseek_r1``: its template opens ``<think>`` in the prompt, so a reply may start inside the
  reasoning with only ``</think>``; a reply with no ``</think>`` is all reasoning.
- ``qwen3``: the same, except that ``chat_template_kwargs={"enable_thinking": false}`` makes the
  whole reply content (Qwen3's template then writes an empty ``<think></think>`` in the prompt).
"""

from __future__ import annotations

from engine.entrypoints.openai.reasoning_parsers.abstract_reasoning_parser import (
    ReasoningParser,
    ReasoningParserManager,
)
from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import hold_back


class ThinkReasoningParser(ReasoningParser):
    start = "<think>"
    end = "</think>"

    def thinking(self) -> bool:
        """False where the request's reply is to be all content."""
        return not self.prompt_ends_reasoning

    def parse(self, text: str, final: bool) -> tuple[str, str]:
        if not self.thinking():
            return "", text
        body = text.lstrip()
        if body.startswith(self.start):
            body = body[len(self.start) :]
        elif not final and self.start.startswith(body):
            return "", ""  # may yet be the opening marker
        else:
            body = text
        reasoning, found, content = body.partition(self.end)
        if found:
            return reasoning, content
        return (body if final else hold_back(body, self.end)), ""


@ReasoningParserManager.register_module("deepseek_r1")
class DeepSeekR1ReasoningParser(ThinkReasoningParser):
    pass


@ReasoningParserManager.register_module("qwen3")
class Qwen3ReasoningParser(ThinkReasoningParser):
    def thinking(self) -> bool:
        return super().thinking() and self.chat_template_kwargs.get("enable_thinking", True) is not False
