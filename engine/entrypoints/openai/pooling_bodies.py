"""Request and response bodies of vLLM's pooling and scoring routes: /pooling, /classify,
/score (/v1/score) and /rerank (/v1/rerank, /v2/rerank), in vLLM's shapes.

The fields they share with /v1/embeddings are declared once (``http_bodies.PoolingBasicFields``
and ``PoolingInputFields``, vLLM's request mixins); field_support.py places every vLLM field.
"""

from __future__ import annotations

import time
from typing import Annotated, Optional, Union

import msgspec
from msgspec import Meta, Struct

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import (
    EmbeddingRequest,
    EmbeddingUsage,
    PoolingBasicFields,
    PoolingInputFields,
)

ScoreTexts = Union[str, list[str]]  # vLLM's ScoreInputs, text only
MAX_TOP_N = 1 << 31


class PoolingRequest(EmbeddingRequest, kw_only=True):
    """POST /pooling: the model's pooled output for each input. ``task`` (vLLM's PoolingTask):
    None or the task the model serves ("embed" or "classify")."""

    task: Optional[str] = None


class ClassificationRequest(PoolingInputFields, kw_only=True):
    """POST /classify (a *ForSequenceClassification model)."""


# The four ways vLLM names a score request's two sides, in the order they are looked for.
SCORE_FORMS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


class ScoreRequest(PoolingBasicFields, kw_only=True):
    """POST /score and /v1/score: ``text_1`` against ``text_2`` (or ``queries`` against
    ``documents`` or ``items``, or ``data_1`` against ``data_2``), 1:N or N:N."""

    text_1: Optional[ScoreTexts] = None
    text_2: Optional[ScoreTexts] = None
    queries: Optional[ScoreTexts] = None
    documents: Optional[ScoreTexts] = None
    items: Optional[ScoreTexts] = None
    data_1: Optional[ScoreTexts] = None
    data_2: Optional[ScoreTexts] = None

    def sides(self) -> tuple[ScoreTexts, ScoreTexts, tuple[str, str]]:
        """The two sides and their field names; a 400 naming the field unless exactly one
        form is given whole."""
        given = [(a, b) for a, b in SCORE_FORMS if getattr(self, a) is not None and getattr(self, b) is not None]
        if len(given) == 2 and given[0][0] == given[1][0] == "queries":
            raise OpenAIError(
                400, "give either documents or items with queries, not both", param="items", code="invalid_value"
            )
        if len(given) > 1:
            raise OpenAIError(
                400,
                f"give one pair of fields: {given[0][0]}/{given[0][1]} and {given[1][0]}/{given[1][1]} were both given",
                param=given[1][0],
                code="invalid_value",
            )
        if not given:
            missing = next(
                (
                    b if getattr(self, a) is not None else a
                    for a, b in SCORE_FORMS
                    if getattr(self, a) is not None or getattr(self, b) is not None
                ),
                "text_1",
            )
            raise OpenAIError(
                400,
                f"{missing} is required (a score compares text_1 with text_2, queries with "
                "documents or items, or data_1 with data_2)",
                param=missing,
                code="invalid_value",
            )
        first, second = given[0]
        return getattr(self, first), getattr(self, second), (first, second)


class RerankRequest(PoolingBasicFields, kw_only=True):
    """POST /rerank, /v1/rerank, /v2/rerank: Jina's and Cohere's body (vLLM's RerankRequest).
    ``top_n`` <= 0 returns every document; ``return_documents`` (Cohere's) leaves the texts out
    when False."""

    query: str
    documents: list[str]
    top_n: Annotated[int, Meta(ge=-MAX_TOP_N, le=MAX_TOP_N)] = 0
    return_documents: bool = True


# ---- responses ----


class PoolingResponseData(Struct, kw_only=True):
    index: int
    object: str = "pooling"
    data: Union[list[float], str]  # floats, or base64 as for /v1/embeddings


class PoolingResponse(Struct, kw_only=True):
    id: str  # pool-{request id}
    object: str = "list"
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingResponseData]
    usage: EmbeddingUsage


class ClassificationData(Struct, kw_only=True):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(Struct, kw_only=True):
    id: str  # classify-{request id}
    object: str = "list"
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: EmbeddingUsage


class ScoreResponseData(Struct, kw_only=True):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(Struct, kw_only=True):
    id: str  # score-{request id}
    object: str = "list"
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreResponseData]
    usage: EmbeddingUsage


class RerankDocument(Struct, kw_only=True):
    text: str


class RerankResult(Struct, kw_only=True, omit_defaults=True):
    index: int
    document: Optional[RerankDocument] = None  # left out with return_documents=False
    relevance_score: float


class RerankResponse(Struct, kw_only=True):
    id: str  # rerank-{request id}
    model: str
    usage: EmbeddingUsage
    results: list[RerankResult]
