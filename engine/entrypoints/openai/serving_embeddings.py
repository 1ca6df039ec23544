"""POST /v1/embeddings: OpenAI's embeddings API over a pooling engine (``--runner pooling``).

Each input of a batch is its own engine request (``AsyncLLM.encode``), admitted like a
completion prompt; the vectors come back in input order, as a list of floats or, with
``encoding_format="base64"``, as base64 of their little-endian float32 bytes (what the
``openai`` client asks for by default and decodes with numpy).
"""
from __future__ import annotations

import base64
import contextlib
from typing import Any, AsyncIterator, Callable, Union

from aiohttp import web

from engine.entrypoints.openai.protocol import (EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
                                                OpenAIError, decode_request, random_id)
from engine.entrypoints.openai.serving_engine import OpenAIServing, json_response
from engine.frontend.renderer import RendererBusyError
from engine.outputs import PoolingRequestOutput
from engine.pooling_params import PoolingParams


class OpenAIServingEmbedding(OpenAIServing):
    async def create_embedding(self, request: web.Request) -> web.Response:
        body = decode_request(await request.read(), EmbeddingRequest)
        model = self.check_model(body.model)
        if body.dimensions is not None:
            raise OpenAIError(400, f"dimensions={body.dimensions}: the model does not support matryoshka "
                              "representation (changing output dimensions)", param="dimensions",
                              code="invalid_value")
        prompts = body.prompts()
        params = PoolingParams(task="embed")
        request_id = random_id("embd")
        finals: dict[int, PoolingRequestOutput] = {}
        with self.admit(len(prompts), 1) as started:
            outputs = self.generate_all([p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts],
                                        params, request_id, started)
            async with contextlib.aclosing(outputs), self.time_limit(self.deadline()):
                async for i, output in outputs:
                    finals[i] = output
        data = [EmbeddingData(index=i, embedding=_encode(finals[i].outputs.data, body.encoding_format))
                for i in range(len(prompts))]
        tokens = sum(len(finals[i].prompt_token_ids) for i in range(len(prompts)))
        return json_response(EmbeddingResponse(data=data, model=model, usage=EmbeddingUsage(tokens, tokens)))

    async def generate(self, prompt: Any, params: PoolingParams, request_id: str,
                       started: Callable[[], None]) -> AsyncIterator[PoolingRequestOutput]:
        """The engine's one output for an admitted input (``encode``, not ``generate``); closing
        this stream early aborts the request in the core."""
        try:
            async with contextlib.aclosing(self.engine.encode(prompt, params, request_id)) as outputs:
                async for output in outputs:
                    started()
                    yield output
        except RendererBusyError as exc:
            raise self.overloaded(str(exc).removesuffix("; retry later")) from None


def _encode(data: Any, encoding_format: str) -> Union[list[float], str]:
    if encoding_format == "base64":
        return base64.b64encode(data.numpy().astype("<f4").tobytes()).decode("ascii")
    return data.tolist()
