"""PoolingParams: what a pooling request (``LLM.embed``/``encode``, /v1/embeddings) asks for.

A msgspec Struct, like SamplingParams, because it crosses the ring inside the request
(``EngineCoreRequest.pooling_params``). vLLM's fields that apply to a decoder served as an
embedding model: ``task``, ``normalize`` (None: the engine's ``pooler_config``, True unless
set) and ``dimensions`` (matryoshka truncation, which no model here supports, so any value is
refused). How rows are pooled (LAST or MEAN) is the engine's ``pooler_config``, as in vLLM.
"""
from __future__ import annotations

from typing import Optional

import msgspec

from engine.sampling_params import RequestOutputKind

POOLING_TASKS = ("embed",)  # what a decoder converted to an embedding model serves


class PoolingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    task: Optional[str] = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def verify(self, task: Optional[str] = None) -> None:
        """ValueError naming the field when this engine cannot serve these params."""
        if self.dimensions is not None:
            raise ValueError(f"PoolingParams.dimensions={self.dimensions!r}: the model does not support "
                             "matryoshka representation (changing output dimensions)")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"PoolingParams.normalize must be a bool or None, got {self.normalize!r}")
        chosen = task if task is not None else self.task
        if chosen is not None and chosen not in POOLING_TASKS:
            raise ValueError(f"pooling_task must be one of {POOLING_TASKS} for this model, got {chosen!r}")
