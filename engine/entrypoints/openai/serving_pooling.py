"""POST /pooling and /classify: vLLM's pooling routes over a pooling engine.

/pooling hands back what the model pools for each input, whatever its task: an embedding
model's vector, a classification model's probabilities (as floats, or base64 as for
/v1/embeddings). /classify is for a *ForSequenceClassification model: each input's
probabilities over the labels (softmax; a sigmoid for one label; the logits with
``use_activation=false``), the label of the largest, and the number of classes. Bodies are
parsed through ``OpenAIServing.parse`` (a big one on the renderer pool, weighed by its length).
"""

from __future__ import annotations

from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import decode_request
from engine.entrypoints.openai.pooling_bodies import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    PoolingRequest,
    PoolingResponse,
    PoolingResponseData,
)
from engine.entrypoints.openai.request_fields import request_id
from engine.entrypoints.openai.serving_embeddings import OpenAIServingEmbedding, Prompt, encode_vector, usage
from engine.entrypoints.openai.serving_engine import json_response
from engine.pooling_params import PoolingParams


class OpenAIServingPooling(OpenAIServingEmbedding):
    async def create_pooling(self, request: web.Request) -> web.Response:
        body, model, prompts, params = await self.parse(request, self._parse_pooling)
        response_id = request_id("pool", request, body.request_id)
        finals = await self.pool_all(request, response_id, body, prompts, params, "input")
        data = [
            PoolingResponseData(index=i, data=encode_vector(out.outputs.data, body)) for i, out in enumerate(finals)
        ]
        return json_response(PoolingResponse(id=response_id, model=model, data=data, usage=usage(finals)))

    async def create_classify(self, request: web.Request) -> web.Response:
        body, model, prompts, params = await self.parse(request, self._parse_classify)
        labels = self.engine.model_config.classifier_labels
        response_id = request_id("classify", request, body.request_id)
        finals = await self.pool_all(request, response_id, body, prompts, params, "input")
        data = []
        for i, out in enumerate(finals):
            probs = out.outputs.data.tolist()
            data.append(
                ClassificationData(
                    index=i,
                    label=labels[max(range(len(probs)), key=probs.__getitem__)],
                    probs=probs,
                    num_classes=len(probs),
                )
            )
        return json_response(ClassificationResponse(id=response_id, model=model, data=data, usage=usage(finals)))

    def _parse_pooling(self, raw: bytes) -> tuple[PoolingRequest, str, list[Prompt], PoolingParams]:
        """The /pooling request, the model it names, its batch of inputs and its pooling params."""
        body = decode_request(raw, PoolingRequest)
        model = self.check_model(body.model, adapters=False)
        task = self.engine.model_config.pooling_task
        if body.task is not None and body.task != task:
            raise OpenAIError(
                400,
                f"task={body.task!r} is not supported by this model, which serves {task!r}",
                param="task",
                code="invalid_value",
            )
        if body.dimensions is not None:
            raise OpenAIError(
                400,
                f"dimensions={body.dimensions}: the model does not support matryoshka "
                "representation (changing output dimensions)",
                param="dimensions",
                code="invalid_value",
            )
        params = PoolingParams(
            task=task,
            use_activation=body.use_activation,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            truncation_side=body.truncation_side,
        )
        return body, model, body.prompts(), params

    def _parse_classify(self, raw: bytes) -> tuple[ClassificationRequest, str, list[Prompt], PoolingParams]:
        """The /classify request, the model it names, its batch of inputs and its pooling params."""
        body = decode_request(raw, ClassificationRequest)
        model = self.check_model(body.model, adapters=False)
        params = PoolingParams(
            task="classify",
            use_activation=body.use_activation,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            truncation_side=body.truncation_side,
        )
        return body, model, body.prompts(), params
