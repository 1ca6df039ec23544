"""POST /v1/chat/completions: messages rendered through the model's chat template, then generated.

The input processor renders and tokenizes the conversation in one renderer-pool job (without
special tokens: the template already wrote them as text, and a tokenizer that adds a BOS would
otherwise add a second one); its token ids are then admitted inline, with no second hop. With no
max_tokens the answer is bounded by the model's generation config, else by the context, as
vLLM allows. Streams open with a role chunk per choice, but only once the engine has accepted
the request, so a refused request still gets its 4xx instead of a stream. A request that asks
for tool calls (tool_parsers/tool_choice.py) has them read out of each reply, whole or streamed;
with ``--reasoning-parser`` (reasoning_parsers/) the reply's thinking is split off first, into
``reasoning_content``, and the calls are read from the content after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Optional

from aiohttp import web

from engine.entrypoints.openai import request_fields, serving_beam_search
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    UsageInfo,
    decode_request,
    now,
)
from engine.entrypoints.openai.http_bodies import PromptTokensDetails
from engine.entrypoints.openai.reasoning_parsers import ReasoningParser, ReasoningStreamer
from engine.entrypoints.openai.serving_engine import OpenAIServing, json_response
from engine.entrypoints.openai.tool_parsers.tool_choice import ToolCallPlan, ToolServing, plan_tool_calls
from engine.exceptions import ParameterError
from engine.frontend.chat_template import TemplateLimits
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams

ROLE = "assistant"
# A render past its own time bound is answered this much later at the latest (see render()):
# generous, since the wait also holds the job's time in the pool's queue and the first chat's
# one-time import of transformers' message helpers.
_RENDER_GRACE_S = 30.0
# /tokenize counts a chat of any length: its template may write up to this many characters.
_TOKENIZE_MAX_CHARS = TemplateLimits.max_chars


class OpenAIServingChat(OpenAIServing):
    tool_serving = ToolServing()  # the server's --enable-auto-tool-choice / --tool-call-parser

    async def render(
        self,
        body_messages,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Optional[dict] = None,
        must_fit: bool = True,
        chat_template: Optional[str] = None,
        continue_final_message: bool = False,
        tools: Optional[list[dict]] = None,
        add_special_tokens: bool = False,
        *,
        size: int,
    ) -> tuple[str, list[int]]:
        """The conversation as prompt text and its token ids (also used by /tokenize), rendered
        and tokenized on the renderer pool, always: the template's cost is its own, whatever the
        messages' size, and it bounds itself (engine/frontend/chat_template.py). ``must_fit``:
        text too long for the context is refused before it is tokenized (/tokenize counts any
        length). ``chat_template`` is a template's text, never a path. ``tools``: the request's
        tool definitions, a variable of the template whether or not it uses them. ``size``: the
        request body's length, what the job weighs in the pool (the messages are not walked on
        the event loop to measure them)."""
        job = self.offload(
            size,
            self._render,
            body_messages,
            add_generation_prompt,
            chat_template_kwargs,
            must_fit,
            chat_template,
            continue_final_message,
            tools,
            add_special_tokens,
            inline=False,
        )
        try:  # the render stops itself at its bound; this only answers if a C call overran it
            return await asyncio.wait_for(job, TemplateLimits.timeout_s + _RENDER_GRACE_S)
        except asyncio.TimeoutError:
            raise OpenAIError(
                400,
                f"the chat template did not finish within {TemplateLimits.timeout_s:g} s",
                param="messages" if chat_template is None else "chat_template",
                code="invalid_value",
            ) from None

    def _render(
        self,
        body_messages,
        add_generation_prompt: bool,
        chat_template_kwargs: Optional[dict],
        must_fit: bool,
        chat_template: Optional[str] = None,
        continue_final_message: bool = False,
        tools: Optional[list[dict]] = None,
        add_special_tokens: bool = False,
    ) -> tuple[str, list[int]]:
        conversation = [m.for_template(i) for i, m in enumerate(body_messages)]
        try:
            return self.engine.input_processor.chat_prompt(
                conversation,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
                max_chars=None if must_fit else _TOKENIZE_MAX_CHARS,
                must_fit=must_fit,
                add_special_tokens=add_special_tokens,
            )
        except ParameterError as exc:
            raise OpenAIError(400, str(exc), param=exc.parameter, code="invalid_value") from None
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="messages", code="invalid_value") from None

    def _parse(self, raw: bytes) -> tuple[ChatCompletionRequest, str, ToolCallPlan, SamplingParams]:
        """The request, the model it names, its tool calling and its sampling params."""
        body = decode_request(raw, ChatCompletionRequest)
        model = self.check_model(body.model)
        tool_plan = plan_tool_calls(body, self.tool_serving)
        params = tool_plan.constrain(body.to_sampling_params(self.model_defaults))
        body.check_max_tokens(self.max_model_len)
        return body, model, tool_plan, params

    async def create_chat_completion(self, request: web.Request) -> web.StreamResponse:
        body, model, tool_plan, params = await self.parse(request, self._parse)
        request_id, created = request_fields.request_id("chatcmpl", request, body.request_id), now()
        with self.admit(1, params.n) as started:
            text, token_ids = await self.render(
                body.messages,
                body.add_generation_prompt,
                body.template_kwargs(),
                chat_template=body.chat_template,
                continue_final_message=body.continue_final_message,
                tools=tool_plan.tools,
                must_fit=body.truncate_prompt_tokens is None,  # else cut to fit
                add_special_tokens=body.add_special_tokens,
                size=len(await request.read()),
            )  # read already: cached
            if body.use_beam_search:
                self.check_no_adapter(model, "use_beam_search")
                return await self._beam_search(
                    body,
                    model,
                    token_ids,
                    request_id,
                    created,
                    started,
                    request_fields.engine_request_id(request_id, request),
                )
            stream = self.generate(
                body.prompt_dict(token_ids, text),
                params,
                request_fields.engine_request_id(request_id, request),
                started,
                body.priority,
                model,
            )
            if body.stream:
                return await self.sse_response(
                    request, self._chunks(body, model, request_id, created, stream, tool_plan, text)
                )
            final: Optional[RequestOutput] = None
            async with contextlib.aclosing(stream), self.time_limit(self.deadline()):
                async for final in stream:
                    pass
        choices = []
        echo = _echo_text(body)
        for c in final.outputs:
            message, finish_reason = self._message(
                tool_plan, c, self._reasoning_parser(body, text), body.include_reasoning
            )
            if echo and message.content is not None:
                message.content = echo + message.content
            choices.append(
                ChatChoice(
                    c.index,
                    message,
                    self._logprobs(body, c),
                    finish_reason,
                    c.stop_reason,
                    token_ids=c.token_ids if body.return_token_ids else None,
                )
            )
        completion_tokens = sum(len(c.token_ids) for c in final.outputs)
        prompt_ids = final.prompt_token_ids or token_ids  # truncate_prompt_tokens may have cut it
        usage = UsageInfo(
            len(prompt_ids),
            completion_tokens,
            len(prompt_ids) + completion_tokens,
            PromptTokensDetails(final.num_cached_tokens or 0),
        )
        return json_response(
            ChatCompletionResponse(
                request_id,
                created,
                model,
                choices,
                usage=usage,
                prompt_logprobs=request_fields.prompt_logprobs(final, params.prompt_logprobs),
                prompt_token_ids=prompt_ids if body.return_token_ids else None,
                prompt_text=text if body.return_prompt_text else None,
            )
        )

    def chunk_stream(
        self, body: ChatCompletionRequest, request_id: str, size: int
    ) -> AsyncIterator[ChatCompletionChunk]:
        """``body`` (``stream`` set) as its chunks, for an API served on chat (serving_responses.py):
        checked now (a 400 raises here), admitted, rendered and generated as it is iterated."""
        model = self.check_model(body.model)
        tool_plan = plan_tool_calls(body, self.tool_serving)
        params = tool_plan.constrain(body.to_sampling_params(self.model_defaults))
        body.check_max_tokens(self.max_model_len)
        return self._admitted_chunks(body, model, tool_plan, params, request_id, size)

    async def _admitted_chunks(
        self, body: ChatCompletionRequest, model: str, tool_plan: ToolCallPlan, params, request_id: str, size: int
    ) -> AsyncIterator[ChatCompletionChunk]:
        with self.admit(1, params.n) as started:
            text, token_ids = await self.render(
                body.messages, body.add_generation_prompt, body.template_kwargs(), tools=tool_plan.tools, size=size
            )
            stream = self.generate(body.prompt_dict(token_ids, text), params, request_id, started, body.priority, model)
            cached = PromptTokensDetails()  # the stream's own usage chunk leaves the details out
            chunks = self._chunks(
                body, model, request_id, now(), _noting_cached(stream, cached), tool_plan, prompt_text=text
            )
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if chunk.usage is not None and not chunk.choices:
                        chunk.usage.prompt_tokens_details = cached
                    yield chunk

    async def _beam_search(
        self,
        body: ChatCompletionRequest,
        model: str,
        token_ids: list[int],
        request_id: str,
        created: int,
        started,
        engine_id: str,
    ) -> web.Response:
        """``use_beam_search``: the ``n`` best beams as the ``n`` choices (serving_beam_search.py)."""
        beam = serving_beam_search.beam_search_params(
            body, body.max_completion_tokens or body.max_tokens, self.max_model_len
        )
        async with self.time_limit(self.deadline()):
            (output,) = await serving_beam_search.run_all(self.engine, [token_ids], beam, engine_id, started, body)
        answers = serving_beam_search.beam_answers(
            self.tokenizer, token_ids, output, body, self.engine.input_processor.eos_token_id
        )
        choices = [
            ChatChoice(
                k, ChatResponseMessage(ROLE, text), None, finish, token_ids=generated if body.return_token_ids else None
            )
            for k, (text, generated, finish) in enumerate(answers)
        ]
        completion_tokens = sum(len(generated) for _, generated, _ in answers)
        usage = UsageInfo(len(token_ids), completion_tokens, len(token_ids) + completion_tokens)
        return json_response(
            ChatCompletionResponse(
                request_id,
                created,
                model,
                choices,
                usage=usage,
                prompt_token_ids=token_ids if body.return_token_ids else None,
            )
        )

    def _reasoning_parser(self, body: ChatCompletionRequest, prompt_text: str) -> Optional[ReasoningParser]:
        """A fresh ``--reasoning-parser`` for one reply of ``body``, or None without one."""
        parser_cls = self.tool_serving.reasoning_parser_cls
        if parser_cls is None:
            return None
        return parser_cls(self.tokenizer, body.template_kwargs(), parser_cls.prompt_closes_reasoning(prompt_text))

    def _message(
        self,
        tool_plan: ToolCallPlan,
        completion: CompletionOutput,
        reasoning_parser: Optional[ReasoningParser] = None,
        include_reasoning: bool = True,
    ) -> tuple[ChatResponseMessage, str]:
        """A whole reply as its message and finish reason: its reasoning split off first (with a
        reasoning parser), then its tool calls read out of the rest when the request asks for
        calls (content null when there are only calls, or only reasoning). ``include_reasoning``
        false: the reasoning is split off all the same, and left out."""
        reasoning, text = None, completion.text
        if reasoning_parser is not None:
            reasoning, text = reasoning_parser.split(completion.text)
        parser = tool_plan.new_parser(self.tokenizer)
        if parser is None:
            content, calls, finish_reason = text, [], completion.finish_reason
        else:
            extracted = parser.extract_tool_calls(text)
            calls = extracted.tool_calls[: tool_plan.max_calls]
            content, finish_reason = (
                extracted.content if calls else text,
                tool_plan.finish_reason(extracted, completion.finish_reason),
            )
        if reasoning is not None and not content:
            content = None
        if not include_reasoning:
            reasoning = None
        return ChatResponseMessage(ROLE, content, calls, reasoning, reasoning), finish_reason

    async def _chunks(
        self,
        body: ChatCompletionRequest,
        model: str,
        request_id: str,
        created: int,
        stream: AsyncIterator[RequestOutput],
        tool_plan: Optional[ToolCallPlan] = None,
        prompt_text: Optional[str] = None,
    ) -> AsyncIterator[ChatCompletionChunk]:
        usage = UsageInfo()
        parsers = [tool_plan.new_parser(self.tokenizer) if tool_plan else None for _ in range(body.n)]
        streamers = [p.streamer(tool_plan.max_calls) if p else None for p in parsers]
        reasoners = [self._reasoning_parser(body, prompt_text or "") for _ in range(body.n)]
        reasoners = [ReasoningStreamer(r) if r is not None else None for r in reasoners]
        first, cached = True, 0
        async with contextlib.aclosing(stream):
            async for output in stream:
                if first:  # the engine accepted the request: open every choice with its role
                    first = False
                    usage.prompt_tokens = len(output.prompt_token_ids or ())
                    prompt_ids = output.prompt_token_ids if body.return_token_ids else None
                    echo = _echo_text(body)
                    opening = UsageInfo(usage.prompt_tokens, 0, usage.prompt_tokens) if body.continuous_usage else None
                    for index in range(body.n):
                        yield ChatCompletionChunk(
                            request_id,
                            created,
                            model,  # usage: as vLLM's role chunk
                            [ChatStreamChoice(index, DeltaMessage(role=ROLE, content=""))],
                            usage=opening,
                            prompt_token_ids=prompt_ids if index == 0 else None,
                            prompt_text=prompt_text if index == 0 and body.return_prompt_text else None,
                        )
                        if echo:
                            yield ChatCompletionChunk(
                                request_id,
                                created,
                                model,
                                [ChatStreamChoice(index, DeltaMessage(content=echo))],
                                usage=opening,
                            )
                cached = max(cached, output.num_cached_tokens or 0)
                for c in output.outputs:
                    usage.completion_tokens += len(c.token_ids)
                    logprobs = self._logprobs(body, c)
                    token_ids = c.token_ids if body.return_token_ids else None
                    running = (
                        UsageInfo(
                            usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens + usage.completion_tokens
                        )
                        if body.continuous_usage
                        else None
                    )
                    text = c.text
                    if reasoners[c.index] is not None:  # the reasoning goes first, in deltas of its own
                        reasoning, text = _reasoning_pieces(reasoners[c.index], c)
                        if reasoning and body.include_reasoning:
                            yield ChatCompletionChunk(
                                request_id,
                                created,
                                model,
                                [
                                    ChatStreamChoice(
                                        c.index, DeltaMessage(reasoning_content=reasoning, reasoning=reasoning)
                                    )
                                ],
                            )
                    if streamers[c.index] is not None:  # the request asks for tool calls: deltas in their shape
                        for chunk in self._tool_chunks(streamers[c.index], tool_plan, c, text, logprobs, token_ids):
                            yield ChatCompletionChunk(request_id, created, model, [chunk], usage=running)
                        continue
                    if not text and logprobs is None and c.finish_reason is None:
                        continue  # text held back (stop strings, partial UTF-8, a marker): nothing to say yet
                    delta = DeltaMessage(content=text) if text or c.finish_reason is None else DeltaMessage()
                    yield ChatCompletionChunk(
                        request_id,
                        created,
                        model,
                        [
                            ChatStreamChoice(
                                c.index, delta, logprobs, c.finish_reason, c.stop_reason, token_ids=token_ids
                            )
                        ],
                        usage=running,
                    )
        if body.include_usage:  # the whole response's usage, cached prompt tokens included
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
            usage.prompt_tokens_details = PromptTokensDetails(cached)
            yield ChatCompletionChunk(request_id, created, model, [], usage=usage)

    @staticmethod
    def _tool_chunks(
        streamer,
        tool_plan: ToolCallPlan,
        completion: CompletionOutput,
        text: str,
        logprobs: Optional[ChatLogProbs],
        token_ids: Optional[list[int]],
    ) -> list[ChatStreamChoice]:
        """One output's stream choices: the deltas its ``text`` (its content) settles (with its
        logprobs and token ids), then, when it is the last, the parse of the whole reply with the
        finish reason the whole reply's answer gives (``tool_calls`` after whole calls)."""
        chunks = []
        delta = streamer.feed(text)
        if delta is not None or logprobs is not None or token_ids:
            chunks.append(ChatStreamChoice(completion.index, delta or DeltaMessage(), logprobs, token_ids=token_ids))
        if completion.finish_reason is not None:
            last = streamer.finish() or DeltaMessage()
            finish = tool_plan.finish_reason(streamer.final, completion.finish_reason)
            chunks.append(ChatStreamChoice(completion.index, last, None, finish, completion.stop_reason))
        return chunks

    @staticmethod
    def _logprobs(body: ChatCompletionRequest, completion: CompletionOutput) -> Optional[ChatLogProbs]:
        if not body.logprobs or completion.logprobs is None:
            return None
        top_n = body.top_logprobs or 0
        content = []
        for token_id, row in zip(completion.token_ids, completion.logprobs):
            chosen = row.get(token_id) or next(iter(row.values()))
            as_ids = body.return_tokens_as_token_ids
            token = request_fields.token_text(token_id, chosen.decoded_token, as_ids)
            top = sorted(
                ((i, lp) for i, lp in row.items() if lp.rank is not None and lp.rank <= top_n),
                key=lambda item: item[1].rank,
            )
            names = [request_fields.token_text(i, lp.decoded_token, as_ids) for i, lp in top]
            content.append(
                ChatLogProbsContent(
                    token,
                    chosen.logprob,
                    list(token.encode()),
                    [ChatLogProb(name, lp.logprob, list(name.encode())) for name, (_, lp) in zip(names, top)],
                )
            )
        return ChatLogProbs(content)


def _reasoning_pieces(streamer: ReasoningStreamer, completion: CompletionOutput) -> tuple[str, str]:
    """The reasoning and content that ``completion``'s text adds, the whole reply's split at its end."""
    reasoning, content = streamer.feed(completion.text)
    if completion.finish_reason is not None:
        more_reasoning, more_content = streamer.finish()
        reasoning, content = reasoning + more_reasoning, content + more_content
    return reasoning, content


async def _noting_cached(
    outputs: AsyncIterator[RequestOutput], cached: PromptTokensDetails
) -> AsyncIterator[RequestOutput]:
    """``outputs``, noting in ``cached`` how many prompt tokens the prefix cache served."""
    async with contextlib.aclosing(outputs):
        async for output in outputs:
            cached.cached_tokens = output.num_cached_tokens or 0
            yield output


def _echo_text(body: ChatCompletionRequest) -> str:
    """vLLM's ``echo`` in chat: the last message's content, when it is the assistant's (the
    answer continues it), is sent back before the new text; otherwise nothing."""
    if not body.echo or body.messages[-1].role != ROLE:
        return ""
    return body.messages[-1].for_template(len(body.messages) - 1)["content"] or ""
