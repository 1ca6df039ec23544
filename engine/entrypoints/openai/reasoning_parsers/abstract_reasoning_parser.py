"""The reasoning parser interface, and the registry ``--reasoning-parser NAME`` picks from.

A reasoning model writes its thinking before its answer (``<think>...</think>answer``). A parser
implements one method, ``parse(text, final)``: what a reply, or the prefix of one, already
settles as ``(reasoning, content)``. As with the tool parsers, the whole reply and its stream are
both read through it, so they cannot disagree: ``split`` parses the whole reply, and
``ReasoningStreamer`` re-parses the growing text and sends only what is new. Tool calls are read
from the content alone, after this split, in both paths.

A parser is made per reply, knowing the request's ``chat_template_kwargs`` (Qwen3's
``enable_thinking``) and whether its prompt already closed the reasoning (a template that turns
thinking off writes ``<think></think>`` into the prompt): then the whole reply is content, as
vLLM's ``prompt_is_reasoning_end``. The core makes the same decision from the prompt's token ids
to start a structured-outputs grammar only after the reasoning (structured_output/reasoning.py);
a parser's ``start`` and ``end`` are the texts it is told (``structured_outputs_config.reasoning_start``
and ``reasoning_end``, set by ``ringllm serve``).

The registry is vLLM's ``ReasoningParserManager``: parsers register with
``@ReasoningParserManager.register_module("name")``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

logger = logging.getLogger(__name__)


class ReasoningParser:
    start: str = ""  # the text that opens reasoning ("" where the prompt opens it)
    end: str = ""  # the text that closes it

    def __init__(
        self, tokenizer: Any = None, chat_template_kwargs: Optional[dict] = None, prompt_ends_reasoning: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.prompt_ends_reasoning = prompt_ends_reasoning

    def parse(self, text: str, final: bool) -> tuple[str, str]:
        """``(reasoning, content)`` that ``text`` settles; each only grows as the text does.
        ``final``: the reply is whole, so nothing is held back."""
        raise NotImplementedError

    def split(self, text: str) -> tuple[Optional[str], str]:
        """A whole reply's reasoning (None when it has none) and content."""
        reasoning, content = self.parse(text, final=True)
        return reasoning or None, content

    @classmethod
    def prompt_closes_reasoning(cls, prompt: str) -> bool:
        """Whether ``prompt`` leaves reasoning closed: its last marker is the end marker."""
        end = prompt.rfind(cls.end)
        return end >= 0 and (not cls.start or end > prompt.rfind(cls.start))


class ReasoningStreamer:
    """One streamed reply: ``feed(delta_text)`` and, at the end, ``finish()`` each return the
    ``(reasoning, content)`` pieces that are new (either may be ""); their concatenations are
    ``parse(whole, final=True)``."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = ("", "")

    def feed(self, delta_text: str) -> tuple[str, str]:
        self.text += delta_text
        return self._new(self.parser.parse(self.text, final=False))

    def finish(self) -> tuple[str, str]:
        return self._new(self.parser.parse(self.text, final=True))

    def _new(self, settled: tuple[str, str]) -> tuple[str, str]:
        pieces = []
        for now, sent in zip(settled, self.sent):
            if not now.startswith(sent):  # a parser's settled text never shrinks; a plugin's might
                logger.warning("a reasoning parser took back text it had settled")
                now = sent
            pieces.append(now[len(sent) :])
        self.sent = (self.sent[0] + pieces[0], self.sent[1] + pieces[1])
        return pieces[0], pieces[1]


class ReasoningParserManager:
    """Parsers by name. ``register_module`` is a decorator, as vLLM's is."""

    reasoning_parsers: dict[str, type[ReasoningParser]] = {}

    @classmethod
    def register_module(cls, name: Union[str, list[str]]) -> Any:
        def register(parser: type[ReasoningParser]) -> type[ReasoningParser]:
            if not (isinstance(parser, type) and issubclass(parser, ReasoningParser)):
                raise TypeError(f"a reasoning parser must subclass ReasoningParser, got {parser!r}")
            for each in [name] if isinstance(name, str) else name:
                cls.reasoning_parsers[each] = parser
            return parser

        return register

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        try:
            return cls.reasoning_parsers[name]
        except KeyError:
            known = ", ".join(sorted(cls.reasoning_parsers))
            raise ValueError(f"invalid reasoning parser: {name} (choose from {known})") from None
