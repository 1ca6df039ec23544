"""The tokenizer's vocabulary as both backends want it, read from ``tokenizer.json`` alone.

The EngineCore imports neither transformers nor the frontend: xgrammar's ``TokenizerInfo`` is
built from the token strings in id order plus the metadata xgrammar detects from the same
JSON text, and llguidance's ``LLTokenizer`` takes the JSON text itself. Both get the *model's*
vocabulary size, which may exceed the tokenizer's (padding rows of the LM head): ids with no
token are never allowed by a grammar, so those logits are masked too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Vocabulary:
    tokenizer_json: str  # the file's text
    tokens: list[str]  # id -> token string ("" for ids with no token, up to vocab_size)
    vocab_size: int  # the model's: the width of its logits
    stop_token_ids: list[int]  # what ends a grammar (the model's EOS)


def load_vocabulary(tokenizer_path: str, vocab_size: int, eos_token_id: Optional[int]) -> Vocabulary:
    """From a tokenizer directory (or its tokenizer.json); ValueError naming what is missing."""
    import tokenizers

    path = tokenizer_path if tokenizer_path.endswith(".json") else os.path.join(tokenizer_path, "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError("structured outputs need the model's tokenizer.json (a .gguf tokenizer is not supported)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    vocab = tokenizers.Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
    size = max(vocab_size, max(vocab.values()) + 1)
    tokens = [""] * size
    for token, idx in vocab.items():
        tokens[idx] = token
    return Vocabulary(text, tokens, size, [] if eos_token_id is None else [eos_token_id])
