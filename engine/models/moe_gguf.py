"""A sparse layer's GGUF experts run as one kernel call per projection (csrc/cpu/quant_moe.c).

Why: run one expert at a time, a decode step of a Qwen3-MoE (top-8, 24 layers) called the GGUF
kernels ~400 times a token from Python, two per chosen expert and layer, each call paying its
checks, its activation quantization and a wake-up of the thread pool. Here the router's top-k
stays in torch and the rest of the layer is four calls: gate/up for every (token, expert) pair,
the activation, down for every pair, and the weighted sum. Each output row is what the expert's
own ``GGUFLinear`` gives for its rows (the same kernels chosen by the same row counts), so the
layer's output differs from the per-expert path's only in the order the top-k outputs are added.

Each projection's experts are stacked once, at load, into one ``[experts, out, row_bytes]``
tensor, as a GGUF file stores ``ffn_*_exps``, and each expert's ``GGUFLinear`` holds a view
of it: one copy resident. Experts that cannot stack (types mixed within a projection, fused
parts in two types, row-invariant projections for ``deterministic``) keep the per-expert path,
as do steps of more than ``MAX_TOKENS`` tokens.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

import torch

from engine.kernels import quant
from engine.kernels.quant_moe import QuantizedExperts
from engine.models.linear import GGUFLinear, Linear


def _stack(linears: list[Linear]) -> Optional[QuantizedExperts]:
    """The experts' blocks as one stack, each expert then holding its view; None unless every
    expert is a plain ``GGUFLinear`` (no bias, not row-invariant) of one type and shape."""
    methods = [linear.method for linear in linears]
    if not all(isinstance(m, GGUFLinear) and not m.row_invariant for m in methods):
        return None
    if any(linear.bias is not None for linear in linears):
        return None
    if len({(m.q.qtype, m.out_features, m.in_features) for m in methods}) != 1:
        return None
    first = methods[0]
    stacked = QuantizedExperts(
        torch.stack([m.q.data for m in methods]), first.q.qtype, first.out_features, first.in_features
    )
    for e, m in enumerate(methods):
        m.share_blocks(stacked.data[e])
    return stacked


@lru_cache(maxsize=64)
def _pair_rows(tokens: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair p = (token p // top_k, slot p % top_k): the token row of each pair, and the pairs' own
    rows (down's input); built once per step size, read only."""
    pairs = torch.arange(tokens * top_k)
    return pairs // top_k, pairs


# Steps of up to this many tokens run here: decodes and small batches, where the calls' cost shows.
# A larger step (a prefill) spreads the per-expert calls over its rows; the limit holds the kernel
# call's scratch (every pair's output, kept by the thread for its next call) to a few MB. It also keeps
# each expert within the rows ``QuantizedLinear.matmul`` runs in the kernel on every CPU (an expert
# takes at most one pair per token), so the outputs are the per-expert path's.
MAX_TOKENS = quant.GEMV_ROWS


class GGUFExperts:
    """A layer's gate/up and down experts, each projection one ``QuantizedExperts``."""

    __slots__ = ("gate_up", "down")

    def __init__(self, gate_up: QuantizedExperts, down: QuantizedExperts) -> None:
        self.gate_up, self.down = gate_up, down

    @classmethod
    def stack(cls, gate_up: list[Linear], down: list[Linear]) -> Optional["GGUFExperts"]:
        """The layer's experts stacked, or None where they cannot be (see the module docstring)."""
        if quant.lib is None:
            return None
        up = _stack(gate_up)
        dn = _stack(down) if up is not None else None
        return None if dn is None else cls(up, dn)

    @staticmethod
    def runs(tokens: int) -> bool:
        """Whether a step of this many tokens runs here (else per expert)."""
        return tokens <= MAX_TOKENS

    def __call__(
        self,
        x: torch.Tensor,
        act: Callable[[torch.Tensor], torch.Tensor],
        weights: torch.Tensor,
        experts: torch.Tensor,
    ) -> torch.Tensor:
        """The layer's output for ``x`` ``[tokens, hidden]`` routed to ``experts`` with
        ``weights`` (each ``[tokens, top_k]``); ``act`` is act(gate) * up of fused rows."""
        tokens, top_k = experts.shape
        token_rows, pair_rows = _pair_rows(tokens, top_k)
        flat = experts.reshape(-1)
        h = act(self.gate_up.matmul(x, token_rows, flat))
        y = self.down.matmul(h, pair_rows, flat).view(tokens, top_k, -1)
        return torch.bmm(weights.to(y.dtype).unsqueeze(1), y).squeeze(1)
