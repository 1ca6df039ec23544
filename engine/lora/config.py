"""The LoRA limits (vLLM's ``LoRAConfig``), validated once from the engine arguments.

- ``max_loras``: adapters that may run in one step (the device slots); requests of more
  adapters wait for a slot (the scheduler admits a request only when its adapter has or can
  get one).
- ``max_lora_rank``: the largest rank an adapter may have; the slots are padded to it.
- ``max_cpu_loras``: adapters kept loaded in memory (least recently used dropped first, never
  one that an unfinished request uses); at least ``max_loras``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# vLLM's accepted ranks (vllm/config/lora.py); its default max_lora_rank is 16, max_loras 1.
SUPPORTED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_lora_rank not in SUPPORTED_RANKS:
            raise ValueError(f"max_lora_rank ({self.max_lora_rank}) must be one of {SUPPORTED_RANKS}")
        cpu = self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras
        if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < self.max_loras:
            raise ValueError(f"max_cpu_loras ({cpu!r}) must be an int >= max_loras ({self.max_loras})")
        object.__setattr__(self, "max_cpu_loras", cpu)


def resolve_lora_config(args: Any) -> Optional[LoRAConfig]:
    """The validated limits with ``enable_lora``, else None (the limits then mean nothing, as in vLLM)."""
    if not args.enable_lora:
        return None
    return LoRAConfig(args.max_loras, args.max_lora_rank, args.max_cpu_loras)
