"""POST /score (/v1/score) and /rerank (/v1/rerank, /v2/rerank): vLLM's scoring routes.

A score compares two texts by vLLM's rules (engine/scoring.py): the cosine of their embeddings
on an embedding model, the pair's output on a one-label classification model (a cross-encoder),
which sees both texts as one prompt. /rerank scores a query against each document and answers
in Jina's and Cohere's shape, most relevant first, cut to ``top_n``. The body is parsed and
paired on the renderer pool when it is big (``OpenAIServing.parse``, weighed by its length).
"""

from __future__ import annotations

from typing import NamedTuple

from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import PoolingBasicFields, decode_request
from engine.entrypoints.openai.pooling_bodies import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreRequest,
    ScoreResponse,
    ScoreResponseData,
    ScoreTexts,
)
from engine.entrypoints.openai.request_fields import request_id
from engine.entrypoints.openai.serving_embeddings import OpenAIServingEmbedding, usage
from engine.entrypoints.openai.serving_engine import json_response
from engine.outputs import PoolingRequestOutput
from engine.pooling_params import PoolingParams
from engine.scoring import ScoreInputError, cosine, score_mode, score_pairs


class OpenAIServingScore(OpenAIServingEmbedding):
    async def create_score(self, request: web.Request) -> web.Response:
        body, model, scoring = await self.parse(request, self._parse_score)
        response_id = request_id("score", request, body.request_id)
        scores, outputs = await self._score(request, response_id, body, scoring)
        data = [ScoreResponseData(index=i, score=score) for i, score in enumerate(scores)]
        return json_response(ScoreResponse(id=response_id, model=model, data=data, usage=usage(outputs)))

    async def create_rerank(self, request: web.Request) -> web.Response:
        body, model, scoring = await self.parse(request, self._parse_rerank)
        response_id = request_id("rerank", request, body.request_id)
        scores, outputs = await self._score(request, response_id, body, scoring)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep document order
        if body.top_n > 0:
            order = order[: body.top_n]
        results = [
            RerankResult(
                index=i,
                relevance_score=scores[i],
                document=RerankDocument(text=body.documents[i]) if body.return_documents else None,
            )
            for i in order
        ]
        return json_response(RerankResponse(id=response_id, model=model, usage=usage(outputs), results=results))

    def _parse_score(self, raw: bytes) -> tuple[ScoreRequest, str, "_Scoring"]:
        """The /score request, the model it names and what to score (see ``parse``)."""
        body = decode_request(raw, ScoreRequest)
        model = self.check_model(body.model, adapters=False)
        first, second, names = body.sides()
        return body, model, self._scoring(body, first, second, names)

    def _parse_rerank(self, raw: bytes) -> tuple[RerankRequest, str, "_Scoring"]:
        """The /rerank request, the model it names and what to score (see ``parse``)."""
        body = decode_request(raw, RerankRequest)
        model = self.check_model(body.model, adapters=False)
        return body, model, self._scoring(body, body.query, body.documents, ("query", "documents"))

    def _scoring(
        self, body: PoolingBasicFields, first: ScoreTexts, second: ScoreTexts, names: tuple[str, str]
    ) -> "_Scoring":
        """How this model scores, the pairs (1:N or N:N; a 400 naming the side at fault) and the
        pooling params."""
        mc = self.engine.model_config
        try:
            mode = score_mode(mc.pooling_task, mc.classifier_labels)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), code="model_not_supported") from None
        try:
            pairs = score_pairs(first, second, names)
        except ScoreInputError as exc:
            raise OpenAIError(400, str(exc), param=exc.field, code="invalid_value") from None
        params = PoolingParams(
            task=mc.pooling_task,
            use_activation=body.use_activation,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            truncation_side=body.truncation_side,
        )
        return _Scoring(mode, pairs, params, names[1])

    async def _score(
        self, request: web.Request, response_id: str, body: PoolingBasicFields, scoring: "_Scoring"
    ) -> tuple[list[float], list[PoolingRequestOutput]]:
        """One score per pair, and the engine outputs they were made from (for usage)."""
        pairs, params, param = scoring.pairs, scoring.params, scoring.param
        if scoring.mode == "cross":
            outputs = await self.pool_all(request, response_id, body, pairs, params, param)
            return [float(out.outputs.data[0]) for out in outputs], outputs
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))  # each distinct text embedded once
        outputs = await self.pool_all(request, response_id, body, texts, params, param)
        vectors = {text: out.outputs.data for text, out in zip(texts, outputs)}
        return [cosine(vectors[a], vectors[b]) for a, b in pairs], outputs


class _Scoring(NamedTuple):
    mode: str  # engine/scoring.py's score_mode: "cosine" or "cross"
    pairs: list[tuple[str, str]]
    params: PoolingParams
    param: str  # the field a 400 for too many inputs names
