"""The low-rank update of one projection, for every adapter slot, on the rows of each slot.

A ``Linear`` (engine/models/linear.py) that carries ``LoRAWeights`` adds them to whatever its
method computed (dense torch, oneDNN, the C GEMV, GGUF blocks, int8): the base projection runs
once for the whole step, then each slot's adapter runs on its own rows only,
``y[rows] += (x[rows] @ A^T) @ B^T`` (vLLM's punica shrink and expand, grouped by slot).

With several slots in a step their rows are laid out as ``[slots, most rows]`` (``GroupedRows``)
and every slot's update is one pair of batched products, ``bmm(bmm(x[rows], A), B)``, over the
slots' adapters side by side (a view of the weights when the step's slots are consecutive),
then one index-add: five torch calls a projection whatever the number of slots, against four
per slot (the gather, two products, the index-add), which at 4 slots was ~2,000 calls a step of
the default model (benchmarks/RESULTS.md, "LoRA serving").

A fused projection (q/k/v, gate/up) holds its parts side by side: part p of a slot's adapter
takes columns ``[p * r, (p + 1) * r)`` of the shrink and writes its own output rows, so one
shrink and one expand cover all parts (the expand's off-part blocks are zeros). A slot computes
only the ``parts * r`` columns its adapter has, not the padded ``max_lora_rank``.
"""

from __future__ import annotations

from typing import Optional

import torch


class GroupedRows:
    """Several slots' rows of a step as a ``[len(slot_ids), most]`` grid of row indices (a slot
    with fewer rows is padded with its first row, whose padded updates ``keep`` zeroes)."""

    __slots__ = ("slot_ids", "slots", "index", "keep", "most")

    def __init__(self, rows: dict[int, list[int]], device: torch.device) -> None:
        self.slot_ids = sorted(rows)
        lo, hi = self.slot_ids[0], self.slot_ids[-1]
        consecutive = hi - lo + 1 == len(self.slot_ids)
        # the weights of the step's slots: a view when they are consecutive, else a gather
        self.slots: "slice | torch.Tensor" = (
            slice(lo, hi + 1) if consecutive else torch.tensor(self.slot_ids, dtype=torch.long, device=device)
        )
        self.most = max(len(r) for r in rows.values())
        index, keep = [], []
        for slot in self.slot_ids:
            r = rows[slot]
            index += r + [r[0]] * (self.most - len(r))
            keep += [1.0] * len(r) + [0.0] * (self.most - len(r))
        self.index = torch.tensor(index, dtype=torch.long, device=device)
        self.keep = (
            torch.tensor(keep, device=device).unsqueeze(1) if len(index) > sum(map(len, rows.values())) else None
        )


class LoRABatch:
    """This step's rows per slot, shared by every projection. One slot: ``groups`` holds
    ``(slot, rows)``, ``rows`` None when the slot has every row of the step; several: ``grouped``.
    Set by the runner before the forward."""

    __slots__ = ("groups", "grouped")

    def __init__(self) -> None:
        self.groups: list[tuple[int, Optional[torch.Tensor]]] = []
        self.grouped: Optional[GroupedRows] = None


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
        grouped = self.batch.grouped
        if grouped is not None:
            return self._add_grouped(x, y, grouped)
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

    def _add_grouped(self, x: torch.Tensor, y: torch.Tensor, g: GroupedRows) -> torch.Tensor:
        w = max(self.width[slot] for slot in g.slot_ids)
        if not w:
            return y
        # columns past a slot's own width, and slots whose adapter skips this projection, are zeros
        a_t, b_t = self.a_t[g.slots, :, :w], self.b_t[g.slots, :w]
        xs = x.index_select(0, g.index).view(len(g.slot_ids), g.most, x.shape[1])
        update = torch.bmm(torch.bmm(xs, a_t), b_t).view(-1, y.shape[1])
        if g.keep is not None:
            update.mul_(g.keep)
        return y.index_add_(0, g.index, update)
