"""Incremental detokenization and stop strings, per request.

Text is decoded token by token with the tokenizers library's ``DecodeStream``, which
returns nothing while the bytes so far end inside a UTF-8 character (byte-level BPE
splits characters across tokens), so no emitted text ever holds a broken character.

Stop strings follow vLLM: the search starts far enough back to catch a stop string that
began before the newest text; on a hit the text is cut before it (or after it, with
``include_stop_str_in_output``). While a request runs, the last ``len(longest stop) - 1``
characters are held back from streamed text, since they may turn out to start a stop string.
"""
from __future__ import annotations

from typing import Optional

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from engine.sampling_params import SamplingParams

# Prompt tokens fed to the decoder before the output, so the first output token decodes
# as it does in running text (matters for tokenizers that strip a leading space).
_PROMPT_CONTEXT = 6


class IncrementalDetokenizer:
    __slots__ = ("_tokenizer", "_stream", "output_text", "_num_tokens", "_stop", "_include_stop",
                 "_min_tokens", "_stop_buffer", "_sent")

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
        # Primed by stepping, not with DecodeStream(ids=...): a prompt that ends inside a
        # character would make the first step return the primed text again.
        for token_id in prompt_token_ids[-_PROMPT_CONTEXT:]:
            self._stream.step(tokenizer, token_id)
        self.output_text = ""
        self._num_tokens = 0
        self._stop = params.stop
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        self._stop_buffer = 0 if not self._stop or self._include_stop else max(map(len, self._stop)) - 1
        self._sent = 0  # characters of output_text already returned as deltas

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> Optional[str]:
        """Decode the new tokens; return the stop string that now ends the text, if any.

        ``stop_terminated``: the core ended the request on the last of these tokens (eos or a
        stop token id), whose text is then left out unless include_stop_str_in_output.
        """
        if stop_terminated and not self._include_stop:
            self._num_tokens += 1
            new_token_ids = new_token_ids[:-1]
        text = self.output_text
        check_from = len(text)
        step, tokenizer = self._stream.step, self._tokenizer
        for token_id in new_token_ids:
            piece = step(tokenizer, token_id)
            if piece:
                text += piece
            self._num_tokens += 1
            if self._num_tokens <= self._min_tokens:  # no stop string within the first min_tokens
                check_from = len(text)
        self.output_text = text
        if not self._stop or self._num_tokens <= self._min_tokens:
            return None
        return self._check_stop_strings(len(text) - check_from)

    def _check_stop_strings(self, new_chars: int) -> Optional[str]:
        if not new_chars:
            return None
        text = self.output_text
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
