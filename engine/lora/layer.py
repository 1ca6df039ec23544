"""The low-rank update of one projection, for every adapter slot, on the rows of each slot.

A ``Linear`` (engine/models/linear.py) that carries ``LoRAWeights`` adds them to whatever its
method computed (dense torch, oneDNN, the C GEMV, GGUF blocks, int8): the base projection runs
once for the whole step, then each slot's adapter runs on its own rows only,
``y[rows] += (x[rows] @ A^T) @ B^T`` (vLLM's punica shrink and expand, grouped by slot).

A fused projection (q/k/v, gate/up) holds its parts side by side: part p of a slot's adapter
takes columns ``[p * r, (p + 1) * r)`` of the shrink and writes its own output rows, so one
shrink and one expand cover all parts (the expand's off-part blocks are zeros). A slot computes
only the ``parts * r`` columns its adapter has, not the padded ``max_lora_rank``.
"""

from __future__ import annotations

from typing import Optional

import torch


class LoRABatch:
    """This step's rows per slot, shared by every projection: ``(slot, rows)`` with ``rows``
    None when the slot has every row of the step. Set by the runner before the forward."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: list[tuple[int, Optional[torch.Tensor]]] = []


class LoRAWeights:
    __slots__ = ("a_t", "b_t", "parts", "width", "batch")

    def __init__(
        self,
        parts: list[int],
        in_features: int,
        slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        batch: LoRABatch,
    ) -> None:
        """``parts``: the output rows of each part of the projection, in order."""
        cols = len(parts) * max_rank
        self.a_t = torch.zeros(slots, in_features, cols, dtype=dtype, device=device)  # shrink, input-major
        self.b_t = torch.zeros(slots, cols, sum(parts), dtype=dtype, device=device)  # expand
        self.parts = parts
        self.width = [0] * slots  # columns of each slot's shrink in use; 0: the adapter skips this projection
        self.batch = batch

    def set_slot(self, slot: int, rank: int, pairs: list[Optional[tuple[torch.Tensor, torch.Tensor]]]) -> None:
        """Part p's (A [r, in], B [out_p, r]) or None (that part untouched by the adapter)."""
        self.a_t[slot].zero_()
        self.b_t[slot].zero_()
        if all(p is None for p in pairs):
            self.width[slot] = 0
            return
        row = 0
        for p, (size, pair) in enumerate(zip(self.parts, pairs)):
            if pair is not None:
                a, b = pair
                self.a_t[slot, :, p * rank : (p + 1) * rank] = a.t()
                self.b_t[slot, p * rank : (p + 1) * rank, row : row + size] = b.t()
            row += size
        self.width[slot] = len(self.parts) * rank

    def clear_slot(self, slot: int) -> None:
        self.width[slot] = 0

    def add_(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base projection of ``x``) plus each slot's update on its rows, in place."""
        for slot, rows in self.batch.groups:
            w = self.width[slot]
            if not w:
                continue
            a_t, b_t = self.a_t[slot, :, :w], self.b_t[slot, :w]
            if rows is None:
                y.addmm_(x.mm(a_t), b_t)
            else:
                y.index_add_(0, rows, x.index_select(0, rows).mm(a_t).mm(b_t))
        return y
