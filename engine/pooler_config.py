"""vLLM's runner / convert / pooler_config for the architectures served here.

``runner="pooling"`` serves a *ForCausalLM decoder as an embedding model (convert "embed"): the
final normed hidden states, pooled as ``PoolerConfig`` says. A *ForSequenceClassification
checkpoint is a pooling model of its own (task "classify"): its ``score`` head on the last
token's normed hidden state, one logit per label of ``id2label``. Validated here for
``create_engine_config``: a bad value is a ValueError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")
POOLING_TYPES = ("LAST", "MEAN")
CLASSIFIER_SUFFIX = "ForSequenceClassification"


def is_classifier(arch: str) -> bool:
    return arch.endswith(CLASSIFIER_SUFFIX)


def classifier_labels(hf_config: Any) -> list[str]:
    """The label of each class, in the order of the ``score`` head's rows: ``id2label`` as
    transformers saves it (string keys), else ``num_labels`` (transformers' default: 2) as
    ``LABEL_i``."""
    id2label = getattr(hf_config, "id2label", None)
    if id2label:
        labels = {int(k): str(v) for k, v in dict(id2label).items()}
        if sorted(labels) != list(range(len(labels))):
            raise ValueError(f"id2label: the keys must be 0..{len(labels) - 1}, got {sorted(labels)}")
        return [labels[i] for i in range(len(labels))]
    num_labels = getattr(hf_config, "num_labels", None) or 2
    if not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"num_labels must be a positive int, got {num_labels!r}")
    return [f"LABEL_{i}" for i in range(num_labels)]


def _bad(field_name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"{field_name} must be {allowed}, got {value!r}")


@dataclass
class PoolerConfig:
    """How a pooling model turns its final normed hidden states into one vector (vLLM's
    PoolerConfig): ``pooling_type`` LAST (the last prompt token, vLLM's default for decoders) or
    MEAN (the mean over the prompt), and ``normalize`` (L2; default True) unless a request's
    PoolingParams says otherwise."""

    pooling_type: Optional[str] = None
    normalize: Optional[bool] = None


def resolve_runner(runner: str, convert: str, pooler: Any, arch: str) -> tuple[str, str, Optional[PoolerConfig]]:
    """(runner, convert, pooler config) as vLLM resolves them: a *ForCausalLM architecture
    generates under "auto", and "pooling" needs the "embed" conversion (what "auto" picks then);
    a *ForSequenceClassification one always pools, with its own head."""
    if runner not in RUNNERS:
        raise _bad("runner", f"one of {RUNNERS}", runner)
    if convert not in CONVERTS:
        raise _bad("convert", f"one of {CONVERTS}", convert)
    if is_classifier(arch):
        return _resolve_classifier(runner, convert, pooler, arch)
    if runner == "auto":
        runner = "pooling" if convert == "embed" else "generate"
    if runner == "generate":
        if convert == "embed":
            raise ValueError("convert: 'embed' makes a pooling model; it needs runner='pooling' (or 'auto')")
        if pooler is not None:
            raise ValueError("pooler_config: only a pooling model has a pooler; pass runner='pooling'")
        return runner, "none", None
    if convert == "none":
        raise ValueError(
            f"convert: {arch} has no pooling head of its own; runner='pooling' needs convert='embed' (or 'auto')"
        )
    pooler = _pooler_config(pooler)
    pooling_type = "LAST" if pooler.pooling_type is None else str(pooler.pooling_type).upper()
    if pooling_type not in POOLING_TYPES:
        raise _bad("pooler_config.pooling_type", f"one of {POOLING_TYPES}", pooler.pooling_type)
    normalize = True if pooler.normalize is None else pooler.normalize
    if not isinstance(normalize, bool):
        raise _bad("pooler_config.normalize", "a bool", pooler.normalize)
    return runner, "embed", PoolerConfig(pooling_type, normalize)


def _resolve_classifier(runner: str, convert: str, pooler: Any, arch: str) -> tuple[str, str, PoolerConfig]:
    """A *ForSequenceClassification model only pools, with its own head on the last token."""
    if runner == "generate":
        raise ValueError(f"runner: {arch} has no LM head to generate with; use runner='pooling' (or 'auto')")
    if convert == "embed":
        raise ValueError(f"convert: {arch} is a classification model already; use convert='none' (or 'auto')")
    pooling_type = _pooler_config(pooler).pooling_type
    if pooling_type is not None and str(pooling_type).upper() != "LAST":
        raise _bad("pooler_config.pooling_type", f"LAST for {arch} (its head reads the last token)", pooling_type)
    return "pooling", "none", PoolerConfig("LAST", False)


def _pooler_config(pooler: Any) -> PoolerConfig:
    """The ``pooler_config`` argument (None, a dict or a PoolerConfig) as a PoolerConfig."""
    if pooler is None:
        return PoolerConfig()
    if isinstance(pooler, dict):
        try:
            return PoolerConfig(**pooler)
        except TypeError as e:
            raise ValueError(f"pooler_config: {e} (fields: pooling_type, normalize)") from e
    if not isinstance(pooler, PoolerConfig):
        raise _bad("pooler_config", "a dict or a PoolerConfig", pooler)
    return pooler
