"""Turn the logits of the sampled rows into tokens (and logprobs), with vLLM's semantics.

Order, as in vLLM v1's sampler:
1. raw logprobs (``log_softmax`` of the untouched logits) if any row asked for logprobs;
2. min_tokens: stop tokens get -inf while a request is short of its min_tokens; bad_words,
   allowed_token_ids and logit_bias (logit_controls.py) alike (a grammar's mask was applied to
   the logits before the sampler, by the model runner, so every stage here sees it);
3. penalties: repetition over prompt + output tokens (divide positive logits, multiply
   negative ones), then frequency (times the output count) and presence (once per
   output token seen) subtracted;
4. greedy rows take the argmax here; the others are divided by their temperature,
   filtered by min_p (relative to the top probability), then top-k and top-p;
5. random rows draw by inverting their CDF: one uniform number per row, found in the
   float64 cumulative sum of its probabilities (the exponential race ``argmax(p / q)``
   needs a random number per vocabulary entry, ten times the cost on a large vocabulary:
   benchmarks/RESULTS.md, "Kernel choices"). A seeded request draws its number from its own generator, so its
   tokens do not depend on what else is in the batch.

top-p over a large vocabulary sorts only the candidates that can matter: the top
``TOP_P_CANDIDATES`` of each row, when their probability already reaches p (a full sort
of 64 x 49152 costs ~0.5 s here); rows whose candidates fall short are sorted in full.

Each stage runs only on the rows that use it, so the common all-greedy step is an argmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from engine.wire_messages import LogprobsLists
from engine.worker.logit_controls import LogitControls


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs for R rows, built by the model runner."""

    num_rows: int
    temperature: Optional[torch.Tensor] = None  # [R] float32 (1.0 on greedy rows); None: all greedy
    greedy_rows: Optional[torch.Tensor] = None  # [R] bool, when greedy and random rows mix
    top_k: Optional[torch.Tensor] = None  # [R] long, vocab size where disabled
    top_p: Optional[torch.Tensor] = None  # [R] float32, 1.0 where disabled
    min_p: Optional[torch.Tensor] = None  # [R] float32, 0.0 where disabled
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # row -> seeded generator
    # Penalties: only rows in penalty_rows, in that order.
    penalty_rows: Optional[torch.Tensor] = None
    presence: Optional[torch.Tensor] = None
    frequency: Optional[torch.Tensor] = None
    repetition: Optional[torch.Tensor] = None
    prompt_masks: Optional[torch.Tensor] = None  # [P, V] bool: token occurs in the prompt
    output_tokens: Optional[torch.Tensor] = None  # [P, max_out] long, padded with V
    # (row, token) pairs to forbid this step (min_tokens not yet reached).
    banned_rows: Optional[torch.Tensor] = None
    banned_tokens: Optional[torch.Tensor] = None
    logit_controls: Optional[LogitControls] = None  # logit_bias and allowed_token_ids of the rows that set them
    max_num_logprobs: Optional[int] = None  # None: no row wants logprobs


@dataclass
class SamplerOutput:
    sampled: torch.Tensor  # [R] long
    logprob_token_ids: Optional[torch.Tensor] = None  # [R, N + 1]: sampled token, then top-N
    logprobs: Optional[torch.Tensor] = None  # [R, N + 1]
    ranks: Optional[torch.Tensor] = None  # [R]: rank of the sampled token (1 = most likely)


class Sampler:
    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        raw_logprobs = None
        if md.max_num_logprobs is not None:
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if md.banned_rows is not None:
            logits[md.banned_rows, md.banned_tokens] = float("-inf")
        if md.logit_controls is not None:
            md.logit_controls.apply(logits)
        if md.penalty_rows is not None:
            logits[md.penalty_rows] = apply_penalties(logits[md.penalty_rows], md)
        sampled = self._sample(logits, md)
        if raw_logprobs is None:
            return SamplerOutput(sampled)
        ids, lps, ranks = gather_logprobs(raw_logprobs, sampled, md.max_num_logprobs)
        return SamplerOutput(sampled, ids, lps, ranks)

    @staticmethod
    def _sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if md.temperature is None:
            return argmax_rows(logits)
        greedy = argmax_rows(logits) if md.greedy_rows is not None else None
        sampled = sample_from_cdf(random_probs(logits, md), md.generators)
        return sampled if greedy is None else torch.where(md.greedy_rows, greedy, sampled)


def random_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Stage 4's distribution of each row (meaningful for the random rows): temperature, min_p,
    top-k, top-p, softmax. Changes ``logits``. Speculative decoding's rejection sampling compares
    the draft's and the target's rows of it (engine/spec_decode/verify.py)."""
    logits.div_(md.temperature.unsqueeze(1))
    if md.min_p is not None:
        logits = apply_min_p(logits, md.min_p)
    if md.top_k is not None or md.top_p is not None:
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
    return torch.softmax(logits, dim=-1)


def sample_from_cdf(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs`` by inverse-CDF sampling; rows in ``generators`` draw
    their uniform number from their own generator. Zero-probability tokens are never
    picked: the search finds the first cumulative sum strictly above u * total."""
    rows = probs.shape[0]
    u = torch.rand(rows, 1, dtype=torch.float64, device=probs.device)
    for row, gen in generators.items():
        u[row] = _draw(gen)
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
    return token.clamp_(max=probs.shape[1] - 1)


def argmax_rows(x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """``x.argmax(-1)`` (first maximum), in two passes: torch's CPU argmax over a long row is
    ~10x slower than ``amax`` (benchmarks/RESULTS.md, "Kernel choices"), so find the chunk holding
    the first maximum with ``amax``, then the argmax inside that chunk alone."""
    rows, vocab = x.shape
    if vocab % chunk or vocab <= chunk:
        return x.argmax(dim=-1)
    blocks = x.view(rows, vocab // chunk, chunk)
    best = blocks.amax(dim=-1).argmax(dim=-1)
    return best * chunk + blocks[torch.arange(rows, device=x.device), best].argmax(dim=-1)


def _draw(gen: torch.Generator) -> torch.Tensor:
    """The one number a seeded row consumes from its generator per sampled token."""
    return torch.rand(1, dtype=torch.float64, generator=gen, device=gen.device)


def replay_draws(gen: torch.Generator, count: int) -> None:
    """Advance ``gen`` past ``count`` sampled tokens (a seeded request back from preemption)."""
    for _ in range(count):
        _draw(gen)


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    vocab = logits.shape[1]
    counts = torch.zeros(logits.shape[0], vocab + 1, dtype=logits.dtype, device=logits.device)
    counts.scatter_add_(1, md.output_tokens, torch.ones_like(md.output_tokens, dtype=logits.dtype))
    counts = counts[:, :vocab]
    output_mask = counts > 0
    seen = md.prompt_masks | output_mask
    rep = torch.where(seen, md.repetition.unsqueeze(1), torch.ones_like(logits))
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    logits -= md.frequency.unsqueeze(1) * counts
    logits -= md.presence.unsqueeze(1) * output_mask
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, float("-inf"))


TOP_P_CANDIDATES = 1024


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: Optional[torch.Tensor], top_p: Optional[torch.Tensor]
) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th all kept) and the smallest set whose
    probability reaches p (the top token always kept); -inf elsewhere. A k above the
    vocabulary size keeps everything (vLLM's meaning), so it is clamped to it first."""
    if top_k is not None:
        top_k = top_k.clamp(min=1, max=logits.shape[1])
    if top_p is not None and logits.shape[1] > 2 * TOP_P_CANDIDATES:
        return _top_p_from_candidates(logits, top_k, top_p)
    return _top_k_top_p_sorted(logits, top_k, top_p)


def _top_p_from_candidates(logits: torch.Tensor, top_k: Optional[torch.Tensor], top_p: torch.Tensor) -> torch.Tensor:
    """``apply_top_k_top_p`` for a large vocabulary: rows that filter nothing are left
    alone, rows whose kept set provably lies inside their top ``TOP_P_CANDIDATES`` are cut
    from those candidates, the rest go through the full sort."""
    vocab, c = logits.shape[1], TOP_P_CANDIDATES
    k = torch.full_like(top_p, vocab, dtype=torch.long) if top_k is None else top_k
    active = torch.nonzero((top_p < 1) | (k < vocab)).flatten()
    if active.numel() == 0:
        return logits
    sub, p, k = logits[active], top_p[active], k[active]
    ranked, idx = sub.topk(c + 1, dim=-1)  # descending; the extra one is the best outsider
    vals, idx, outsider = ranked[:, :c], idx[:, :c], ranked[:, c]
    # top-k first (ties at the k-th all kept, as in the full sort), then p over what is left
    k_on = k < vocab
    kth = vals.gather(1, (k.clamp(max=c) - 1).unsqueeze(1)).squeeze(1)
    vals = vals.masked_fill((vals < kth.unsqueeze(1)) & k_on.unsqueeze(1), float("-inf"))
    total = torch.where(k_on, vals.logsumexp(dim=-1), sub.logsumexp(dim=-1))
    probs = (vals - total.unsqueeze(1)).exp()
    above = probs.cumsum(dim=-1) - probs  # mass strictly before each candidate
    keep = (above < p.unsqueeze(1)) & (vals > float("-inf"))
    keep[:, 0] = True
    # Exact when no kept token can lie outside: with top-k, the whole top-k set is inside
    # (k <= c and no outsider tied with the k-th, so the normalisation is right too);
    # without, the candidates' mass already reaches p. And the outsider must not tie with a
    # kept candidate (the full sort would order such a tie arbitrarily).
    inside = torch.where(k_on, (k <= c) & (kth > outsider), probs.sum(dim=-1) >= p)
    fits = inside & (~keep[:, -1] | (vals[:, -1] > outsider))
    cut = torch.full_like(sub, float("-inf")).scatter_(1, idx, vals.masked_fill(~keep, float("-inf")))
    if not bool(fits.all()):
        slow = torch.nonzero(~fits).flatten()
        cut[slow] = _top_k_top_p_sorted(sub[slow], None if top_k is None else k[slow], p[slow])
    logits[active] = cut
    return logits


def _top_k_top_p_sorted(
    logits: torch.Tensor, top_k: Optional[torch.Tensor], top_p: Optional[torch.Tensor]
) -> torch.Tensor:
    """The reference: a full sort of every row."""
    if top_p is None:
        # top-k alone needs only the k-th largest value per row, not a full sort.
        enabled = top_k < logits.shape[1]
        k_max = int(top_k[enabled].max()) if bool(enabled.any()) else 1
        kth = logits.topk(k_max, dim=-1).values.gather(1, (top_k.clamp(max=k_max) - 1).unsqueeze(1))
        kth.masked_fill_(~enabled.unsqueeze(1), float("-inf"))
        return logits.masked_fill_(logits < kth, float("-inf"))
    sorted_logits, order = logits.sort(dim=-1)
    if top_k is not None:
        kth = sorted_logits.gather(1, (logits.shape[1] - top_k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    cum = sorted_logits.softmax(dim=-1).cumsum_(dim=-1)
    drop = cum <= (1 - top_p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, float("-inf"))
    return logits.scatter_(1, order, sorted_logits)


def gather_logprobs(
    logprobs: torch.Tensor, chosen: torch.Tensor, num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of [chosen, top-num] token ids and logprobs, and the chosen token's rank.
    ``num`` is at most the vocabulary size; a negative one (vLLM's -1) means all of it."""
    num = logprobs.shape[1] if num < 0 else min(num, logprobs.shape[1])
    chosen = chosen.unsqueeze(1)
    chosen_lp = logprobs.gather(1, chosen)
    ranks = (logprobs >= chosen_lp).sum(dim=-1, dtype=torch.int32)  # int32: half the time of int64's sum
    if num:
        top_lp, top_ids = logprobs.topk(num, dim=-1)
        return torch.cat([chosen, top_ids], 1), torch.cat([chosen_lp, top_lp], 1), ranks
    return chosen, chosen_lp, ranks


def to_logprobs_lists(ids: torch.Tensor, lps: torch.Tensor, ranks: torch.Tensor, num: int) -> LogprobsLists:
    """One request's rows, each trimmed to its own top-``num`` (the batch computed the max)."""
    width = num + 1
    return LogprobsLists([r[:width] for r in ids.tolist()], [r[:width] for r in lps.tolist()], ranks.tolist())
