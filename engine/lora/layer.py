"""The low-rank update of one projection, for every adapter slot, on the rows of each slot.

A ``Linear`` (engine/models/linear.py) that carries ``LoRAWeights`` adds them to whatever its
method computed (dense torch, oneDNN, the C GEMV, GGUF blocks, int8): the base projection runs
once for the whole step, then each slot's adapter runs on its own rows only,
``y[rows] += (x[rows] @ A^T) @ B^T`` (vLLM's punica shrink and expand, grouped by slot).

In float32 on a CPU every slot's update is one call of the SGMV kernel
(engine/kernels/lora_sgmv.py): it replaced five torch calls a projection (a gather, two batched
GEMMs over the slots side by side, a mask, an index-add) that held 4 adapters to 0.72x of the
base's throughput (benchmarks/RESULTS.md, "LoRA serving"). Elsewhere (bf16/fp16 activations, a
GPU) torch runs each slot's products on its rows.

A fused projection (q/k/v, gate/up) holds its parts side by side: part p of a slot's adapter
takes columns ``[p * r, (p + 1) * r)`` of the shrink and writes its own output rows (the expand's
off-part blocks are zeros, which the kernel skips). A slot computes only the ``parts * r``
columns its adapter has, not the padded ``max_lora_rank``.
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.kernels import lora_sgmv


class LoRABatch:
    """This step's rows of each slot, shared by every projection; set by the manager before the
    forward. Each path's form of them is built by the step's first projection that needs it."""

    __slots__ = ("groups", "_segments", "_index")

    def __init__(self) -> None:
        self.set([])

    def set(self, groups: list[tuple[int, list[int]]]) -> None:
        """``groups``: (slot, row indices) for each slot with rows this step; a row in one at most."""
        self.groups = groups
        self._segments: Optional[lora_sgmv.Segments] = None
        self._index: Optional[list[tuple[int, Optional[torch.Tensor]]]] = None

    def segments(self) -> lora_sgmv.Segments:
        """The groups as the SGMV kernel reads them."""
        if self._segments is None:
            self._segments = lora_sgmv.Segments(self.groups)
        return self._segments

    def index(self, rows: int, device: torch.device) -> list[tuple[int, Optional[torch.Tensor]]]:
        """The groups as torch's path reads them: each slot's rows as indices on ``device``, None
        for a slot that has all ``rows`` rows in order (no gather)."""
        if self._index is None:
            self._index = [
                (slot, None if rs == list(range(rows)) else torch.tensor(rs, dtype=torch.long, device=device))
                for slot, rs in self.groups
            ]
        return self._index


class LoRAWeights:
    __slots__ = ("a_t", "b_t", "parts", "width", "batch", "_sgmv")

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
        # columns of each slot's shrink in use (0: the adapter skips this projection); int32 on the
        # CPU whatever the device, as the kernel reads it
        self.width = torch.zeros(slots, dtype=torch.int32)
        self.batch = batch
        self._sgmv = (
            lora_sgmv.SGMV(self.a_t, self.b_t, self.width, parts) if lora_sgmv.supports(dtype, device) else None
        )

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
        if not self.batch.groups:
            return y
        if self._sgmv is not None:
            return self._sgmv.add_(x, y, self.batch.segments())
        widths = self.width.tolist()
        for slot, rows in self.batch.index(y.shape[0], y.device):
            w = widths[slot]
            if not w:
                continue
            a_t, b_t = self.a_t[slot, :, :w], self.b_t[slot, :w]
            if rows is None:
                y.addmm_(x.mm(a_t), b_t)
            else:
                y.index_add_(0, rows, x.index_select(0, rows).mm(a_t).mm(b_t))
        return y
