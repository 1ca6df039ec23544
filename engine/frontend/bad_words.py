"""bad_words as token sequences (vLLM's rule): each word is tokenized as written (leading space
stripped) and with one leading space, since a word inside a sentence is usually a different
token than at its start; the spaced form is kept only when it is a different word of the same
length (otherwise it would ban a prefix of other text, or ban nothing new)."""

from __future__ import annotations

from typing import Any

from engine.exceptions import ParameterError
from engine.frontend.renderer import encode


def tokenize_bad_words(tokenizer: Any, words: list[str]) -> list[list[int]]:
    if tokenizer is None:
        raise ParameterError(
            "SamplingParams.bad_words needs a tokenizer (the engine was built with skip_tokenizer_init=True)",
            parameter="bad_words",
        )
    sequences: list[list[int]] = []
    for word in words:
        bare = encode(tokenizer, word.lstrip(), False)
        if not bare:
            continue
        sequences.append(bare)
        spaced = encode(tokenizer, " " + word.lstrip(), False)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences
