"""PoolingParams: what a pooling request (``LLM.embed``/``encode``, /v1/embeddings) asks for.

A msgspec Struct, like SamplingParams, because it crosses the ring inside the request
(``EngineCoreRequest.pooling_params``). vLLM's fields that apply to a decoder served as an
embedding model or to a classification model: ``task``, ``normalize`` (None: the engine's
``pooler_config``, True unless set) and ``dimensions`` (matryoshka truncation, which no model
here supports, so any value is refused). How rows are pooled (LAST or MEAN) is the engine's
``pooler_config``, as in vLLM. ``use_activation`` is vLLM's newer name for the activation: an
embedding's L2 normalisation (when set it decides, over ``normalize``), a classification's
softmax (sigmoid for one label). ``truncate_prompt_tokens`` and ``truncation_side`` cut the
prompt as for SamplingParams.
"""

from __future__ import annotations

from typing import Optional

import msgspec

from engine.sampling_params import RequestOutputKind, verify_truncation

# "embed": a decoder converted to an embedding model; "classify": a *ForSequenceClassification
# model (ModelConfig.pooling_task says which one the engine's model serves).
POOLING_TASKS = ("embed", "classify")


class PoolingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    task: Optional[str] = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    use_activation: Optional[bool] = None
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: Optional[str] = None

    @property
    def normalized(self) -> Optional[bool]:
        """Whether to L2-normalise (None: the engine's pooler_config decides)."""
        return self.use_activation if self.use_activation is not None else self.normalize

    def verify(self, task: Optional[str] = None) -> None:
        """ValueError naming the field when this engine cannot serve these params."""
        if self.dimensions is not None:
            raise ValueError(
                f"PoolingParams.dimensions={self.dimensions!r}: the model does not support "
                "matryoshka representation (changing output dimensions)"
            )
        for name in ("normalize", "use_activation"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"PoolingParams.{name} must be a bool or None, got {getattr(self, name)!r}")
        verify_truncation(self.truncate_prompt_tokens, self.truncation_side, "PoolingParams")
        chosen = task if task is not None else self.task
        if chosen is not None and chosen not in POOLING_TASKS:
            raise ValueError(f"pooling_task must be one of {POOLING_TASKS}, got {chosen!r}")
