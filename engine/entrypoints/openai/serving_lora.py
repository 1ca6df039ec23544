"""LoRA adapters as models of the server (vLLM's ``--lora-modules`` and its adapter routes).

Each adapter is served under its own name: listed by /v1/models with the base model as its
``parent``, and chosen by ``model=<name>`` in a request (``OpenAIServing.check_model``). The
adapters of ``--lora-modules`` are loaded before the port opens (a bad one stops the start,
naming it); ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` change the set at run time
only when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is true (else they answer 404, as vLLM's do,
which registers no such routes). Ids (``lora_int_id``) are numbered here, one per load, never
reused, so a name loaded again with another path never shares prefix-cache blocks with the old
one (engine/core/kv_cache.py).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Optional

from aiohttp import web
from msgspec import Struct

from engine import envs
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import ModelCard, decode_request
from engine.lora.request import LoRARequest


@dataclass(frozen=True)
class LoRAModulePath:
    """One ``--lora-modules`` entry (vLLM's name)."""

    name: str
    path: str
    base_model_name: Optional[str] = None


def parse_lora_module(value: str) -> LoRAModulePath:
    """``name=path`` or ``{"name": ..., "path": ..., "base_model_name": ...}``, as vLLM takes them."""
    text = value.strip()
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except ValueError:
            raise ValueError(f"--lora-modules: {value!r} is not valid JSON") from None
        unknown = sorted(set(fields) - {"name", "path", "base_model_name"}) if isinstance(fields, dict) else []
        if (
            not isinstance(fields, dict)
            or unknown
            or not isinstance(fields.get("name"), str)
            or not isinstance(fields.get("path"), str)
        ):
            raise ValueError(
                f"--lora-modules: {value!r} must be name=path or a JSON object with the strings "
                "name, path and optionally base_model_name"
            )
        return LoRAModulePath(fields["name"], fields["path"], fields.get("base_model_name"))
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules: {value!r} must be name=path or a JSON object")
    return LoRAModulePath(name, path)


class LoadLoRAAdapterRequest(Struct):
    lora_name: str
    lora_path: str
    load_inplace: bool = False  # vLLM's: replace an adapter of that name instead of refusing


class UnloadLoRAAdapterRequest(Struct):
    lora_name: str
    lora_int_id: Optional[int] = None


class ServedLoRAs:
    """The adapters the server serves, by name; one instance shared by every endpoint."""

    def __init__(self, engine: Any, base_model: str) -> None:
        self.engine = engine
        self.base_model = base_model
        self._by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def request_for(self, model: Optional[str]) -> Optional[LoRARequest]:
        return self._by_name.get(model) if model is not None else None

    def cards(self, created: int, max_model_len: int) -> list[ModelCard]:
        return [
            ModelCard(name, created, max_model_len, root=name, parent=req.base_model_name or self.base_model)
            for name, req in self._by_name.items()
        ]

    async def load(self, module: LoRAModulePath, replace: bool = False) -> None:
        """Load and check the adapter in the engine, then serve it; ValueError from the engine
        (a bad adapter) is a 400 naming ``lora_path``."""
        if module.name in self._by_name and not replace:
            raise OpenAIError(
                400,
                f"The lora adapter '{module.name}' has already been loaded.",
                param="lora_name",
                code="invalid_value",
            )
        if module.name == self.base_model:
            raise OpenAIError(
                400, f"lora_name {module.name!r} is the base model's name", param="lora_name", code="invalid_value"
            )
        try:
            request = LoRARequest(module.name, next(self._ids), module.path, module.base_model_name)
            await self.engine.add_lora(request)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="lora_path", code="invalid_value") from None
        old = self._by_name.get(module.name)
        self._by_name[module.name] = request
        if old is not None:
            await self.engine.remove_lora(old.lora_int_id)

    async def unload(self, name: str) -> None:
        request = self._by_name.pop(name, None)
        if request is None:
            raise OpenAIError(
                404,
                f"The lora adapter '{name}' cannot be found.",
                type="NotFoundError",
                param="lora_name",
                code="model_not_found",
            )
        await self.engine.remove_lora(request.lora_int_id)

    async def load_route(self, request: web.Request) -> web.Response:
        _check_runtime_updating()
        body = decode_request(await request.read(), LoadLoRAAdapterRequest)
        await self.load(LoRAModulePath(body.lora_name, body.lora_path), replace=body.load_inplace)
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload_route(self, request: web.Request) -> web.Response:
        _check_runtime_updating()
        body = decode_request(await request.read(), UnloadLoRAAdapterRequest)
        await self.unload(body.lora_name)
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _check_runtime_updating() -> None:
    if not envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:
        raise OpenAIError(
            404,
            "Not Found: set VLLM_ALLOW_RUNTIME_LORA_UPDATING=true to load and unload LoRA adapters at run time",
            type="NotFoundError",
            code="not_found",
        )
