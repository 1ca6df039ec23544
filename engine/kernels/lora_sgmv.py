"""Every adapter slot's low-rank update of one projection in one call: csrc/cpu/lora_sgmv.c, vLLM's
punica SGMV (shrink and expand over the rows of each slot) for float32 on the CPU.

Why: torch took five calls a projection (a gather, two batched float32 GEMMs on shapes such as
64 x 576 x 48 where MKL runs far below its peak, a mask, an index-add), 120 projections a step
of the default model, and 4 adapters served at 0.72x the base (benchmarks/RESULTS.md, "LoRA
serving"). The kernel reads each row of x and adds into y where they lie, feeds every weight
vector it loads to a tile of rows, and skips the zero blocks of a fused projection's expand.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Optional

import torch

from engine.kernels.cpu import available, ffi, kernel_error, lib
from engine.kernels.quant import activations

ISA_C, ISA_AVX2, ISA_AVX512 = 0, 1, 2  # LORA_SGMV_ISA_* (csrc/cpu/lora_sgmv.h)
_BEST_ISA = ISA_C if lib is None else int(lib.lora_sgmv_best_isa())


def best_isa() -> int:
    """The best variant this CPU runs (ISA_*); ISA_C where the extension is missing."""
    return _BEST_ISA


def supports(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the kernel runs adapters held in ``dtype`` on ``device``: float32 on a CPU the
    kernels run on (elsewhere LoRAWeights keeps torch's products)."""
    return available() and dtype == torch.float32 and device.type == "cpu"


class Segments:
    """A step's rows grouped by slot, as the kernel reads them: built once a step (the first
    projection's call) and shared by every projection."""

    __slots__ = ("_tensors", "args")

    def __init__(self, groups: list[tuple[int, list[int]]]) -> None:
        """``groups``: (slot, row indices) for each slot with rows this step; a row in one at most."""
        rows = torch.tensor([r for _, rs in groups for r in rs], dtype=torch.int32)
        slots = torch.tensor([slot for slot, _ in groups], dtype=torch.int32)
        starts = torch.tensor(list(accumulate((len(rs) for _, rs in groups), initial=0)), dtype=torch.int32)
        self._tensors = (rows, slots, starts)  # alive as long as the pointers below
        self.args = (*(ffi.cast("const int32_t *", t.data_ptr()) for t in self._tensors), len(groups))


class SGMV:
    """One projection's adapters as LoRAWeights holds them (``a_t`` [slots, in, cols], ``b_t``
    [slots, cols, out], ``width`` int32 [slots], all float32/int32 on the CPU and updated in
    place) and its parts' output sizes; ``add_`` adds every slot's update on its rows to y."""

    __slots__ = ("in_features", "out_features", "_parts", "_ptrs")

    def __init__(self, a_t: torch.Tensor, b_t: torch.Tensor, width: torch.Tensor, parts: list[int]) -> None:
        for t, dtype in ((a_t, torch.float32), (b_t, torch.float32), (width, torch.int32)):
            if t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"expected contiguous {dtype} CPU tensors, got {t.dtype} on {t.device}")
        slots, self.in_features, cols = a_t.shape
        self.out_features = sum(parts)
        if b_t.shape != (slots, cols, self.out_features) or width.shape != (slots,):
            raise ValueError(f"a_t {tuple(a_t.shape)}, b_t {tuple(b_t.shape)}, width {tuple(width.shape)} disagree")
        self._parts = torch.tensor(parts, dtype=torch.int32)
        self._ptrs = (
            ffi.cast("const float *", a_t.data_ptr()),
            ffi.cast("const float *", b_t.data_ptr()),
            ffi.cast("const int32_t *", width.data_ptr()),
            slots,
            self.in_features,
            cols,
            ffi.cast("const int32_t *", self._parts.data_ptr()),
            len(parts),
        )

    def add_(self, x: torch.Tensor, y: torch.Tensor, segments: Segments, max_isa: Optional[int] = None) -> torch.Tensor:
        """``y[i] += (x[i] @ a_t[s, :, :w]) @ b_t[s, :w]`` for each row i of each segment's slot s,
        in place; x ``[rows, in]`` and y ``[rows, out]`` float32, either a row-strided view.
        ``max_isa`` caps the variant (tests force each)."""
        x, rows, x_stride = activations(x, self.in_features)
        if y.shape != (rows, self.out_features) or y.dtype != torch.float32 or y.stride(1) != 1:
            raise ValueError(
                f"y must be float32 [{rows}, {self.out_features}] with unit column stride, got "
                f"{tuple(y.shape)} {y.dtype} strides {y.stride()}"
            )
        rc = lib.lora_sgmv(
            ffi.cast("const float *", x.data_ptr()),
            x_stride,
            ffi.cast("float *", y.data_ptr()),
            self.out_features if y.is_contiguous() else y.stride(0),  # a lone row's stride is arbitrary
            rows,
            *segments.args,
            *self._ptrs,
            _BEST_ISA if max_isa is None else max_isa,
        )
        if rc:
            raise kernel_error(
                rc, "lora_sgmv", f"rows={rows}, in={self.in_features}, out={self.out_features}", ValueError
            )
        return y
