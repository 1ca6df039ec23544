"""Sparse MLPs (mixtures of experts): the router and a layer's experts, run grouped by expert.

Qwen3-MoE, Mixtral and OLMoE replace a layer's MLP by ``num_experts`` gated MLPs of their own
and a router, a ``[num_experts, hidden]`` projection: each token's router logits go through a
softmax, its ``top_k`` experts are taken and, where the family says so (``renormalize``:
Mixtral always, Qwen3-MoE and OLMoE by ``norm_topk_prob``), their probabilities are divided by
their sum. The layer's output for a token is the sum of its experts' outputs times those
weights.

Why grouped: the step's (token, expert) pairs are sorted by expert, and each expert's rows go
through its gate/up and down projections as one GEMM, so a step reads each active expert's
weights once whatever the number of tokens routed to it, and an expert no token chose is not
read at all (a single-token decode touches its ``top_k`` experts only). Each expert is a
``Linear`` of its own, with the method ``Placement`` chose for it (engine/models/linear.py),
so the GGUF kernels run quantized experts on their blocks. The weighted outputs are added
back per token in expert order, as transformers does, so float32 results are its own. GGUF
experts that stack into one tensor per projection skip the per-expert calls altogether: one
kernel call per projection for all of a step's (token, expert) pairs (moe_gguf.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from engine.models.linear import Linear
from engine.models.moe_gguf import GGUFExperts


# Far above any released model's experts per layer (Qwen3-MoE 128, DeepSeek-V3 256, Kimi K2 384),
# and a bound on what a config or GGUF header can make the loader allocate per layer before any
# weight has arrived to contradict it.
MAX_EXPERTS = 4096


@dataclass(frozen=True)
class MoeDims:
    num_experts: int
    top_k: int
    intermediate: int  # each expert's MLP width (Qwen3-MoE's moe_intermediate_size)
    renormalize: bool  # the top-k probabilities divided by their sum
    sparse_layers: tuple[bool, ...]  # Qwen3-MoE: mlp_only_layers / decoder_sparse_step are dense

    @classmethod
    def from_config(
        cls, cfg: Any, intermediate_field: str, renormalize: bool, sparse_layers: Optional[tuple[bool, ...]] = None
    ) -> "MoeDims":
        """The config's expert count, top-k and expert width (``intermediate_field``), checked:
        positive integers, top_k <= num_experts."""
        experts, top_k = getattr(cfg, "num_experts", None), getattr(cfg, "num_experts_per_tok", None)
        intermediate = getattr(cfg, intermediate_field, None)
        for field, value in (
            ("num_experts", experts),
            ("num_experts_per_tok", top_k),
            (intermediate_field, intermediate),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"model config: {field} must be a positive integer, got {value!r}")
        if experts > MAX_EXPERTS:
            raise ValueError(f"model config: num_experts must be at most {MAX_EXPERTS}, got {experts}")
        if top_k > experts:
            raise ValueError(f"model config: num_experts_per_tok ({top_k}) must not exceed num_experts ({experts})")
        layers = sparse_layers if sparse_layers is not None else (True,) * cfg.num_hidden_layers
        return cls(experts, top_k, intermediate, bool(renormalize), layers)


class SparseMoE:
    """One layer's router and experts (set by the loader, None until then)."""

    __slots__ = ("dims", "router", "gate_up", "down", "gguf")

    def __init__(self, dims: MoeDims) -> None:
        self.dims = dims
        self.router: Optional[Linear] = None
        self.gate_up: list[Optional[Linear]] = [None] * dims.num_experts  # gate and up rows fused, as Llama's
        self.down: list[Optional[Linear]] = [None] * dims.num_experts
        self.gguf: Optional[GGUFExperts] = None  # the experts stacked for one call per projection

    def linears(self) -> list[Linear]:
        return [self.router, *self.gate_up, *self.down]

    def stack_experts(self) -> None:
        """Once every expert is set (the loader, after its last weight): GGUF experts stacked to
        run one kernel call per projection (engine/models/moe_gguf.py), where they can be."""
        self.gguf = GGUFExperts.stack(self.gate_up, self.down)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts), each ``[tokens, top_k]``: softmax in float32, then the top k
        (renormalised where the family says so), weights in ``x``'s dtype."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.dims.top_k, dim=-1)
        if self.dims.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def __call__(self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The layer's MLP output for ``x`` ``[tokens, hidden]``; ``act`` is the forward's
        act(gate) * up of fused gate/up rows."""
        weights, experts = self.route(x)
        if self.gguf is not None and self.gguf.runs(x.shape[0]):
            return self.gguf(x, act, weights, experts)
        if x.shape[0] == 1:
            return self._one_token(x, act, weights, experts)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        token_of = torch.div(order, self.dims.top_k, rounding_mode="floor")
        counts = torch.bincount(flat, minlength=self.dims.num_experts).tolist()
        rows = x.index_select(0, token_of)
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                outs.append(self.down[e](act(self.gate_up[e](rows[start : start + n]))))
                start += n
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        out = out * weights.reshape(-1).index_select(0, order).unsqueeze(1).to(out.dtype)
        return torch.zeros(x.shape[0], out.shape[1], dtype=out.dtype, device=out.device).index_add_(0, token_of, out)

    def _one_token(
        self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor], weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """A single token (decode at one stream): its top-k experts in expert order, without the
        grouping's sort, counts and scatter; the same arithmetic in the same order, so the same
        bits, in about half the grouped path's time (benchmarks/RESULTS.md, "Kernel choices")."""
        out = None
        for e, j in sorted((e, j) for j, e in enumerate(experts[0].tolist())):
            y = self.down[e](act(self.gate_up[e](x)))
            y = y * weights[:, j : j + 1].to(y.dtype)
            out = y if out is None else out.add_(y)
        return out
