"""The worker's adapters: loaded ones in memory (LRU), ``max_loras`` slots in the projections.

- ``add_lora`` reads an adapter (PEFT directory or GGUF file) and checks it against the model;
  what does not fit is a ValueError naming the adapter, raised before any request runs with it.
  At most ``max_cpu_loras`` stay loaded, the least recently used dropped first, never one
  that holds a slot (a dropped adapter is read again from its ``lora_path`` when a request
  needs it).
- ``set_batch`` (each step, before the forward) puts every adapter of the step into a slot,
  replacing the least recently used adapter that the step does not need, and tells the
  projections which rows each slot has. The scheduler never runs more than ``max_loras``
  adapters at once (engine/core/scheduler.py), so a slot is always free for the step.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import Any, Optional

from engine.lora.adapter import LoRAAdapter
from engine.lora.config import LoRAConfig
from engine.lora.layer import LoRABatch, LoRAWeights
from engine.lora.request import LoRARequest
from engine.models.weights import pair_rows

logger = logging.getLogger(__name__)

# Each fused projection's parts, by PEFT module name, in row order (engine/models/layers.py).
_PARTS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


def load_adapter(req: LoRARequest, num_heads: int, num_kv_heads: int) -> LoRAAdapter:
    """The adapter at ``req.lora_path``: a llama.cpp GGUF file or a PEFT directory."""
    from engine.lora.gguf_files import is_gguf, load_gguf_adapter
    from engine.lora.peft_files import load_peft_adapter

    path = os.path.expanduser(req.lora_path)
    if is_gguf(path):
        return load_gguf_adapter(path, req.lora_name, num_heads, num_kv_heads)
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter {req.lora_name!r}: lora_path is neither a directory nor a .gguf file")
    return load_peft_adapter(path, req.lora_name)


class LoRAManager:
    def __init__(self, model: Any, config: LoRAConfig) -> None:
        self.config = config
        self._dims = d = model.dims
        self._heads = (d.num_heads, d.num_kv_heads)
        self._num_layers = d.num_layers
        self._sparse = {i for i, layer in enumerate(model.layers) if layer.moe is not None}
        self._shapes = {
            "q_proj": (d.q_size, d.hidden),
            "k_proj": (d.kv_size, d.hidden),
            "v_proj": (d.kv_size, d.hidden),
            "o_proj": (d.hidden, d.q_size),
            "gate_proj": (d.intermediate, d.hidden),
            "up_proj": (d.intermediate, d.hidden),
            "down_proj": (d.hidden, d.intermediate),
        }
        self.batch = LoRABatch()
        self._weights: list[tuple[int, str, LoRAWeights]] = []  # (layer, fused name, weights)
        for i, layer in enumerate(model.layers):
            for fused, modules in _PARTS.items():
                if i in self._sparse and fused in ("gate_up", "down"):
                    continue  # experts take no LoRA (LoRAAdapter.check_fits refuses such adapters)
                linear = getattr(layer, fused)
                parts = [self._shapes[m][0] for m in modules]
                linear.lora = LoRAWeights(
                    parts,
                    self._shapes[modules[0]][1],
                    config.max_loras,
                    config.max_lora_rank,
                    model.act_dtype,
                    model.device,
                    self.batch,
                )
                self._weights.append((i, fused, linear.lora))
        self._loaded: OrderedDict[int, tuple[LoRARequest, LoRAAdapter]] = OrderedDict()
        self._slots: list[Optional[int]] = [None] * config.max_loras  # lora_int_id in each slot
        self._slot_use: list[int] = [0] * config.max_loras  # the step each slot last ran in (LRU)
        self._step = 0

    # ------------------------------------------------------------------ adapters in memory
    def add_lora(self, req: LoRARequest) -> bool:
        """Load and check ``req``'s adapter unless the same one is loaded; False if it was."""
        known = self._loaded.get(req.lora_int_id)
        if known is not None and known[0] == req:
            self._loaded.move_to_end(req.lora_int_id)
            return False
        adapter = load_adapter(req, *self._heads)
        adapter.check_fits(self._shapes, self._num_layers, self._sparse, self.config.max_lora_rank)
        self._pair_rotary_rows(adapter)
        if known is not None:  # the same id for another adapter: the old one leaves its slot
            self._drop_from_slots(req.lora_int_id)
        self._loaded[req.lora_int_id] = (req, adapter)
        self._loaded.move_to_end(req.lora_int_id)
        # Beyond max_cpu_loras the least recently used go, never one in a slot (a step may be
        # running it: the slots hold at most max_loras <= max_cpu_loras adapters).
        for old in [lid for lid in self._loaded if lid not in self._slots and lid != req.lora_int_id]:
            if len(self._loaded) <= self.config.max_cpu_loras:
                break
            del self._loaded[old]
        logger.info(
            "LoRA adapter %r (id %d) loaded: rank %d, %d pairs, %.1f MiB",
            req.lora_name,
            req.lora_int_id,
            adapter.rank,
            len(adapter.pairs),
            adapter.nbytes / 2**20,
        )
        return True

    def _pair_rotary_rows(self, adapter: LoRAAdapter) -> None:
        """q and k output rows (B's rows) in the order the model holds them: adjacent rotary pairs,
        as engine/models/weights.py reorders the base q/k rows."""
        d = self._dims
        for (layer, module), (a, b) in adapter.pairs.items():
            if module in ("q_proj", "k_proj"):
                heads = d.num_heads if module == "q_proj" else d.num_kv_heads
                adapter.pairs[(layer, module)] = (a, pair_rows(b, heads, d.head_dim, d.rotary_dim))

    def remove_lora(self, lora_int_id: int) -> bool:
        if self._loaded.pop(lora_int_id, None) is None:
            return False
        self._drop_from_slots(lora_int_id)
        return True

    def list_loras(self) -> list[int]:
        return list(self._loaded)

    def _drop_from_slots(self, lora_int_id: int) -> None:
        for slot, held in enumerate(self._slots):
            if held == lora_int_id:
                self._slots[slot] = None
                for _, _, w in self._weights:
                    w.clear_slot(slot)

    # ------------------------------------------------------------------ one step
    def set_batch(self, requests: list[Any], counts: list[int], first_rows: list[int]) -> None:
        """Slots for this step's adapters and each slot's rows (``requests[i]`` computes rows
        ``first_rows[i] .. + counts[i]``)."""
        self._step += 1
        ids = [r.lora_request.lora_int_id if r.lora_request is not None else 0 for r in requests]
        wanted = {lid: r.lora_request for lid, r in zip(ids, requests) if lid}
        if not wanted:
            self.batch.set([])
            return
        if len(wanted) > len(self._slots):
            raise RuntimeError(f"{len(wanted)} LoRA adapters in one step, above max_loras={len(self._slots)}")
        slot_of = {lid: self._slot_for(lid, req, wanted) for lid, req in wanted.items()}
        rows: dict[int, list[int]] = {}
        for lid, start, n in zip(ids, first_rows, counts):
            if lid:
                rows.setdefault(slot_of[lid], []).extend(range(start, start + n))
        self.batch.set(list(rows.items()))

    def _slot_for(self, lid: int, req: LoRARequest, wanted: dict[int, LoRARequest]) -> int:
        if lid in self._slots:
            slot = self._slots.index(lid)
        else:
            free = [s for s, held in enumerate(self._slots) if held is None or held not in wanted]
            slot = min(free, key=lambda s: (self._slots[s] is not None, self._slot_use[s]))
            self._install(slot, req)
        self._slot_use[slot] = self._step
        return slot

    def _install(self, slot: int, req: LoRARequest) -> None:
        self._slots[slot] = None  # its adapter leaves it (and may leave memory for this one)
        self.add_lora(req)  # a no-op when loaded; read again when it was dropped from memory
        _, adapter = self._loaded[req.lora_int_id]
        for layer, fused, w in self._weights:
            w.set_slot(slot, adapter.rank, [adapter.pairs.get((layer, m)) for m in _PARTS[fused]])
        self._slots[slot] = req.lora_int_id
