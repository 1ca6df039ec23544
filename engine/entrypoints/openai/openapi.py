"""GET /openapi.json: the routes and their request bodies as an OpenAPI 3.1 document.

The bodies' schemas are generated from the same msgspec Structs the server decodes requests
into (``msgspec.json.schema_components``), so the document cannot drift from what is accepted.
Built once, on first request.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from engine.entrypoints.openai.http_bodies import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from engine.entrypoints.openai.messages_bodies import AnthropicCountTokensRequest, AnthropicMessagesRequest
from engine.entrypoints.openai.pooling_bodies import ClassificationRequest, PoolingRequest, RerankRequest, ScoreRequest
from engine.entrypoints.openai.responses_bodies import ResponsesRequest
from engine.entrypoints.openai.serving_lora import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from engine.entrypoints.openai.serving_misc import ringllm_version

# (method, path) -> the request body's Struct, or None for a route without a body.
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/v1/completions"): CompletionRequest,
    ("post", "/v1/chat/completions"): ChatCompletionRequest,
    ("post", "/v1/embeddings"): EmbeddingRequest,
    ("post", "/pooling"): PoolingRequest,
    ("post", "/classify"): ClassificationRequest,
    ("post", "/score"): ScoreRequest,
    ("post", "/v1/score"): ScoreRequest,
    ("post", "/rerank"): RerankRequest,
    ("post", "/v1/rerank"): RerankRequest,
    ("post", "/v2/rerank"): RerankRequest,
    ("post", "/v1/responses"): ResponsesRequest,
    ("get", "/v1/responses/{response_id}"): None,
    ("post", "/v1/responses/{response_id}/cancel"): None,
    ("post", "/v1/messages"): AnthropicMessagesRequest,
    ("post", "/v1/messages/count_tokens"): AnthropicCountTokensRequest,
    ("get", "/v1/models"): None,
    ("post", "/v1/load_lora_adapter"): LoadLoRAAdapterRequest,  # 404 unless VLLM_ALLOW_RUNTIME_LORA_UPDATING
    ("post", "/v1/unload_lora_adapter"): UnloadLoRAAdapterRequest,
    ("post", "/tokenize"): TokenizeRequest,
    ("post", "/detokenize"): DetokenizeRequest,
    ("get", "/health"): None,
    ("get", "/ping"): None,
    ("post", "/ping"): None,
    ("get", "/metrics"): None,
    ("get", "/version"): None,
    ("post", "/reset_prefix_cache"): None,
    ("get", "/server_info"): None,
    ("get", "/openapi.json"): None,
}


@functools.cache
def openapi_document() -> bytes:
    types = sorted({t for t in BODIES.values() if t is not None}, key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    refs = dict(zip(types, schemas))
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), body in BODIES.items():
        operation: dict[str, Any] = {"responses": {"200": {"description": "OK"}}}
        if body is not None:
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": refs[body]}}}
        paths.setdefault(path, {})[method] = operation
    return msgspec.json.encode(
        {
            "openapi": "3.1.0",
            "info": {"title": "ringllm", "version": ringllm_version()},
            "paths": paths,
            "components": {"schemas": components},
        }
    )
