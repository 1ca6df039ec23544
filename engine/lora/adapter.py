"""One loaded adapter: its low-rank pairs per (layer, module), scale folded into B.

Both readers (peft_files.py, gguf_files.py) produce this; ``check_fits`` holds it against the
model before it is used, so a wrong adapter is a ValueError naming it, never a failed step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# The projections an adapter may target, by their PEFT names, and the fused projection of the
# model (engine/models/layers.py) each is a part of, with the part's index in it.
TARGETS = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}


@dataclass
class LoRAAdapter:
    name: str
    rank: int
    # (layer, PEFT module name) -> (A [r, in], B [out, r] * scaling), float32 on the CPU
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * 4 + b.numel() * 4 for a, b in self.pairs.values())

    def check_fits(
        self, shapes: dict[str, tuple[int, int]], num_layers: int, sparse_layers: set[int], max_lora_rank: int
    ) -> None:
        """``shapes``: each module's (out, in) in the base model. Raises ValueError naming the
        adapter and what does not fit."""
        if self.rank > max_lora_rank:
            raise ValueError(f"LoRA adapter {self.name!r}: rank {self.rank} is above max_lora_rank {max_lora_rank}")
        if not self.pairs:
            raise ValueError(f"LoRA adapter {self.name!r} holds no LoRA weights")
        for (layer, module), (a, b) in self.pairs.items():
            if not 0 <= layer < num_layers:
                raise ValueError(
                    f"LoRA adapter {self.name!r}: layer {layer} is not in the base model ({num_layers} layers)"
                )
            if layer in sparse_layers and TARGETS[module][0] in ("gate_up", "down"):
                raise ValueError(
                    f"LoRA adapter {self.name!r}: {module} of layer {layer} is a mixture-of-experts "
                    "layer here, which takes no LoRA"
                )
            out, inp = shapes[module]
            if a.dim() != 2 or b.dim() != 2 or a.shape[1] != inp or b.shape[0] != out or a.shape[0] != b.shape[1]:
                raise ValueError(
                    f"LoRA adapter {self.name!r}: layer {layer} {module} has lora_A {list(a.shape)} "
                    f"and lora_B {list(b.shape)}; the base model's {module} is {out} x {inp}"
                )
