"""logit_bias, allowed_token_ids and bad_words (vLLM's SamplingParams fields): what each step's
sampler must add or forbid, per row. Applied after the grammar's mask and before penalties,
temperature and top-k/top-p (vLLM v1's order), on the rows that use them only.

- ``logit_bias``: the bias is added to the token's logit (OpenAI's -100..100; +100 all but
  forces the token, -100 all but bans it).
- ``allowed_token_ids``: every other token is -inf.
- ``bad_words``: each word was tokenized by the frontend with and without a leading space
  (``bad_words_token_ids``); a one-token word is always banned, a longer one bans its last
  token whenever the output so far ends with the tokens before it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from engine.sampling_params import SamplingParams


def has_logit_controls(p: SamplingParams) -> bool:
    return bool(p.logit_bias or p.allowed_token_ids or p.bad_words_token_ids)


def has_penalties(p: SamplingParams) -> bool:
    """Presence, frequency or repetition penalties (the sampler's apply_penalties)."""
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


def banned_bad_words(output: Sequence[int], words: list[list[int]]) -> list[int]:
    """The tokens ``words`` forbid next, after ``output``."""
    banned = []
    for word in words:
        prefix = len(word) - 1
        if prefix == 0 or (len(output) >= prefix and list(output[len(output) - prefix :]) == word[:-1]):
            banned.append(word[-1])
    return banned


class LogitControls:
    """One step's logit controls for the sampled rows (built by ``build``; None when no row has any)."""

    def __init__(self) -> None:
        self.bias_rows: list[int] = []
        self.bias_tokens: list[int] = []
        self.bias_values: list[float] = []
        self.allowed_rows: list[int] = []
        self.allowed_tokens: list[list[int]] = []

    @classmethod
    def build(
        cls, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]], banned: tuple[list[int], list[int]]
    ) -> Optional["LogitControls"]:
        """``banned`` (rows, tokens) gets the bad words' bans; the rest is returned."""
        lc = cls()
        for row, (p, out) in enumerate(zip(params, outputs)):
            if p.logit_bias:
                lc.bias_rows += [row] * len(p.logit_bias)
                lc.bias_tokens += list(p.logit_bias)
                lc.bias_values += list(p.logit_bias.values())
            if p.allowed_token_ids:
                lc.allowed_rows.append(row)
                lc.allowed_tokens.append(p.allowed_token_ids)
            if p.bad_words_token_ids:
                tokens = banned_bad_words(out, p.bad_words_token_ids)
                banned[0].extend([row] * len(tokens))
                banned[1].extend(tokens)
        return lc if lc.bias_rows or lc.allowed_rows else None

    def apply(self, logits: torch.Tensor) -> None:
        device = logits.device
        if self.allowed_rows:
            keep = torch.zeros((len(self.allowed_rows), logits.shape[1]), dtype=torch.bool, device=device)
            rows = torch.tensor([i for i, ids in enumerate(self.allowed_tokens) for _ in ids], device=device)
            keep[rows, torch.tensor([t for ids in self.allowed_tokens for t in ids], device=device)] = True
            index = torch.tensor(self.allowed_rows, device=device)
            logits[index] = logits[index].masked_fill(~keep, float("-inf"))
        if self.bias_rows:
            logits.index_put_(
                (torch.tensor(self.bias_rows, device=device), torch.tensor(self.bias_tokens, device=device)),
                torch.tensor(self.bias_values, dtype=logits.dtype, device=device),
                accumulate=True,
            )
