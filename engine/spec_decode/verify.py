"""The runner's side of speculative decoding: which of a request's draft tokens the target accepts.

The target's token is sampled at each of the k + 1 positions (the last known token, then the k
draft tokens), each row as a decode at that position would sample it: greedy rows take the
argmax, random rows draw from their own temperature/top-k/top-p/min-p distribution. Draft token
j is accepted while the target's token at its position equals it; the target's token at the
first mismatch (or after the last draft) is emitted too, so a step emits 1 to k + 1 tokens.

Greedy: exactly the tokens decoding without drafts gives. Random: for a point-mass draft (an
n-gram proposes d with probability 1) this *is* speculative rejection sampling. The textbook rule
accepts d with probability min(1, p(d) / q(d)) = p(d) and, on rejection, samples from the
residual max(0, p - q) renormalised, i.e. p with d removed. With s drawn from p: P(s == d) = p(d),
and s given s != d is distributed as p without d. So the output has the target's distribution
(the test suite checks it with a chi-square test).
"""
from __future__ import annotations


def accepted_tokens(target: list[int], draft: list[int]) -> list[int]:
    """The tokens a step emits: ``target`` (len(draft) + 1 tokens, the target's at each position)
    up to and including the first one that differs from the draft."""
    a = 0
    while a < len(draft) and target[a] == draft[a]:
        a += 1
    return target[:a + 1]
