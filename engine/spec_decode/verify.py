"""The runner's side of speculative decoding: which of a request's draft tokens the target accepts.

The target's token is sampled at each of the k + 1 positions (the last known token, then the k
draft tokens), each row as a decode at that position would sample it: greedy rows take the
argmax, random rows draw from their own temperature/top-k/top-p/min-p distribution. Draft token
j is accepted while the target's token at its position equals it; the target's token at the
first mismatch (or after the last draft) is emitted too, so a step emits 1 to k + 1 tokens.

Greedy: exactly the tokens decoding without drafts gives. Random, point-mass drafts (n-gram
lookup; a draft model's greedy rows): the textbook rule accepts d with probability
min(1, p(d) / q(d)) = p(d) and, on rejection, samples from the residual max(0, p - q)
renormalised, i.e. p with d removed. With s drawn from p: P(s == d) = p(d), and s given s != d is
distributed as p without d: ``accepted_tokens`` *is* speculative rejection sampling there.

Random, a draft model's drafts drawn from its distribution q: ``rejection_sample`` applies the
rule with that q (Leviathan et al. 2023; Chen et al. 2023), so the emitted tokens follow the
target's p whatever q is. The test suite checks both with chi-square tests.
"""

from __future__ import annotations

import torch

from engine.worker.sampler import sample_from_cdf


def accepted_tokens(target: list[int], draft: list[int]) -> list[int]:
    """The tokens a step emits: ``target`` (len(draft) + 1 tokens, the target's at each position)
    up to and including the first one that differs from the draft."""
    a = 0
    while a < len(draft) and target[a] == draft[a]:
        a += 1
    return target[: a + 1]


def rejection_sample(p: torch.Tensor, q: torch.Tensor, draft: list[int]) -> list[int]:
    """The tokens a step emits for drafts drawn from ``q`` ([>= k, V], the draft's distribution
    at each draft position) given the target's ``p`` ([k + 1, V]): draft token j is kept with
    probability min(1, p_j(d) / q_j(d)); the first one rejected is replaced by a draw from
    max(0, p_j - q_j) renormalised, and when all k are kept a bonus token comes from p_k."""
    k = len(draft)
    d = torch.tensor(draft, device=p.device)
    at = torch.arange(k, device=p.device)
    u = torch.rand(k, dtype=torch.float64, device=p.device)
    kept = u * q[at, d].double() < p[at, d].double()  # u < p/q, with q(d) > 0 as d was drawn from q
    rejected = torch.nonzero(~kept)
    a = int(rejected[0]) if rejected.numel() else k
    if a == k:
        last = p[k]
    else:
        last = (p[a] - q[a]).clamp_(min=0)
        if not bool(last.sum() > 0):  # p == q up to rounding: p itself is the residual's limit
            last = p[a]
    return draft[:a] + [int(sample_from_cdf(last.unsqueeze(0), {})[0])]
