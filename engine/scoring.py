"""vLLM's scoring rules, shared by ``LLM.score`` and the /score and /rerank routes.

A score compares two texts. On an embedding model it is the cosine of their two embeddings
(each text is embedded on its own); on a classification model with one label (a cross-encoder)
it is that label's output for the pair encoded together, as the tokenizer encodes a pair
(``tokenizer(text_1, text_2)``), so the model sees both texts in one prompt. A classifier with
several labels has no single score and is refused, as vLLM refuses it. The pairing follows
vLLM: one text against N (1:N) or N against N, never M against N.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union


class ScoreInputError(ValueError):
    """A score input vLLM would refuse; ``field`` names it for an HTTP 400."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def score_pairs(
    data_1: Union[str, Sequence[str]], data_2: Union[str, Sequence[str]], names: tuple[str, str] = ("data_1", "data_2")
) -> list[tuple[str, str]]:
    """The pairs to score, in output order: a lone ``data_1`` is paired with each of
    ``data_2`` (1:N); otherwise both must have the same length (N:N)."""
    first = [data_1] if isinstance(data_1, str) else list(data_1)
    second = [data_2] if isinstance(data_2, str) else list(data_2)
    for values, name in ((first, names[0]), (second, names[1])):
        if not values:
            raise ScoreInputError(f"{name} must hold at least one text", name)
        bad = next((v for v in values if not isinstance(v, str)), None)
        if bad is not None:
            raise ScoreInputError(f"{name} must be a string or a list of strings, got a {type(bad).__name__}", name)
    if len(first) == 1:
        first = first * len(second)
    elif len(first) != len(second):
        raise ScoreInputError(
            f"{names[0]} ({len(first)} texts) and {names[1]} ({len(second)} texts) must be 1:N or N:N", names[1]
        )
    return list(zip(first, second))


def score_mode(pooling_task: Optional[str], labels: Optional[Sequence[str]]) -> str:
    """ "cosine" for an embedding model, "cross" for a one-label classifier; a ValueError for a
    model that has no score."""
    if pooling_task == "embed":
        return "cosine"
    if pooling_task == "classify" and labels is not None and len(labels) == 1:
        return "cross"
    if pooling_task == "classify":
        raise ValueError(
            f"scoring needs an embedding model or a classification model with one label "
            f"(a cross-encoder); this model has {len(labels or ())} labels"
        )
    raise ValueError("scoring is only supported for pooling models; try passing `--runner pooling`")


def cosine(a: Any, b: Any) -> float:
    """The cosine similarity of two pooled float32 tensors (torch is loaded by then: pooled
    outputs arrive as tensors)."""
    import torch

    return float(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0))
