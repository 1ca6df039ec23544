"""Logprobs of one request, from the core's compact rows to vLLM's per-position dicts."""

from __future__ import annotations

from typing import Callable, Optional

from engine.outputs import Logprob, PromptLogprobs, SampleLogprobs
from engine.wire_messages import LogprobsLists


class TokenDecoder:
    """Each token's own text (``tokenizer.decode([id])``, as vLLM shows in logprobs), memoised:
    the same few thousand ids recur in every request's top-N."""

    def __init__(self, tokenizer) -> None:
        self._decode = tokenizer.decode if tokenizer is not None else None
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> Optional[str]:
        text = self._cache.get(token_id)
        if text is None and self._decode is not None:
            text = self._cache[token_id] = self._decode([token_id])
        return text


class LogprobsProcessor:
    __slots__ = ("_decode", "logprobs", "prompt_logprobs", "cumulative_logprob", "_prompt_sent")

    def __init__(
        self, decode: Callable[[int], Optional[str]], num_logprobs: Optional[int], num_prompt_logprobs: Optional[int]
    ) -> None:
        self._decode = decode
        self.logprobs: Optional[SampleLogprobs] = [] if num_logprobs is not None else None
        self.cumulative_logprob: Optional[float] = 0.0 if num_logprobs is not None else None
        # Position 0 has nothing before it to predict it.
        self.prompt_logprobs: Optional[PromptLogprobs] = [None] if num_prompt_logprobs is not None else None
        self._prompt_sent = False

    def update(self, sample: Optional[LogprobsLists], prompt: Optional[LogprobsLists]) -> None:
        if sample is not None and self.logprobs is not None:
            self.logprobs.extend(self._rows(sample))
            self.cumulative_logprob += sum(row[0] for row in sample.logprobs)
        if prompt is not None and self.prompt_logprobs is not None:
            self.prompt_logprobs.extend(self._rows(prompt))

    def prompt_logprobs_for_output(self, delta: bool) -> Optional[PromptLogprobs]:
        """All of them each time, or, for DELTA outputs, all of them once."""
        if not delta or self.prompt_logprobs is None:
            return self.prompt_logprobs
        if self._prompt_sent:
            return None
        self._prompt_sent = True
        return self.prompt_logprobs

    def _rows(self, lists: LogprobsLists) -> list[dict[int, Logprob]]:
        decode = self._decode
        rows = []
        for ids, lps, rank in zip(lists.token_ids, lists.logprobs, lists.ranks):
            # The chosen token first with its own rank, then the top-N ranked 1..N; a chosen
            # token that is also in the top-N keeps its first place in the dict.
            row = {ids[0]: Logprob(lps[0], rank, decode(ids[0]))}
            for r, (token_id, lp) in enumerate(zip(ids[1:], lps[1:]), 1):
                if token_id not in row:
                    row[token_id] = Logprob(lp, r, decode(token_id))
            rows.append(row)
        return rows
