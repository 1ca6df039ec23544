"""The small endpoints: /v1/models, /health (and /ping), /metrics, /tokenize, /detokenize, /version,
/reset_prefix_cache.

They share the chat endpoint's view of the model (names, tokenizer, chat rendering) so that
/tokenize counts exactly the tokens a chat request would send to the engine.
"""

from __future__ import annotations

import importlib.metadata
import logging

from aiohttp import web

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import (
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    decode_request,
    now,
)
from engine.entrypoints.openai.liveness import CoreLiveness
from engine.entrypoints.openai.metrics import CONTENT_TYPE
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_engine import json_response
from engine.exceptions import EngineDeadError
from engine.frontend.renderer import decode, encode

logger = logging.getLogger(__name__)


def ringllm_version() -> str:
    try:
        return importlib.metadata.version("ringllm")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


class OpenAIServingMisc:
    def __init__(self, chat: OpenAIServingChat, liveness: CoreLiveness) -> None:
        self.chat = chat
        self.liveness = liveness
        self.engine = chat.engine
        self.created = now()

    async def show_models(self, request: web.Request) -> web.Response:
        """Each served name, with the first as ``root`` (never the local path the model came from),
        then each LoRA adapter with the base model as its ``parent``."""
        root = self.chat.model_names[0]
        cards = [ModelCard(name, self.created, self.chat.max_model_len, root=root) for name in self.chat.model_names]
        if self.chat.loras is not None:
            cards += self.chat.loras.cards(self.created, self.chat.max_model_len)
        return json_response(ModelList(cards))

    async def health(self, request: web.Request) -> web.Response:
        """200 while the engine can serve; 503 once it is dead, or while it leaves liveness probes
        unanswered (a load balancer's signal to stop sending). Never waits on the core."""
        try:
            await self.engine.check_health()
        except EngineDeadError as exc:
            raise OpenAIError(503, str(exc), type="server_error", code="engine_dead") from None
        problem = self.liveness.problem()
        if problem is not None:
            raise OpenAIError(503, problem, type="server_error", code="engine_unresponsive")
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        """Never waits on the core: the figures come with its outputs (metrics.py)."""
        return web.Response(body=self.chat.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self.chat.parse(request, self._parse_tokenize)
        if body.messages is not None:
            _, tokens = await self.chat.render(
                body.messages, body.add_generation_prompt, must_fit=False, size=len(await request.read())
            )  # read already: cached
        else:
            tokens = await self.chat.offload(
                len(body.prompt), encode, self.chat.tokenizer, body.prompt, body.add_special_tokens
            )
        return json_response(TokenizeResponse(len(tokens), self.chat.max_model_len, tokens))

    def _parse_tokenize(self, raw: bytes) -> TokenizeRequest:
        body = decode_request(raw, TokenizeRequest)
        self.chat.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "give exactly one of prompt and messages", param="prompt", code="invalid_value")
        return body

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self.chat.parse(request, self._parse_detokenize)
        text = await self.chat.offload(len(body.tokens), decode, self.chat.tokenizer, body.tokens)
        return json_response(DetokenizeResponse(text))

    def _parse_detokenize(self, raw: bytes) -> DetokenizeRequest:
        body = decode_request(raw, DetokenizeRequest)
        self.chat.check_model(body.model)
        vocab = len(self.chat.tokenizer)
        bad = max(body.tokens, default=-1)
        if bad >= vocab:
            raise OpenAIError(
                400, f"token id {bad} is out of the vocabulary [0, {vocab})", param="tokens", code="invalid_value"
            )
        return body

    async def show_version(self, request: web.Request) -> web.Response:
        return json_response({"version": ringllm_version()})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """Forget the prefix cache (vLLM's route, for benchmarks and operators). The core refuses
        while requests hold blocks (a running request would register blocks computed before the
        reset): then a 409, to retry once idle."""
        if not await self.engine.reset_prefix_cache():
            raise OpenAIError(
                409,
                "the prefix cache is in use by running requests; retry when they are done",
                type="server_error",
                code="prefix_cache_in_use",
            )
        return web.Response(status=200)
