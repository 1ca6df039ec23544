"""Incremental detokenization and stop strings, per request.

No emitted text ever holds a broken UTF-8 character: byte-level BPE splits characters across
tokens, and a token's text is held back while the bytes so far end inside a character. Two
decoders give the same text:

- byte-level tokenizers (GPT-2 style: SmolLM, Llama 3, Qwen2; the decoder is ``ByteLevel``)
  use a per-token table built once per tokenizer (``ByteLevelTable``): a token is a list
  lookup and a string append, a character split across tokens waits as pending bytes;
- any other tokenizer steps the tokenizers library's ``DecodeStream``, which returns nothing
  while the text so far ends inside a character.

Stop strings follow vLLM: the search starts far enough back to catch a stop string that
began before the newest text; on a hit the text is cut before it (or after it, with
``include_stop_str_in_output``). While a request runs, the last ``len(longest stop) - 1``
characters are held back from streamed text, since they may turn out to start a stop string.
The search is one regex scan of the new text's window for any stop (SamplingParams bounds
their number and length), so a request with many stop strings costs each step little.
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from tokenizers import Tokenizer, decoders
from tokenizers.decoders import DecodeStream

from engine.sampling_params import SamplingParams


@functools.lru_cache(maxsize=256)
def _stop_pattern(stops: tuple[str, ...]) -> re.Pattern:
    """Any of ``stops``, as one regex: compiled once per distinct list (a few ms for
    SamplingParams' 256 at most), shared by the n sequences of a request and later requests."""
    return re.compile("|".join(map(re.escape, stops)))


# Prompt tokens fed to the decoder before the output, so the first output token decodes
# as it does in running text (matters for tokenizers that strip a leading space).
_PROMPT_CONTEXT = 6


class IncrementalDetokenizer:
    """The output text of one request and its stop strings; subclasses turn ids into text."""

    __slots__ = (
        "output_text",
        "_num_tokens",
        "_stop",
        "_include_stop",
        "_min_tokens",
        "_stop_buffer",
        "_sent",
        "_stop_pattern",
        "_longest_stop",
    )

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._decode(prompt_token_ids[-_PROMPT_CONTEXT:])  # context only: its text is dropped
        self.output_text = ""
        self._num_tokens = 0
        self._stop = params.stop
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        self._longest_stop = max(map(len, self._stop), default=0)
        self._stop_buffer = 0 if not self._stop or self._include_stop else self._longest_stop - 1
        self._stop_pattern = _stop_pattern(tuple(self._stop)) if self._stop else None
        self._sent = 0  # characters of output_text already returned as deltas

    def _decode(self, token_ids: list[int]) -> str:
        """The text these tokens add after the ones decoded before (complete characters only)."""
        raise NotImplementedError

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> Optional[str]:
        """Decode the new tokens; return the stop string that now ends the text, if any.

        ``stop_terminated``: the core ended the request on the last of these tokens (eos or a
        stop token id), whose text is then left out unless include_stop_str_in_output.
        """
        if not self._stop and not stop_terminated:  # the common case: nothing to look for
            self._num_tokens += len(new_token_ids)
            new_text = self._decode(new_token_ids)
            if new_text:
                self.output_text += new_text
            return None
        if stop_terminated and not self._include_stop:
            self._num_tokens += 1
            new_token_ids = new_token_ids[:-1]
        # No stop string may match within the first min_tokens tokens.
        inside_min = self._min_tokens - self._num_tokens
        self._num_tokens += len(new_token_ids)
        if inside_min > 0:
            self.output_text += self._decode(new_token_ids[:inside_min])
            new_token_ids = new_token_ids[inside_min:]
        new_text = self._decode(new_token_ids) if new_token_ids else ""
        self.output_text += new_text
        if not self._stop or not new_text:
            return None
        return self._check_stop_strings(len(new_text))

    def _check_stop_strings(self, new_chars: int) -> Optional[str]:
        text = self.output_text
        # One C-level scan of the window where a stop string overlapping the new text can start;
        # only when it finds something are the stops tried one by one, in vLLM's order.
        if self._stop_pattern.search(text, max(0, len(text) + 1 - new_chars - self._longest_stop)) is None:
            return None
        for stop in self._stop:
            index = text.find(stop, 1 - new_chars - len(stop))
            if index == -1:
                continue
            if self._include_stop:
                index += len(stop)
            self.output_text = text[:index]
            return stop
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to show now: all of it, or what is new since the last delta."""
        end = len(self.output_text) if finished else len(self.output_text) - self._stop_buffer
        if not delta:
            return self.output_text[:end] if end < len(self.output_text) else self.output_text
        if end <= self._sent:
            return ""
        start, self._sent = self._sent, end
        return self.output_text[start:end]


class StreamDetokenizer(IncrementalDetokenizer):
    """Any tokenizer, through ``DecodeStream``."""

    __slots__ = ("_tokenizer", "_stream")

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
        # Primed by stepping, not with DecodeStream(ids=...): a prompt that ends inside a
        # character would make the first step return the primed text again.
        super().__init__(prompt_token_ids, params)

    def _decode(self, token_ids: list[int]) -> str:
        step, tokenizer = self._stream.step, self._tokenizer
        text = ""
        for token_id in token_ids:
            piece = step(tokenizer, token_id)
            if piece:
                text += piece
        return text


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class ByteLevelTable:
    """For a tokenizer whose decoder is ``ByteLevel``: per token id, its bytes and, when they
    are complete UTF-8 on their own, its text (``None`` otherwise); one pair of tables with
    special tokens and one without (skip_special_tokens).

    It mirrors the tokenizers library's ByteLevel decoder (each character of the token through
    GPT-2's byte alphabet, or the token's own UTF-8 when a character is outside it; the bytes
    of a sequence are concatenated and decoded with replacement) and is checked against
    ``decode([id])`` for every id when built: any difference and ``build`` returns None, so
    the tokenizer is decoded through ``DecodeStream`` instead.
    """

    __slots__ = ("texts", "raw", "texts_skip", "raw_skip")

    def __init__(self, texts, raw, texts_skip, raw_skip) -> None:
        self.texts, self.raw, self.texts_skip, self.raw_skip = texts, raw, texts_skip, raw_skip

    @staticmethod
    def build(tokenizer: Tokenizer) -> Optional["ByteLevelTable"]:
        if type(tokenizer.decoder) is not decoders.ByteLevel:
            return None
        return _build_byte_level_table(tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))


@functools.lru_cache(maxsize=4)
def _build_byte_level_table(tokenizer: Tokenizer, vocab_size: int) -> Optional[ByteLevelTable]:
    alphabet = _byte_decoder()
    raw: list[bytes] = []
    for token_id in range(vocab_size):
        token = tokenizer.id_to_token(token_id) or ""
        try:
            raw.append(bytes(alphabet[c] for c in token))
        except KeyError:  # not a byte-level token (an added token): the decoder keeps its own UTF-8
            raw.append(token.encode())
    texts = [_complete_text(b) for b in raw]
    expected = tokenizer.decode_batch([[i] for i in range(vocab_size)], skip_special_tokens=False)
    for b, text, want in zip(raw, texts, expected):
        if (text if text is not None else b.decode(errors="replace")) != want:
            return None
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special and i < vocab_size}
    texts_skip = ["" if i in special else t for i, t in enumerate(texts)]
    raw_skip = [b"" if i in special else b for i, b in enumerate(raw)]
    return ByteLevelTable(texts, raw, texts_skip, raw_skip)


def _complete_text(token_bytes: bytes) -> Optional[str]:
    """The token's text when its bytes are whole characters (and not a lone U+FFFD, which a
    stream also holds back); else None."""
    try:
        text = token_bytes.decode()
    except UnicodeDecodeError:
        return None
    return None if text.endswith("\ufffd") else text


class ByteLevelDetokenizer(IncrementalDetokenizer):
    """Byte-level BPE through a ``ByteLevelTable``; emits exactly what ``DecodeStream`` would."""

    __slots__ = ("_texts", "_raw", "_pending")

    def __init__(self, table: ByteLevelTable, prompt_token_ids: list[int], params: SamplingParams) -> None:
        skip = params.skip_special_tokens
        self._texts = table.texts_skip if skip else table.texts
        self._raw = table.raw_skip if skip else table.raw
        self._pending = b""  # the start of a character whose other bytes have not come yet
        super().__init__(prompt_token_ids, params)

    def _decode(self, token_ids: list[int]) -> str:
        texts = self._texts
        size = len(texts)
        out = ""
        for token_id in token_ids:
            if token_id >= size:  # beyond the tokenizer's vocabulary (a padded LM head): no text
                continue
            text = texts[token_id]
            if text is not None and not self._pending:
                out += text
                continue
            pending = self._pending + self._raw[token_id]
            if not pending:
                continue
            try:
                text = pending.decode()
            except UnicodeDecodeError:
                text = pending.decode(errors="replace")
                if text.endswith("\ufffd"):  # inside a character: wait for its next bytes
                    self._pending = pending
                    continue
            self._pending = b""
            out += text
        return out


def make_detokenizer(
    tokenizer: Tokenizer, table: Optional[ByteLevelTable], prompt_token_ids: list[int], params: SamplingParams
) -> IncrementalDetokenizer:
    if table is not None:
        return ByteLevelDetokenizer(table, prompt_token_ids, params)
    return StreamDetokenizer(tokenizer, prompt_token_ids, params)
