"""vLLM's ``LoRARequest``: which adapter a request runs with.

A msgspec Struct (as vLLM's is) so it travels inside ``EngineCoreRequest`` and utility calls
as it is. ``lora_int_id`` names the adapter inside the engine (slots, caches, prefix-cache
digests); two requests with the same id must mean the same adapter, as in vLLM.
"""

from __future__ import annotations

from typing import Optional

import msgspec


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError("lora_request: lora_name must be a non-empty string")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_request: lora_int_id must be an int >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(
                f"lora_request: lora_path of adapter {self.lora_name!r} must name its directory or .gguf file"
            )

    @property
    def adapter_id(self) -> int:
        """vLLM's alias of ``lora_int_id``."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
