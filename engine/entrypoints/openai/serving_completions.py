"""POST /v1/completions: a prompt (or a batch of them) in, completions out, whole or streamed.

Each prompt of a batch is its own engine request; choice ``i * n + k`` is the k-th sample of
prompt i, as OpenAI and vLLM number them. Logprobs use the legacy completions shape
(tokens, token_logprobs, top_logprobs, text_offset); with ``echo`` the prompt's own
logprobs come first, the first prompt token having none. vLLM's extras: ``prompt_logprobs`` (in
vLLM's shape, on each choice), ``echo`` with ``max_tokens`` 0 (the prompt alone, as OpenAI and
vLLM answer it: ``CompletionRequest.echo_only``), ``return_token_ids``,
``return_tokens_as_token_ids``, ``request_id``, ``priority``, ``cache_salt``, ``truncate_prompt_tokens`` and
``stream_options.continuous_usage_stats`` (the usage so far in every chunk).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import AsyncIterator, Optional

from aiohttp import web

from engine.entrypoints.openai.http_bodies import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
    decode_request,
    now,
)
from engine.entrypoints.openai.request_fields import engine_request_id, prompt_logprobs, request_id, token_text
from engine.entrypoints.openai.serving_beam_search import beam_answers, beam_search_params, run_all
from engine.entrypoints.openai.serving_engine import OpenAIServing, json_response
from engine.frontend.renderer import decode, encode
from engine.outputs import CompletionOutput, Logprob, RequestOutput
from engine.sampling_params import SamplingParams


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: web.Request) -> web.StreamResponse:
        body, model, params, prompts = await self.parse(request, self._parse)
        response_id, created = request_id("cmpl", request, body.request_id), now()
        if body.use_beam_search:
            self.check_no_adapter(model, "use_beam_search")
            return await self._beam_search(
                body, model, prompts, response_id, created, engine_request_id(response_id, request)
            )
        with self.admit(len(prompts), params.n) as started:
            outputs = self.generate_all(
                await self._engine_prompts(body, prompts),
                params,
                engine_request_id(response_id, request),
                started,
                priority=body.priority,
                model=model,
            )
            if body.stream:
                return await self.sse_response(request, self._chunks(body, model, response_id, created, outputs))
            finals: dict[int, RequestOutput] = {}
            async with contextlib.aclosing(outputs), self.time_limit(self.deadline()):
                async for i, output in outputs:
                    finals[i] = output
        choices, usage, cached = [], UsageInfo(), 0
        for i in range(len(prompts)):
            final = finals[i]
            prompt_text = await self._prompt_text(final) if body.echo else ""
            for completion in map(functools.partial(_shown, body.echo_only), final.outputs):
                choices.append(
                    CompletionChoice(
                        index=i * params.n + completion.index,
                        text=prompt_text + completion.text,
                        logprobs=self._logprobs(body, final, completion, echo=body.echo),
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                        prompt_logprobs=prompt_logprobs(final, body.prompt_logprobs),
                        prompt_token_ids=final.prompt_token_ids if body.return_token_ids else None,
                        token_ids=completion.token_ids if body.return_token_ids else None,
                    )
                )
                usage.completion_tokens += len(completion.token_ids)
            usage.prompt_tokens += len(final.prompt_token_ids or ())
            cached += final.num_cached_tokens or 0
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        usage.prompt_tokens_details = PromptTokensDetails(cached)
        choices.sort(key=lambda c: c.index)
        return json_response(CompletionResponse(response_id, created, model, choices, usage=usage))

    def _parse(self, raw: bytes) -> tuple[CompletionRequest, str, SamplingParams, list]:
        """The request, the model it names, its sampling params and its batch of prompts."""
        body = decode_request(raw, CompletionRequest)
        model = self.check_model(body.model)
        params = body.to_sampling_params(self.model_defaults)
        body.check_max_tokens(self.max_model_len)
        return body, model, params, body.prompts()

    async def _chunks(
        self,
        body: CompletionRequest,
        model: str,
        request_id: str,
        created: int,
        outputs: AsyncIterator[tuple[int, RequestOutput]],
    ) -> AsyncIterator[CompletionResponse]:
        n = body.n
        seen: set[int] = set()  # prompts counted in usage
        echoed: set[int] = set()  # choices whose prompt has been echoed
        opened: set[int] = set()  # choices that have had their first chunk (return_token_ids)
        offsets: dict[int, int] = {}  # text_offset reached by each choice
        usage = UsageInfo()
        cached: dict[int, int] = {}  # each prompt's tokens found in the prefix cache
        async with contextlib.aclosing(outputs):
            async for i, output in outputs:
                if i not in seen:
                    seen.add(i)
                    usage.prompt_tokens += len(output.prompt_token_ids or ())
                cached[i] = max(cached.get(i, 0), output.num_cached_tokens or 0)
                for completion in map(functools.partial(_shown, body.echo_only), output.outputs):
                    index = i * n + completion.index
                    echo = body.echo and index not in echoed
                    if echo:
                        echoed.add(index)
                    usage.completion_tokens += len(completion.token_ids)
                    text = (await self._prompt_text(output) if echo else "") + completion.text
                    logprobs = self._logprobs(body, output, completion, echo=echo, offset=offsets.get(index, 0))
                    if logprobs is not None and logprobs.text_offset:
                        offsets[index] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
                    if not text and logprobs is None and completion.finish_reason is None:
                        continue  # text held back (stop strings, partial UTF-8): nothing to say yet
                    ids = body.return_token_ids
                    first = index not in opened
                    opened.add(index)
                    choice = CompletionChoice(
                        index,
                        text,
                        logprobs,
                        completion.finish_reason,
                        completion.stop_reason,
                        prompt_token_ids=output.prompt_token_ids if ids and first else None,
                        token_ids=completion.token_ids if ids else None,
                    )
                    yield CompletionResponse(
                        request_id,
                        created,
                        model,
                        [choice],
                        usage=self._usage_so_far(usage) if body.continuous_usage else None,
                    )
        if body.include_usage:  # the whole response's usage, cached prompt tokens included
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
            usage.prompt_tokens_details = PromptTokensDetails(sum(cached.values()))
            yield CompletionResponse(request_id, created, model, [], usage=usage)

    async def _engine_prompts(self, body: CompletionRequest, prompts: list) -> list[dict]:
        """Text prompts go to the engine as text (it tokenizes them with special tokens);
        without ``add_special_tokens`` they are tokenized here, on the renderer pool, without."""
        engine_prompts = []
        for p in prompts:
            if isinstance(p, str) and not body.add_special_tokens:
                ids = await self.offload(len(p), encode, self.tokenizer, p, False)
                engine_prompts.append(body.prompt_dict(ids, text=p))
            else:
                engine_prompts.append(body.prompt_dict(p))
        return engine_prompts

    async def _beam_search(
        self, body: CompletionRequest, model: str, prompts: list, response_id: str, created: int, engine_id: str
    ) -> web.Response:
        """``use_beam_search``: the ``n`` best beams of each prompt, as its ``n`` choices."""
        beam = beam_search_params(body, body.max_tokens, self.max_model_len)
        with self.admit(len(prompts), body.n) as started:
            ids = [
                p
                if isinstance(p, list)
                else await self.offload(len(p), encode, self.tokenizer, p, body.add_special_tokens)
                for p in prompts
            ]
            async with self.time_limit(self.deadline()):
                outputs = await run_all(self.engine, ids, beam, engine_id, started, body)
        eos = self.engine.input_processor.eos_token_id
        choices, usage = [], UsageInfo(sum(map(len, ids)))
        for i, (prompt_ids, output) in enumerate(zip(ids, outputs)):
            for k, (text, generated, finish) in enumerate(beam_answers(self.tokenizer, prompt_ids, output, body, eos)):
                choices.append(
                    CompletionChoice(
                        i * body.n + k,
                        text,
                        None,
                        finish,
                        prompt_token_ids=prompt_ids if body.return_token_ids else None,
                        token_ids=generated if body.return_token_ids else None,
                    )
                )
                usage.completion_tokens += len(generated)
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return json_response(CompletionResponse(response_id, created, model, choices, usage=usage))

    @staticmethod
    def _usage_so_far(usage: UsageInfo) -> UsageInfo:
        return UsageInfo(usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens + usage.completion_tokens)

    async def _prompt_text(self, output: RequestOutput) -> str:
        """The prompt to echo: its text, or a token-id prompt's ids (as the engine kept them)
        decoded on the renderer pool, off the event loop when they are many."""
        if output.prompt is not None:
            return output.prompt
        ids = output.prompt_token_ids or []
        return await self.offload(len(ids), decode, self.tokenizer, ids)

    def _logprobs(
        self, body: CompletionRequest, output: RequestOutput, completion: CompletionOutput, echo: bool, offset: int = 0
    ) -> Optional[CompletionLogProbs]:
        if body.logprobs is None:
            return None
        result = CompletionLogProbs()
        rows: list[tuple[int, Optional[dict[int, Logprob]]]] = []
        if echo:
            rows += zip(output.prompt_token_ids or [], output.prompt_logprobs or [])
        rows += zip(completion.token_ids, completion.logprobs or [])
        for token_id, row in rows:
            as_ids = body.return_tokens_as_token_ids
            if row is None:  # the first prompt token: nothing came before to predict it
                token = token_text(token_id, None, True) if as_ids else self.tokenizer.decode([token_id])
                logprob, top = None, None
            else:
                chosen = row[token_id] if token_id in row else next(iter(row.values()))
                token, logprob = token_text(token_id, chosen.decoded_token, as_ids), chosen.logprob
                top = {token_text(i, lp.decoded_token, as_ids): lp.logprob for i, lp in row.items()}
            result.tokens.append(token)
            result.token_logprobs.append(logprob)
            result.top_logprobs.append(top)
            result.text_offset.append(offset)
            offset += len(token)
        return result


def _shown(echo_only: bool, completion: CompletionOutput) -> CompletionOutput:
    """What a choice shows of ``completion``: all of it, or with ``echo_only`` nothing that was
    generated, cut at ``length`` (a failed request keeps its reason)."""
    if not echo_only:
        return completion
    reason = "length" if completion.finish_reason in ("stop", "length") else completion.finish_reason
    return dataclasses.replace(
        completion,
        text="",
        token_ids=[],
        cumulative_logprob=None,
        logprobs=None if completion.logprobs is None else [],
        finish_reason=reason,
        stop_reason=None,
    )
