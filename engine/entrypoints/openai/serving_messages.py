"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API, served on the
chat machinery as vLLM serves it (vllm/entrypoints/anthropic/).

A messages request becomes a chat request (``chat_request``): ``system`` (and any message of role
``system``, as vLLM folds them) a system message, ``tool_use`` blocks an assistant's tool calls,
``tool_result`` blocks tool messages, the tools and ``tool_choice`` chat's (``any`` is
``required``, ``tool`` a named choice, ``disable_parallel_tool_use`` ``parallel_tool_calls``),
``stop_sequences`` ``stop``, ``output_config.format`` a ``response_format``. The chat serving then
does what it does for every chat request (template, tool-call constraint or parser, admission, the
engine) and its chunk stream is retold as a message and its events (messages_events.py), streamed
or not. What ringllm cannot honour is a 400 naming the field, in Anthropic's error shape (the
server's error middleware answers every error of these routes so): image, document and thinking
blocks, citations, server tools, and the fields placed as refused in field_support.py
(``thinking``, ``container``, ``mcp_servers``...). count_tokens counts what the same conversation
would send to the engine.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Optional, Union

import msgspec
from aiohttp import web
from msgspec import Struct

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    StreamOptions,
    ToolCall,
    decode_request,
)
from engine.entrypoints.openai.messages_bodies import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
    Blocks,
    ContextManagement,
    CountTokensResponse,
    MessageResponse,
    ConversationFields,
)
from engine.entrypoints.openai.messages_events import AnthropicFraming, MessageEvents
from engine.entrypoints.openai.responses_events import item_id
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_engine import json_response, to_openai_error
from engine.entrypoints.openai.tool_parsers.tool_choice import plan_tool_calls
from engine.exceptions import ParameterError

ANTHROPIC_SSE = AnthropicFraming()


# ---- content blocks, read one by one (anything else is a 400 naming its place) ----


class _TextBlock(Struct):
    text: str
    citations: Optional[list[Any]] = None


class _ToolUseBlock(Struct):
    id: str
    name: str
    input: dict[str, Any]


class _ToolResultBlock(Struct):
    tool_use_id: str
    content: Union[str, Blocks] = ""
    is_error: bool = False  # vLLM passes the result on as it is


def _bad(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")


def _block(block: dict[str, Any], type_: type, param: str) -> Any:
    try:
        return msgspec.convert(block, type_)
    except msgspec.ValidationError as exc:
        raise _bad(f"{param}: {exc}", param) from None


def _unsupported(kind: Any, param: str, allowed: str) -> OpenAIError:
    return _bad(f"{param}: content blocks of type {str(kind)[:40]!r} are not supported ({allowed})", param)


def _text(blocks: Union[str, Blocks], param: str) -> str:
    """Text blocks as one text (a system prompt, a tool's result)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for index, block in enumerate(blocks):
        if block.get("type") != "text":
            raise _unsupported(block.get("type"), f"{param}.{index}", "text only")
        parts.append(_text_block(block, f"{param}.{index}"))
    return "".join(parts)


def _text_block(block: dict[str, Any], param: str) -> str:
    text = _block(block, _TextBlock, param)
    if text.citations:
        raise _bad(f"{param}: citations are not supported", param)
    return text.text


def _system(body: ConversationFields) -> list[ChatMessage]:
    parts = [_text(body.system, "system")] if body.system is not None else []
    parts += [_text(m.content, f"messages.{i}.content") for i, m in enumerate(body.messages) if m.role == "system"]
    return [ChatMessage(role="system", content="".join(parts))] if parts else []


def _conversation(body: ConversationFields) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for index, message in enumerate(body.messages):
        if message.role == "system":
            continue
        if isinstance(message.content, str):
            messages.append(ChatMessage(role=message.role, content=message.content))
            continue
        texts, calls = [], []
        for number, block in enumerate(message.content):
            param, kind = f"messages.{index}.content.{number}", block.get("type")
            if kind == "text":
                texts.append(_text_block(block, param))
            elif kind == "tool_use" and message.role == "assistant":
                use = _block(block, _ToolUseBlock, param)
                calls.append(ToolCall(id=use.id, function=FunctionCall(use.name, json.dumps(use.input))))
            elif kind == "tool_result" and message.role == "user":  # a tool message, before the user's text
                result = _block(block, _ToolResultBlock, param)
                messages.append(
                    ChatMessage(
                        role="tool", tool_call_id=result.tool_use_id, content=_text(result.content, f"{param}.content")
                    )
                )
            else:
                allowed = "text, tool_use" if message.role == "assistant" else "text, tool_result"
                raise _unsupported(kind, param, f"{allowed} in a message of role {message.role}")
        if texts or calls or message.role == "assistant":
            messages.append(
                ChatMessage(
                    role=message.role, content="".join(texts) if texts or not calls else None, tool_calls=calls or None
                )
            )
    if not messages:
        raise _bad("messages must hold at least one user or assistant message", "messages")
    return messages


# ---- the request as a chat request ----


def _tools(body: ConversationFields) -> Optional[list[ChatCompletionToolsParam]]:
    tools = []
    for index, tool in enumerate(body.tools or ()):
        if tool.type not in (None, "custom"):
            raise _bad(
                f"tools.{index}: server tools ({tool.type[:40]!r}) are not supported; only client tools "
                "with an input_schema",
                "tools",
            )
        if tool.input_schema is None:
            raise _bad(f"tools.{index}: a tool needs an input_schema", "tools")
        tools.append(
            ChatCompletionToolsParam(
                function=FunctionDefinition(
                    name=tool.name, description=tool.description, parameters=tool.input_schema, strict=tool.strict
                )
            )
        )
    return tools or None


def _tool_choice(body: ConversationFields, has_tools: bool) -> Any:
    choice = body.tool_choice
    if choice is None or (choice.type in ("auto", "none") and not has_tools):
        return None  # vLLM: auto with tools, nothing to choose without
    if choice.type == "tool":
        if not choice.name:
            raise _bad("tool_choice.name is required when tool_choice.type is 'tool'", "tool_choice")
        return NamedToolChoice(function=NamedFunction(name=choice.name))
    return "required" if choice.type == "any" else choice.type  # auto, none: chat's own


def _response_format(body: AnthropicMessagesRequest) -> Optional[dict[str, Any]]:
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return None  # chat checks the schema: its errors are named output_config (_messages_param)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema}}


def chat_request(body: ConversationFields) -> ChatCompletionRequest:
    """The chat request a messages (or count_tokens) request stands for."""
    tools = _tools(body)
    request = ChatCompletionRequest(
        messages=_system(body) + _conversation(body),
        model=body.model,
        tools=tools,
        tool_choice=_tool_choice(body, bool(tools)),
        parallel_tool_calls=not (body.tool_choice and body.tool_choice.disable_parallel_tool_use),
        chat_template_kwargs=body.chat_template_kwargs,
    )
    if isinstance(body, AnthropicMessagesRequest):
        request.max_tokens, request.stop = body.max_tokens, body.stop_sequences
        request.temperature, request.top_p, request.top_k = body.temperature, body.top_p, body.top_k
        request.response_format = _response_format(body)
        request.reasoning_effort = body.output_config.effort if body.output_config is not None else None
        # usage in every chunk: message_start says the prompt's tokens
        request.stream, request.stream_options = True, StreamOptions(include_usage=True, continuous_usage_stats=True)
    return request


# Chat's fields that stand for this request's: an error chat names by its field is about these.
_CHAT_FIELDS = {"response_format": "output_config", "structured_outputs": "output_config", "stop": "stop_sequences"}


def _messages_param(error: Union[OpenAIError, ParameterError]) -> OpenAIError:
    """Chat's errors named by this request's fields: chat's messages (``messages.3.tool_calls``)
    have indices that are not the request's (the system message, tool results split out), so
    they are about ``messages``."""
    exc = to_openai_error(error)
    if exc.param is not None:
        field = exc.param.split(".")[0]
        exc.param = _CHAT_FIELDS.get(field, field)
    return exc


class AnthropicServingMessages:
    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def create_message(self, request: web.Request) -> web.StreamResponse:
        body = await self.chat.parse(request, lambda raw: decode_request(raw, AnthropicMessagesRequest))
        chat_body = chat_request(body)
        message = MessageResponse(id=item_id("msg"), model=self.chat.check_model(body.model), content=[])
        try:
            # checks the request now: a 400 raises here
            chunks = self.chat.chunk_stream(chat_body, message.id, len(await request.read()))
        except (OpenAIError, ParameterError) as exc:
            raise _messages_param(exc) from None
        events = MessageEvents(message)
        if body.stream:
            return await self.chat.sse_response(request, self._stream(chunks, events), ANTHROPIC_SSE)
        try:
            async with self.chat.time_limit(self.chat.deadline()), contextlib.aclosing(chunks):
                async for chunk in chunks:
                    events.feed(chunk)
        except (OpenAIError, ParameterError) as exc:
            raise _messages_param(exc) from None
        events.finish()
        return json_response(message)

    async def count_tokens(self, request: web.Request) -> web.Response:
        """The prompt's tokens, as /tokenize counts a chat: the template's render of the conversation
        and its tools, of any length (vLLM's answer: ``input_tokens`` and ``context_management``)."""
        body = await self.chat.parse(request, lambda raw: decode_request(raw, AnthropicCountTokensRequest))
        self.chat.check_model(body.model)
        chat_body = chat_request(body)
        tool_plan = plan_tool_calls(chat_body, self.chat.tool_serving)
        try:
            _, token_ids = await self.chat.render(
                chat_body.messages,
                chat_template_kwargs=chat_body.template_kwargs(),
                must_fit=False,
                tools=tool_plan.tools,
                size=len(await request.read()),
            )
        except (OpenAIError, ParameterError) as exc:
            raise _messages_param(exc) from None
        return json_response(CountTokensResponse(len(token_ids), ContextManagement(len(token_ids))))

    @staticmethod
    async def _stream(chunks: AsyncIterator[ChatCompletionChunk], events: MessageEvents) -> AsyncIterator[Any]:
        async with contextlib.aclosing(chunks):
            try:  # the first chunk comes once the engine took the request: refusals before it are HTTP errors
                first = await anext(chunks, None)
            except (OpenAIError, ParameterError) as exc:
                raise _messages_param(exc) from None
            for event in events.start(first):
                yield event
            async for chunk in chunks:
                for event in events.feed(chunk):
                    yield event
        for event in events.finish():
            yield event
