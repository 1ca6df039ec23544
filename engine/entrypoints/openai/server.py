"""The OpenAI-compatible HTTP server: app factory, route table, middlewares, and ``run_server``.

``build_app`` is the one way to make the app: ``ringllm serve`` runs it and the tests start
that same command. The engine lives exactly as long as the app: ``app.cleanup_ctx`` enters
the engine client (an async context manager yielding an ``AsyncLLM``) before the first
request and leaves it, shutting the core down, after the last one. Each route hands its
request to one method of the ``serving_*`` modules, where the work is.

Middlewares, outermost first: the connection guard (a request's phase and its body's
deadline, connections.py, which also caps and times out the connections themselves), error
shaping (every failure, aiohttp's own 404/405/413 included, leaves in OpenAI's
``{"error": ...}`` shape, or Anthropic's on its routes (``ANTHROPIC_PATHS``), with a text fit for
clients, public_errors.py; a body that cannot be decoded is a 400; each request is counted), the
API key (every route but the probes /health, /ping, /metrics and /version; compared in constant
time; Anthropic's routes also take it as ``x-api-key``, as Anthropic's clients send it), and the
body-size limit (413 from the declared length, before anything is read; aiohttp's
``client_max_size`` catches bodies that declare none).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import resource
import signal
import uuid
from dataclasses import dataclass
from typing import AsyncContextManager, Optional

import uvloop
from aiohttp import web

from engine.entrypoints.openai import metrics_fanin
from engine.entrypoints.openai.connections import (
    LISTEN_BACKLOG,
    ConnectionGuard,
    ConnectionLimits,
    abandon_body,
    default_max_connections,
    raise_open_file_limit,
)
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.liveness import CoreLiveness
from engine.entrypoints.openai.messages_bodies import anthropic_error
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.openapi import openapi_document
from engine.entrypoints.openai.public_errors import payload_error, public_error
from engine.entrypoints.openai.request_fields import REQUEST_ID_HEADER, REQUEST_ID_KEY
from engine.entrypoints.openai.responses_store import ResponsesStore, StoreLimits
from engine.entrypoints.openai.server_info import server_info
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_completions import OpenAIServingCompletion
from engine.entrypoints.openai.serving_embeddings import OpenAIServingEmbedding
from engine.entrypoints.openai.serving_engine import Deadlines, ServingLimits, json_response, to_openai_error
from engine.entrypoints.openai.serving_lora import LoRAModulePath, ServedLoRAs
from engine.entrypoints.openai.serving_messages import AnthropicServingMessages
from engine.entrypoints.openai.serving_misc import OpenAIServingMisc
from engine.entrypoints.openai.serving_pooling import OpenAIServingPooling
from engine.entrypoints.openai.serving_responses import OpenAIServingResponses
from engine.entrypoints.openai.serving_score import OpenAIServingScore
from engine.entrypoints.openai.tool_parsers.tool_choice import ToolServing
from engine.server_interface import EngineClient

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8000
    api_key: Optional[str] = None  # when set, all but OPEN_PATHS need "Authorization: Bearer <key>"
    max_request_body_bytes: int = 4 << 20
    max_waiting_requests: Optional[int] = None  # sequences (prompts x n); None: unbounded; beyond: 503
    request_timeout_s: Optional[float] = None  # None: no per-request timeout
    retry_after_s: int = 1
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may finish
    # Connection limits (connections.py): a request's head, its body, an idle keep-alive wait.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_timeout_s: float = 5.0  # vLLM's (uvicorn's timeout_keep_alive)
    max_connections: Optional[int] = None  # None: connections.default_max_connections of the fd limit
    # /health is 503 once the core leaves a liveness probe unanswered this long (liveness.py).
    health_busy_timeout_s: float = 5.0  # with requests in flight
    health_idle_timeout_s: float = 30.0
    enable_request_id_headers: bool = False  # vLLM's: every response carries X-Request-Id
    # --enable-auto-tool-choice and the --tool-call-parser class (cli_args.tool_serving_from)
    tool_serving: ToolServing = ToolServing()
    # --api-server-count N (openai/api_server_pool.py): the port is shared with the other API
    # servers (SO_REUSEPORT), and /metrics sums theirs, reached through sockets in this directory.
    reuse_port: bool = False
    metrics_fanin_dir: Optional[str] = None
    # /v1/responses: the stored responses (previous_response_id, GET, background), in memory
    responses_store: StoreLimits = StoreLimits()
    # --lora-modules: adapters served from the start, each under its name (serving_lora.py)
    lora_modules: tuple[LoRAModulePath, ...] = ()

    def __post_init__(self) -> None:
        checks = [
            ("port", 0 <= self.port <= 65535, "in [0, 65535]"),
            ("max_request_body_bytes", self.max_request_body_bytes >= 1, ">= 1"),
            ("max_waiting_requests", self.max_waiting_requests is None or self.max_waiting_requests >= 0, ">= 0"),
            ("request_timeout_s", self.request_timeout_s is None or self.request_timeout_s > 0, "> 0"),
            ("retry_after_s", self.retry_after_s >= 0, ">= 0"),
            ("drain_timeout_s", self.drain_timeout_s >= 0, ">= 0"),
            ("header_timeout_s", self.header_timeout_s > 0, "> 0"),
            ("body_timeout_s", self.body_timeout_s > 0, "> 0"),
            ("keep_alive_timeout_s", self.keep_alive_timeout_s > 0, "> 0"),
            ("max_connections", self.max_connections is None or self.max_connections >= 1, ">= 1"),
            ("health_busy_timeout_s", self.health_busy_timeout_s > 0, "> 0"),
            ("health_idle_timeout_s", self.health_idle_timeout_s > 0, "> 0"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")

    def connection_limits(self) -> ConnectionLimits:
        max_connections = self.max_connections
        if max_connections is None:
            max_connections = default_max_connections(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        return ConnectionLimits(self.header_timeout_s, self.body_timeout_s, self.keep_alive_timeout_s, max_connections)


@dataclass
class Serving:
    completion: OpenAIServingCompletion
    chat: OpenAIServingChat
    misc: OpenAIServingMisc
    metrics: ServerMetrics
    deadlines: Deadlines  # every request's time limit: the end of a drain fires them all
    # /v1/embeddings, /pooling, /classify, /score, /rerank on a pooling engine (runner "pooling");
    # None on a generating one.
    embedding: Optional[OpenAIServingEmbedding] = None
    pooling: Optional[OpenAIServingPooling] = None
    scoring: Optional[OpenAIServingScore] = None
    responses: Optional[OpenAIServingResponses] = None
    messages: Optional[AnthropicServingMessages] = None
    loras: Optional[ServedLoRAs] = None  # the adapters served as models (serving_lora.py)

    def check_runner(self, runner: str, api: str) -> None:
        """A route of the other runner is a 400, as vLLM answers it ("does not support ...")."""
        if (self.embedding is not None) != (runner == "pooling"):
            raise OpenAIError(
                400,
                f"The model does not support {api} API: start the server with `--runner {runner}` to serve it",
                code="model_not_supported",
            )

    def check_task(self, task: str, api: str) -> None:
        """A pooling route for the other pooling task (/classify on an embedding model,
        /v1/embeddings on a classifier) is a 400, as vLLM answers it."""
        self.check_runner("pooling", api)
        served = self.embedding.engine.model_config.pooling_task
        if served != task:
            raise OpenAIError(
                400,
                f"The model does not support {api} API: it serves the {served!r} pooling task",
                code="model_not_supported",
            )


SETTINGS = web.AppKey("settings", ServerSettings)
CONNECTIONS = web.AppKey("connections", ConnectionGuard)
SERVING = web.AppKey("serving", Serving)


# ---- routes: each hands the request to one ``Serving`` method ----
# (The serving objects exist only once the engine has started, after the route table is frozen,
# so each handler finds them through the app.)


async def create_completion(request: web.Request) -> web.StreamResponse:
    request.app[SERVING].check_runner("generate", "Completions")
    return await request.app[SERVING].completion.create_completion(request)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    request.app[SERVING].check_runner("generate", "Chat Completions")
    return await request.app[SERVING].chat.create_chat_completion(request)


async def create_embedding(request: web.Request) -> web.Response:
    request.app[SERVING].check_task("embed", "Embeddings")
    return await request.app[SERVING].embedding.create_embedding(request)


async def create_pooling(request: web.Request) -> web.Response:
    request.app[SERVING].check_runner("pooling", "Pooling")
    return await request.app[SERVING].pooling.create_pooling(request)


async def create_classify(request: web.Request) -> web.Response:
    request.app[SERVING].check_task("classify", "Classification")
    return await request.app[SERVING].pooling.create_classify(request)


async def create_score(request: web.Request) -> web.Response:
    request.app[SERVING].check_runner("pooling", "Score")
    return await request.app[SERVING].scoring.create_score(request)


async def create_rerank(request: web.Request) -> web.Response:
    request.app[SERVING].check_runner("pooling", "Rerank")
    return await request.app[SERVING].scoring.create_rerank(request)


async def create_response(request: web.Request) -> web.StreamResponse:
    request.app[SERVING].check_runner("generate", "Responses")
    return await request.app[SERVING].responses.create_response(request)


async def retrieve_response(request: web.Request) -> web.Response:
    request.app[SERVING].check_runner("generate", "Responses")
    return await request.app[SERVING].responses.retrieve_response(request)


async def cancel_response(request: web.Request) -> web.Response:
    request.app[SERVING].check_runner("generate", "Responses")
    return await request.app[SERVING].responses.cancel_response(request)


async def create_message(request: web.Request) -> web.StreamResponse:
    request.app[SERVING].check_runner("generate", "Messages")
    return await request.app[SERVING].messages.create_message(request)


async def count_message_tokens(request: web.Request) -> web.Response:
    request.app[SERVING].check_runner("generate", "Messages")
    return await request.app[SERVING].messages.count_tokens(request)


async def show_models(request: web.Request) -> web.Response:
    return await request.app[SERVING].misc.show_models(request)


async def health(request: web.Request) -> web.Response:
    return await request.app[SERVING].misc.health(request)


async def metrics(request: web.Request) -> web.Response:
    response = await request.app[SERVING].misc.metrics(request)
    fanin_dir = request.app[SETTINGS].metrics_fanin_dir
    if fanin_dir is None:
        return response
    if request.query.get(metrics_fanin.LOCAL_QUERY) == "local":  # a sibling sums us in
        metrics_fanin.keep_snapshot(response.body, fanin_dir)
    else:
        response.body = await metrics_fanin.gather(response.body, fanin_dir)  # every API server's sum
    return response


async def tokenize(request: web.Request) -> web.Response:
    return await request.app[SERVING].misc.tokenize(request)


async def detokenize(request: web.Request) -> web.Response:
    return await request.app[SERVING].misc.detokenize(request)


async def show_version(request: web.Request) -> web.Response:
    return await request.app[SERVING].misc.show_version(request)


async def reset_prefix_cache(request: web.Request) -> web.Response:
    return await request.app[SERVING].misc.reset_prefix_cache(request)


async def load_lora_adapter(request: web.Request) -> web.Response:
    return await request.app[SERVING].loras.load_route(request)


async def unload_lora_adapter(request: web.Request) -> web.Response:
    return await request.app[SERVING].loras.unload_route(request)


async def show_server_info(request: web.Request) -> web.Response:
    return json_response(server_info(request.app[SERVING].misc.engine.config, request.app[SETTINGS]))


async def show_openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_document(), content_type="application/json")


ROUTES = [
    web.post("/v1/completions", create_completion),
    web.post("/v1/chat/completions", create_chat_completion),
    web.post("/v1/embeddings", create_embedding),
    web.post("/pooling", create_pooling),
    web.post("/classify", create_classify),
    web.post("/score", create_score),
    web.post("/v1/score", create_score),
    web.post("/rerank", create_rerank),
    web.post("/v1/rerank", create_rerank),
    web.post("/v2/rerank", create_rerank),
    web.post("/v1/responses", create_response),
    web.get("/v1/responses/{response_id}", retrieve_response),
    web.post("/v1/responses/{response_id}/cancel", cancel_response),
    web.post("/v1/messages", create_message),
    web.post("/v1/messages/count_tokens", count_message_tokens),
    web.get("/v1/models", show_models),
    web.get("/health", health),
    web.get("/metrics", metrics),
    web.post("/tokenize", tokenize),
    web.post("/detokenize", detokenize),
    web.get("/version", show_version),
    web.get("/ping", health),  # vLLM's (SageMaker's) liveness probe: /health's answer
    web.post("/ping", health),
    web.post("/reset_prefix_cache", reset_prefix_cache),
    web.post("/v1/load_lora_adapter", load_lora_adapter),  # 404 unless VLLM_ALLOW_RUNTIME_LORA_UPDATING
    web.post("/v1/unload_lora_adapter", unload_lora_adapter),
    web.get("/server_info", show_server_info),
    web.get("/openapi.json", show_openapi),
]
# What a load balancer or a scraper probes: open even when an API key is set.
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})
# Anthropic's Messages API: errors in its shape, the key also as x-api-key.
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})


# ---- middlewares ----


def _route_name(request: web.Request) -> str:
    """The route's path pattern, so a scan of random URLs cannot blow up the metric's labels."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
        status = exc.status
        if exc.status < 400:
            raise
        return _error_response(
            request,
            OpenAIError(
                exc.status, exc.reason, type="invalid_request_error", code=exc.reason.lower().replace(" ", "_")
            ),
        )
    except (asyncio.CancelledError, ConnectionResetError):
        status = 499  # the client went away; nothing to answer
        raise
    except web.RequestPayloadError as exc:  # bad gzip/deflate data, a broken chunked body
        abandon_body(request)
        error = payload_error(exc)
        status = error.status
        logger.info("%s %s: %s", request.method, request.path, error.message)
        return _error_response(request, error)
    except Exception as exc:
        error = public_error(to_openai_error(exc))
        status = error.status
        return _error_response(request, error)
    finally:
        serving = request.app.get(SERVING)
        if serving is not None:
            serving.metrics.http_requests.labels(_route_name(request), str(status)).inc()


def _error_response(request: web.Request, error: OpenAIError) -> web.Response:
    body = anthropic_error(error) if request.path in ANTHROPIC_PATHS else error.body()
    return json_response(body, error.status, error.headers)


@web.middleware
async def api_key_middleware(request: web.Request, handler) -> web.StreamResponse:
    key = request.app[SETTINGS].api_key
    if key is not None and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "").encode()
        valid = hmac.compare_digest(given, f"Bearer {key}".encode())
        if request.path in ANTHROPIC_PATHS:  # both compared, whatever the first gave: no timing tells which
            valid |= hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())
        if not valid:
            raise OpenAIError(
                401,
                "invalid or missing API key (send 'Authorization: Bearer <key>'"
                f"{' or x-api-key' if request.path in ANTHROPIC_PATHS else ''})",
                type="authentication_error",
                code="invalid_api_key",
            )
    return await handler(request)


@web.middleware
async def body_limit_middleware(request: web.Request, handler) -> web.StreamResponse:
    limit = request.app[SETTINGS].max_request_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise OpenAIError(
            413,
            f"the request body ({request.content_length} bytes) is over the limit of {limit} bytes",
            code="request_too_large",
        )
    return await handler(request)


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """--enable-request-id-headers: the request's id (its X-Request-Id, else the id it was
    served under, else a new one) in X-Request-Id, set before the headers go out (streams too)."""
    response.headers[REQUEST_ID_HEADER] = (
        request.headers.get(REQUEST_ID_HEADER) or request.get(REQUEST_ID_KEY) or uuid.uuid4().hex
    )


# ---- the factory ----


def build_app(engine_client: AsyncContextManager[EngineClient], settings: ServerSettings) -> web.Application:
    """The server app. ``engine_client`` is an async context manager yielding the engine, e.g.
    ``build_async_engine_client_from_engine_args(args)``; the app enters it on startup and
    leaves it on cleanup."""
    connections = ConnectionGuard(settings.connection_limits(), OPEN_PATHS)
    app = web.Application(
        middlewares=[connections.middleware, error_middleware, api_key_middleware, body_limit_middleware],
        client_max_size=settings.max_request_body_bytes,
    )
    app[SETTINGS] = settings
    app[CONNECTIONS] = connections
    app.add_routes(ROUTES)
    if settings.enable_request_id_headers:
        app.on_response_prepare.append(add_request_id_header)

    async def engine_lifetime(app: web.Application):
        async with engine_client as engine:
            liveness = CoreLiveness(
                engine,
                settings.health_busy_timeout_s,
                settings.health_idle_timeout_s,
                lambda: connections.requests_in_flight > 0,
            )
            app[SERVING] = await _make_serving(engine, settings, liveness)
            logger.info("serving %s", ", ".join(app[SERVING].chat.model_names))
            liveness.start()
            try:
                yield
            finally:
                if app[SERVING].responses is not None:
                    await app[SERVING].responses.close()  # background responses end before the engine
                await liveness.stop()
            logger.info("shutting the engine down")

    app.cleanup_ctx.append(engine_lifetime)
    return app


async def _make_serving(engine: EngineClient, settings: ServerSettings, liveness: CoreLiveness) -> Serving:
    if not isinstance(engine, EngineClient):
        raise TypeError(f"the server needs an engine.server_interface.EngineClient, got {type(engine).__name__}")
    model_config = engine.model_config
    names = [model_config.served_model_name]
    lora_config = engine.config.lora_config
    metrics = ServerMetrics(
        names[0],
        model_config.max_model_len,
        engine.config.parallel_config.frontend_engine_indices,
        max_loras=lora_config.max_loras if lora_config is not None else 0,
    )
    engine.add_stat_logger(metrics)  # fed by the output handler, once per outputs message
    limits = ServingLimits.for_engine(
        engine.config, settings.max_waiting_requests, settings.request_timeout_s, settings.retry_after_s
    )
    deadlines = Deadlines()
    tokenizer = engine.input_processor.tokenizer  # the engine's own (get_tokenizer() builds a transformers one)
    loras = ServedLoRAs(engine, names[0])
    for module in settings.lora_modules:  # before the port opens: a bad adapter stops the start
        try:
            await loras.load(module)
        except OpenAIError as exc:
            raise ValueError(f"--lora-modules {module.name}: {exc.message}") from None
    shared = (engine, tokenizer, names, model_config.max_model_len, limits, metrics, deadlines, loras)
    chat = OpenAIServingChat(*shared)
    chat.tool_serving = settings.tool_serving
    pooling = model_config.runner_type == "pooling"
    responses = None if pooling else OpenAIServingResponses(chat, ResponsesStore(settings.responses_store))
    messages = None if pooling else AnthropicServingMessages(chat)
    return Serving(
        OpenAIServingCompletion(*shared),
        chat,
        OpenAIServingMisc(chat, liveness),
        metrics,
        deadlines,
        OpenAIServingEmbedding(*shared) if pooling else None,
        OpenAIServingPooling(*shared) if pooling else None,
        OpenAIServingScore(*shared) if pooling else None,
        responses,
        messages,
        loras,
    )


# After the drain, how long the requests still running get to write their ending (an error
# event and [DONE] for a stream, a 503 otherwise) before they are cancelled outright.
END_GRACE_S = 5.0


def run_server(engine_client: AsyncContextManager[EngineClient], settings: ServerSettings) -> None:
    """Serve until SIGINT/SIGTERM, then drain: stop accepting, let in-flight requests finish for
    up to ``drain_timeout_s``, end the rest cleanly (a stream gets an ``{"error": ...}`` event
    and ``[DONE]``, a whole response a 503; their engine requests are aborted), shut the
    engine down. The open-file limit is raised first (connections.raise_open_file_limit)."""
    raise_open_file_limit()
    uvloop.run(_serve(build_app(engine_client, settings), settings))


async def _serve(app: web.Application, settings: ServerSettings) -> None:
    # Signals are handled here rather than by aiohttp's run_app: a second SIGTERM while draining
    # (a process manager repeating itself) must not abort the shutdown half-way.
    runner = web.AppRunner(
        app, handle_signals=False, handler_cancellation=True, shutdown_timeout=settings.drain_timeout_s + END_GRACE_S
    )
    await runner.setup()  # enters the engine's lifetime: the port opens once the engine is ready
    loop = asyncio.get_running_loop()
    listener = None
    listener_extra: list = []
    try:
        # Our own listener rather than a TCPSite: each connection gets the guard's protocol
        # (connections.py), which keeps its deadlines and the cap.
        connections = app[CONNECTIONS]
        listener = await loop.create_server(
            connections.protocol_factory(runner.server),
            settings.host,
            settings.port,
            reuse_address=True,
            backlog=LISTEN_BACKLOG,
            reuse_port=settings.reuse_port or None,
        )
        if settings.metrics_fanin_dir is not None:  # where sibling API servers ask for our figures
            path = metrics_fanin.socket_path(settings.metrics_fanin_dir)
            fanin = await loop.create_unix_server(connections.protocol_factory(runner.server), path)
            listener_extra.append(fanin)
        host, port = listener.sockets[0].getsockname()[:2]
        logger.info("serving on http://%s:%d (at most %d connections)", host, port, connections.limits.max_connections)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_signal, stop, sig, settings.drain_timeout_s)
        await stop.wait()
    finally:
        # runner.cleanup stops accepting at once, then waits for the requests in flight; the end
        # of the drain ends those still running.
        if listener is not None:
            listener.close()  # no new connections; those open are drained below
        for extra in listener_extra:
            extra.close()
        end = loop.call_later(settings.drain_timeout_s, _end_drain, app)
        try:
            await runner.cleanup()
        finally:
            end.cancel()


def _end_drain(app: web.Application) -> None:
    serving = app.get(SERVING)
    if serving is not None:
        logger.info("drain timeout: ending the requests still running")
        serving.deadlines.end_all()


def _on_signal(stop: asyncio.Event, sig: signal.Signals, drain_timeout_s: float) -> None:
    if stop.is_set():
        logger.info("%s: already shutting down", sig.name)
        return
    logger.info("%s: no new requests; in-flight ones may finish for up to %g s", sig.name, drain_timeout_s)
    stop.set()
