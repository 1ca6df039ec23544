"""POST /v1/embeddings: OpenAI's embeddings API over a pooling engine (``--runner pooling``).

Each input of a batch is its own engine request (``AsyncLLM.encode``), admitted like a
completion prompt; the vectors come back in input order, as a list of floats or, with
``encoding_format="base64"``, as base64 of their bytes (little-endian float32 by default: what
the ``openai`` client asks for and decodes with numpy). vLLM's extras: ``embed_dtype``
(float32, float16 or bfloat16: the values are rounded to it, and base64 carries its bytes),
``endianness`` of those bytes, ``use_activation`` (L2 normalisation), ``truncate_prompt_tokens``
with ``truncation_side``, ``priority``, ``request_id`` and ``cache_salt``.

``pool_all`` is what every pooling route does with its inputs (admission, one engine request
each, the time limit); /pooling, /classify (serving_pooling.py), /score and /rerank
(serving_score.py) build on this class for it.
"""

from __future__ import annotations

import base64
import contextlib
import sys
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    PoolingBasicFields,
    decode_request,
)
from engine.entrypoints.openai.request_fields import engine_request_id, request_id
from engine.entrypoints.openai.serving_engine import OpenAIServing, json_response
from engine.frontend.renderer import RendererBusyError, encode, encode_pair
from engine.outputs import PoolingRequestOutput
from engine.pooling_params import PoolingParams


# An input of a pooling route: a text, token ids, or a pair of texts to encode together.
Prompt = Union[str, list[int], tuple[str, str]]


class OpenAIServingEmbedding(OpenAIServing):
    async def create_embedding(self, request: web.Request) -> web.Response:
        body, model, prompts, params = await self.parse(request, self._parse)
        response_id = request_id("embd", request, body.request_id)
        finals = await self.pool_all(request, response_id, body, prompts, params)
        data = [EmbeddingData(index=i, embedding=encode_vector(out.outputs.data, body)) for i, out in enumerate(finals)]
        return json_response(EmbeddingResponse(id=response_id, data=data, model=model, usage=usage(finals)))

    async def pool_all(
        self,
        request: web.Request,
        response_id: str,
        body: PoolingBasicFields,
        prompts: Sequence[Prompt],
        params: PoolingParams,
        param: Optional[str] = None,
    ) -> list[PoolingRequestOutput]:
        """Every prompt's pooled output, in prompt order: admitted together (a 400 naming
        ``param`` past the per-request limit), each its own engine request, under the request's
        time limit."""
        finals: dict[int, PoolingRequestOutput] = {}
        with self.admit(len(prompts), 1, param) as started:
            inputs = [await self._engine_input(body, p) for p in prompts]
            outputs = self.generate_all(
                inputs, params, engine_request_id(response_id, request), started, priority=body.priority
            )
            async with contextlib.aclosing(outputs), self.time_limit(self.deadline()):
                async for i, output in outputs:
                    finals[i] = output
        return [finals[i] for i in range(len(prompts))]

    def _parse(self, raw: bytes) -> tuple[EmbeddingRequest, str, list[Prompt], PoolingParams]:
        """The request, the model it names, its batch of inputs and its pooling params."""
        body = decode_request(raw, EmbeddingRequest)
        model = self.check_model(body.model, adapters=False)
        if body.dimensions is not None:
            raise OpenAIError(
                400,
                f"dimensions={body.dimensions}: the model does not support matryoshka "
                "representation (changing output dimensions)",
                param="dimensions",
                code="invalid_value",
            )
        params = PoolingParams(
            task="embed",
            use_activation=body.use_activation,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            truncation_side=body.truncation_side,
        )
        return body, model, body.prompts(), params

    async def _engine_input(self, body: PoolingBasicFields, prompt: Prompt) -> dict[str, Any]:
        """One input as the engine takes it, with the cache salt; a text input without
        ``add_special_tokens``, and a pair of texts (a cross-encoder's, encoded as the
        tokenizer encodes a pair), are tokenized here (on the renderer pool)."""
        if isinstance(prompt, tuple):
            engine_input: dict[str, Any] = {
                "prompt_token_ids": await self.offload(
                    len(prompt[0]) + len(prompt[1]), encode_pair, self.tokenizer, *prompt
                )
            }
        elif isinstance(prompt, str) and getattr(body, "add_special_tokens", True):  # (score texts always get them)
            engine_input = {"prompt": prompt}
        elif isinstance(prompt, str):
            engine_input = {
                "prompt_token_ids": await self.offload(len(prompt), encode, self.tokenizer, prompt, False),
                "prompt": prompt,
            }
        else:
            engine_input = {"prompt_token_ids": prompt}
        if body.cache_salt is not None:
            engine_input["cache_salt"] = body.cache_salt
        return engine_input

    async def generate(
        self,
        prompt: Any,
        params: PoolingParams,
        request_id: str,
        started: Callable[[], None],
        priority: int = 0,
        model: Optional[str] = None,
    ) -> AsyncIterator[PoolingRequestOutput]:
        """The engine's one output for an admitted input (``encode``, not ``generate``); closing
        this stream early aborts the request in the core. ``model`` is the base model's name: the
        pooling routes refuse an adapter's name with a 400 before any request is made."""
        try:
            async with contextlib.aclosing(
                self.engine.encode(prompt, params, request_id, priority=priority)
            ) as outputs:
                async for output in outputs:
                    started()
                    yield output
        except RendererBusyError as exc:
            raise self.overloaded(str(exc).removesuffix("; retry later")) from None


def usage(outputs: Sequence[PoolingRequestOutput]) -> EmbeddingUsage:
    """The prompt tokens of every engine request a pooling response was made from."""
    tokens = sum(len(output.prompt_token_ids) for output in outputs)
    return EmbeddingUsage(tokens, tokens)


def encode_vector(data: Any, body: EmbeddingRequest) -> Union[list[float], str]:
    """The vector (a float32 tensor) in ``embed_dtype``: as floats, or as base64 of its bytes in
    ``endianness``. torch is imported here, not at the top: a generating server never needs it
    (pooling outputs arrive as tensors, so it is loaded by then)."""
    import torch

    values = data.to(getattr(torch, body.embed_dtype))
    if body.encoding_format != "base64":
        return values.float().tolist()
    bits = torch.int32 if values.dtype == torch.float32 else torch.int16  # base64 carries the values' bits
    raw = values.view(bits).numpy()
    order = sys.byteorder if body.endianness == "native" else body.endianness
    return base64.b64encode(raw.astype(raw.dtype.newbyteorder("<" if order == "little" else ">")).tobytes()).decode(
        "ascii"
    )
