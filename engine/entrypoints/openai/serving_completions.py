"""POST /v1/completions: a prompt (or a batch of them) in, completions out, whole or streamed.

Each prompt of a batch is its own engine request; choice ``i * n + k`` is the k-th sample of
prompt i, as OpenAI and vLLM number them. Logprobs use the legacy completions shape
(tokens, token_logprobs, top_logprobs, text_offset); with ``echo`` the prompt's own
logprobs come first, the first prompt token having none.
"""
from __future__ import annotations

import contextlib
from typing import AsyncIterator, Optional

from aiohttp import web

from engine.entrypoints.openai.protocol import (CompletionChoice, CompletionLogProbs, CompletionRequest,
                                                CompletionResponse, UsageInfo, decode_request, now,
                                                random_id)
from engine.entrypoints.openai.serving_engine import OpenAIServing, json_response
from engine.outputs import CompletionOutput, Logprob, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: web.Request) -> web.StreamResponse:
        body = decode_request(await request.read(), CompletionRequest)
        model = self.check_model(body.model)
        params = body.to_sampling_params(self.model_defaults)
        prompts = body.prompts()
        request_id, created = random_id("cmpl"), now()
        with self.admit(len(prompts), params.n) as started:
            outputs = self.generate_all([p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts],
                                        params, request_id, started)
            if body.stream:
                return await self.sse_response(request, self._chunks(body, model, request_id, created, outputs))
            finals: dict[int, RequestOutput] = {}
            async with contextlib.aclosing(outputs), self.time_limit(self.deadline()):
                async for i, output in outputs:
                    finals[i] = output
        choices, usage = [], UsageInfo()
        for i in range(len(prompts)):
            final = finals[i]
            prompt_text = self._prompt_text(final) if body.echo else ""
            for completion in final.outputs:
                choices.append(CompletionChoice(
                    index=i * params.n + completion.index, text=prompt_text + completion.text,
                    logprobs=self._logprobs(body, final, completion, echo=body.echo),
                    finish_reason=completion.finish_reason, stop_reason=completion.stop_reason))
                usage.completion_tokens += len(completion.token_ids)
            usage.prompt_tokens += len(final.prompt_token_ids or ())
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        choices.sort(key=lambda c: c.index)
        return json_response(CompletionResponse(request_id, created, model, choices, usage=usage))

    async def _chunks(self, body: CompletionRequest, model: str, request_id: str, created: int,
                      outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[CompletionResponse]:
        n = body.n
        seen: set[int] = set()  # prompts counted in usage
        echoed: set[int] = set()  # choices whose prompt has been echoed
        offsets: dict[int, int] = {}  # text_offset reached by each choice
        usage = UsageInfo()
        async with contextlib.aclosing(outputs):
            async for i, output in outputs:
                if i not in seen:
                    seen.add(i)
                    usage.prompt_tokens += len(output.prompt_token_ids or ())
                for completion in output.outputs:
                    index = i * n + completion.index
                    echo = body.echo and index not in echoed
                    if echo:
                        echoed.add(index)
                    usage.completion_tokens += len(completion.token_ids)
                    text = (self._prompt_text(output) if echo else "") + completion.text
                    logprobs = self._logprobs(body, output, completion, echo=echo, offset=offsets.get(index, 0))
                    if logprobs is not None and logprobs.text_offset:
                        offsets[index] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
                    if not text and logprobs is None and completion.finish_reason is None:
                        continue  # text held back (stop strings, partial UTF-8): nothing to say yet
                    yield CompletionResponse(request_id, created, model, [CompletionChoice(
                        index, text, logprobs, completion.finish_reason, completion.stop_reason)])
        if body.include_usage:
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
            yield CompletionResponse(request_id, created, model, [], usage=usage)

    def _prompt_text(self, output: RequestOutput) -> str:
        if output.prompt is not None:
            return output.prompt
        return self.tokenizer.decode(output.prompt_token_ids or [])

    def _logprobs(self, body: CompletionRequest, output: RequestOutput, completion: CompletionOutput,
                  echo: bool, offset: int = 0) -> Optional[CompletionLogProbs]:
        if body.logprobs is None:
            return None
        result = CompletionLogProbs()
        rows: list[tuple[int, Optional[dict[int, Logprob]]]] = []
        if echo:
            rows += zip(output.prompt_token_ids or [], output.prompt_logprobs or [])
        rows += zip(completion.token_ids, completion.logprobs or [])
        for token_id, row in rows:
            if row is None:  # the first prompt token: nothing came before to predict it
                token, logprob, top = self.tokenizer.decode([token_id]), None, None
            else:
                chosen = row[token_id] if token_id in row else next(iter(row.values()))
                token, logprob = chosen.decoded_token or "", chosen.logprob
                top = {lp.decoded_token or "": lp.logprob for lp in row.values()}
            result.tokens.append(token)
            result.token_logprobs.append(logprob)
            result.top_logprobs.append(top)
            result.text_offset.append(offset)
            offset += len(token)
        return result

