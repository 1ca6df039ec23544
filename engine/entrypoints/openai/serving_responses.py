"""POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel: OpenAI's Responses
API, served on the chat machinery as vLLM serves it.

A responses request becomes a chat request (``_chat_request``): ``instructions`` a system message,
the input items chat messages (``function_call`` items an assistant's tool calls,
``function_call_output`` items tool messages), the function tools and ``tool_choice`` chat's,
``text.format`` a ``response_format``, ``max_output_tokens`` ``max_completion_tokens``. The chat
serving then does what it does for every chat request (template, tool-call constraint or parser,
structured outputs, admission, the engine) and its chunk stream is retold as a Response and its
events (responses_events.py), streamed or not. A ``reasoning`` input item (a reply's thinking sent
back) is the ``reasoning_content`` of the assistant message it opens, as vLLM reads it. What the
Responses API asks for that ringllm does not do is a 400 naming the field: built-in tools, image or
file inputs, encrypted reasoning, and the fields placed as refused in field_support.py.

A response is stored by default (``store``), within the store's bounds (responses_store.py), with
its conversation: ``previous_response_id`` continues it. ``background`` answers at once with a
queued response that runs as a task; GET polls it and /cancel ends it (its engine request is
aborted). The tasks still running when the server stops are cancelled before the engine goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    now,
)
from engine.entrypoints.openai.public_errors import public_error
from engine.entrypoints.openai.responses_bodies import (
    FunctionCallItem,
    NamedFunctionChoice,
    OutputMessage,
    ReasoningItem,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
)
from engine.entrypoints.openai.responses_events import ResponseEvents, item_id
from engine.entrypoints.openai.responses_store import ResponsesStore, StoredResponse, StoreFull
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_engine import json_response, to_openai_error
from engine.entrypoints.openai.structured_outputs import json_schema_constraint

logger = logging.getLogger(__name__)

_CANCEL_WAIT_S = 10.0  # a cancelled background response ends as soon as its engine request is aborted


# ---- input items, read one by one (anything else is a 400 naming its index) ----


class _Part(Struct):
    type: str
    text: Optional[str] = None


class _MessageItem(Struct):
    role: str
    content: Union[str, list[_Part]]


class _CallItem(Struct):
    call_id: str
    name: str
    arguments: str


class _ReasoningItem(Struct):
    summary: list[_Part] = []
    content: list[_Part] = []
    encrypted_content: Optional[str] = None


class _CallOutputItem(Struct):
    call_id: str
    output: Union[str, list[_Part]]


_ROLES = ("user", "system", "developer", "assistant")


def _bad(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")


def _item(item: Any, type_: type, param: str) -> Any:
    try:
        return msgspec.convert(item, type_)
    except msgspec.ValidationError as exc:
        raise _bad(f"{param}: {exc}", param) from None


def _text(content: Union[str, list[_Part]], param: str) -> str:
    if isinstance(content, str):
        return content
    for part in content:
        if part.type not in ("input_text", "output_text") or part.text is None:
            raise _bad(f"{param}: content part type {part.type[:40]!r} is not supported (text parts only)", param)
    return "".join(part.text for part in content)


def input_messages(input_: Union[str, list[dict[str, Any]]]) -> list[ChatMessage]:
    """The request's ``input`` as chat messages."""
    if isinstance(input_, str):
        return [ChatMessage(role="user", content=input_)]
    messages: list[ChatMessage] = []
    for index, item in enumerate(input_):
        param = f"input.{index}"
        kind = item.get("type", "message")
        if kind == "message":
            message = _item(item, _MessageItem, param)
            if message.role not in _ROLES:
                raise _bad(f"{param}: role {message.role[:40]!r} is not one of {', '.join(_ROLES)}", param)
            last = messages[-1] if messages else None
            if message.role == "assistant" and _only_reasoning(last):  # the answer after its reasoning
                last.content = _text(message.content, param)
            else:
                messages.append(ChatMessage(role=message.role, content=_text(message.content, param)))
        elif kind == "reasoning":
            reasoning = _item(item, _ReasoningItem, param)
            if reasoning.encrypted_content is not None:
                raise _bad(f"{param}: encrypted reasoning content is not supported", param)
            parts = reasoning.content or reasoning.summary
            if any(part.type not in ("reasoning_text", "summary_text") or part.text is None for part in parts):
                raise _bad(f"{param}: reasoning parts must be reasoning_text or summary_text", param)
            text = "".join(part.text for part in parts)
            messages.append(ChatMessage(role="assistant", content=None, reasoning_content=text))
        elif kind == "function_call":
            call = _item(item, _CallItem, param)
            tool_call = ToolCall(id=call.call_id, function=FunctionCall(call.name, call.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # calls after (or with) the assistant's text
                last.tool_calls = [*(last.tool_calls or ()), tool_call]
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[tool_call]))
        elif kind == "function_call_output":
            output = _item(item, _CallOutputItem, param)
            messages.append(ChatMessage(role="tool", tool_call_id=output.call_id, content=_text(output.output, param)))
        else:
            raise _bad(
                f"{param}: input items of type {str(kind)[:40]!r} are not supported (message, "
                "function_call, function_call_output, reasoning)",
                param,
            )
    return messages


def _only_reasoning(message: Optional[ChatMessage]) -> bool:
    """Whether ``message`` is an assistant's reasoning that no answer or call has joined yet."""
    return (
        message is not None
        and message.role == "assistant"
        and message.reasoning_content is not None
        and message.content is None
        and not message.tool_calls
    )


def output_messages(response: ResponseObject) -> list[ChatMessage]:
    """A response's output as the assistant message a next turn continues."""
    text = "".join(part.text for item in response.output if isinstance(item, OutputMessage) for part in item.content)
    calls = [
        ToolCall(id=item.call_id, function=FunctionCall(item.name, item.arguments))
        for item in response.output
        if isinstance(item, FunctionCallItem)
    ]
    reasoning = "".join(
        part.text for item in response.output if isinstance(item, ReasoningItem) for part in item.content
    )
    return [
        ChatMessage(
            role="assistant", content=text or None, tool_calls=calls or None, reasoning_content=reasoning or None
        )
    ]


# ---- the request as a chat request ----


def _tools(body: ResponsesRequest) -> Optional[list[ChatCompletionToolsParam]]:
    tools = []
    for index, tool in enumerate(body.tools or ()):
        if tool.type != "function":
            raise _bad(
                f"tools.{index}: built-in tools ({tool.type[:40]!r}) are not supported; only function tools", "tools"
            )
        if tool.name is None:
            raise _bad(f"tools.{index}: a function tool needs a name", "tools")
        tools.append(
            ChatCompletionToolsParam(
                function=FunctionDefinition(
                    name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict
                )
            )
        )
    return tools or None


def _tool_choice(body: ResponsesRequest, has_tools: bool) -> Any:
    choice = body.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        if choice.type != "function" or not choice.name:
            raise _bad(
                f"tool_choice of type {choice.type[:40]!r} is not supported; give a function's name", "tool_choice"
            )
        return NamedToolChoice(function=NamedFunction(name=choice.name))
    if choice in ("auto", "none") and not has_tools:
        return None  # vLLM: without tools, nothing to choose
    return choice


def _response_format(body: ResponsesRequest) -> Optional[dict[str, Any]]:
    if body.text is None:
        return None
    if body.text.verbosity not in (None, "medium"):
        raise _bad(f"text.verbosity={body.text.verbosity!r} is not supported (the model's own length only)", "text")
    fmt = body.text.format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema is None:
        raise _bad("text.format: type json_schema needs a schema", "text")
    json_schema_constraint(fmt.schema, strict=bool(fmt.strict), param="text")  # a 400 naming text, not chat's field
    return {
        "type": "json_schema",
        "json_schema": {"name": fmt.name or "response", "schema": fmt.schema, "strict": bool(fmt.strict)},
    }


def _chat_request(body: ResponsesRequest, conversation: list[ChatMessage], max_model_len: int) -> ChatCompletionRequest:
    if body.max_output_tokens is not None and body.max_output_tokens > max_model_len:
        raise _bad(
            f"max_output_tokens={body.max_output_tokens} is more than the model's context length "
            f"max_model_len={max_model_len}",
            "max_output_tokens",
        )
    system = [ChatMessage(role="system", content=body.instructions)] if body.instructions is not None else []
    tools = _tools(body)
    if not conversation:
        raise _bad("input must hold at least one item", "input")
    reasoning = body.reasoning
    if reasoning is not None and reasoning.summary not in (None, "none"):
        raise _bad("reasoning.summary is not supported (the reasoning is answered whole, not summarized)", "reasoning")
    return ChatCompletionRequest(
        messages=system + conversation,
        model=body.model,
        tools=tools,
        tool_choice=_tool_choice(body, bool(tools)),
        parallel_tool_calls=body.parallel_tool_calls,
        max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        response_format=_response_format(body),
        ignore_eos=body.ignore_eos,
        seed=body.seed,
        user=body.user,
        logit_bias=body.logit_bias,
        reasoning_effort=reasoning.effort if reasoning is not None else None,
        stream=True,
        stream_options=StreamOptions(include_usage=True),
    )


def _input_param(exc: OpenAIError) -> OpenAIError:
    """Chat's errors about its messages are about the request's input here."""
    if exc.param is not None and exc.param.startswith("messages"):
        exc.param = "input"
    return exc


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat, store: ResponsesStore) -> None:
        self.chat = chat
        self.store = store

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        body = await self.chat.parse(request, lambda raw: decode_request(raw, ResponsesRequest))
        if body.background and not body.store:
            raise _bad("background can only be used when `store` is true", "background")
        if body.background and body.stream:
            raise _bad("a background response cannot be streamed here; poll it with GET /v1/responses/{id}", "stream")
        previous = self._previous(body.previous_response_id)
        conversation = (previous.conversation if previous else []) + input_messages(body.input)
        chat_body = _chat_request(body, conversation, self.chat.max_model_len)
        response = self._new_response(body)
        try:
            # checks the request now: a 400 raises here
            chunks = self.chat.chunk_stream(chat_body, response.id, len(await request.read()))
        except OpenAIError as exc:
            raise _input_param(exc) from None
        events = ResponseEvents(response)
        if body.background:
            return self._start_background(chunks, events, conversation)
        if body.stream:
            return await self.chat.sse_response(request, self._stream(chunks, events, conversation, body.store))
        async with self.chat.time_limit(self.chat.deadline()):
            await self._run(chunks, events)
        if body.store:
            self._keep(response, conversation)
        return json_response(response)

    async def retrieve_response(self, request: web.Request) -> web.Response:
        if request.query.get("stream", "false").lower() not in ("false", "0"):
            raise _bad("stream=true is not supported on GET: poll the response", "stream")
        return json_response(self._stored(request.match_info["response_id"]).response)

    async def cancel_response(self, request: web.Request) -> web.Response:
        """Cancel a background response still running (its engine request is aborted); as in vLLM,
        any other (synchronous, or finished) is a 400."""
        entry = self._stored(request.match_info["response_id"])
        if not entry.response.background:
            raise _bad("Cannot cancel a synchronous response.", "response_id")
        if not entry.running:
            raise _bad(f"Cannot cancel a response that is already {entry.response.status}.", "response_id")
        entry.task.cancel()
        await asyncio.wait({entry.task}, timeout=_CANCEL_WAIT_S)
        return json_response(entry.response)

    async def close(self) -> None:
        """Cancel the background responses still running (the server is stopping)."""
        tasks = self.store.running_tasks()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_WAIT_S)

    # ---- helpers ----

    def _new_response(self, body: ResponsesRequest) -> ResponseObject:
        return ResponseObject(
            id=item_id("resp"),
            created_at=now(),
            model=self.chat.check_model(body.model),
            status="queued" if body.background else "in_progress",
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            metadata=body.metadata,
            parallel_tool_calls=body.parallel_tool_calls,
            previous_response_id=body.previous_response_id,
            temperature=body.temperature,
            top_p=body.top_p,
            tool_choice=msgspec.to_builtins(body.tool_choice) if body.tool_choice is not None else "auto",
            tools=msgspec.to_builtins(body.tools or []),
            text=msgspec.to_builtins(body.text),
            store=body.store,
            background=body.background,
        )

    def _stored(self, response_id: str) -> StoredResponse:
        entry = self.store.get(response_id)
        if entry is None:
            raise OpenAIError(
                404,
                f"Response with id '{response_id[:100]}' not found.",
                param="response_id",
                code="response_not_found",
            )
        return entry

    def _previous(self, response_id: Optional[str]) -> Optional[StoredResponse]:
        if response_id is None:
            return None
        entry = self.store.get(response_id)
        if entry is None:
            raise OpenAIError(
                404,
                f"Previous response with id '{response_id[:100]}' not found.",
                param="previous_response_id",
                code="response_not_found",
            )
        if entry.response.status not in ("completed", "incomplete"):
            raise _bad(f"the previous response is {entry.response.status}, not finished", "previous_response_id")
        return entry

    def _keep(self, response: ResponseObject, conversation: list[ChatMessage]) -> None:
        """Store a finished response; one that does not fit is answered all the same, unstored."""
        try:
            self.store.put(response, conversation + output_messages(response))
        except StoreFull as exc:
            logger.warning("response %s not stored: %s", response.id, exc)

    @staticmethod
    async def _run(chunks: AsyncIterator[ChatCompletionChunk], events: ResponseEvents) -> None:
        """Drain the chat stream into ``events.response`` (the events themselves are not sent)."""
        try:
            async with contextlib.aclosing(chunks):
                events.start()
                async for chunk in chunks:
                    events.feed(chunk)
        except OpenAIError as exc:
            raise _input_param(exc) from None
        events.finish()

    async def _stream(
        self,
        chunks: AsyncIterator[ChatCompletionChunk],
        events: ResponseEvents,
        conversation: list[ChatMessage],
        store: bool,
    ) -> AsyncIterator[Any]:
        async with contextlib.aclosing(chunks):
            try:  # the first chunk comes once the engine took the request: refusals before it are HTTP errors
                first = await anext(chunks, None)
            except OpenAIError as exc:
                raise _input_param(exc) from None
            for event in events.start():
                yield event
            if first is not None:
                for event in events.feed(first):
                    yield event
            async for chunk in chunks:
                for event in events.feed(chunk):
                    yield event
        last = events.finish()
        if store:  # stored before the last event is sent: a client may continue it at once
            self._keep(events.response, conversation)
        for event in last:
            yield event

    def _start_background(
        self, chunks: AsyncIterator[ChatCompletionChunk], events: ResponseEvents, conversation: list[ChatMessage]
    ) -> web.Response:
        response = events.response
        try:
            entry = self.store.put(response, conversation)
        except StoreFull as exc:
            raise self.chat.overloaded(str(exc)) from None
        queued = msgspec.structs.replace(response)
        entry.task = asyncio.create_task(self._background(chunks, events, conversation))
        return json_response(queued)

    async def _background(
        self, chunks: AsyncIterator[ChatCompletionChunk], events: ResponseEvents, conversation: list[ChatMessage]
    ) -> None:
        response = events.response
        try:
            async with self.chat.time_limit(self.chat.deadline()):
                await self._run(chunks, events)
        except asyncio.CancelledError:
            response.status = "cancelled"
        except Exception as exc:  # the response fails; the server goes on
            error = public_error(to_openai_error(exc))
            response.status, response.error = "failed", ResponseError(error.code or "server_error", error.message)
        finally:
            entry = self.store.get(response.id)
            if entry is not None and entry.response is response:  # not dropped meanwhile: stored as it ended
                finished = response.status in ("completed", "incomplete")
                try:
                    self.store.put(response, conversation + output_messages(response) if finished else conversation)
                except StoreFull as exc:
                    logger.warning("response %s no longer stored: %s", response.id, exc)
