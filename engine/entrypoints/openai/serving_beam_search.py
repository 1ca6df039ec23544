"""``use_beam_search`` over HTTP: vLLM's beam search (engine/beam_search.py, the search
``LLM.beam_search`` runs) driven on the event loop, each round's one-token requests to the
engine at once. ``n`` is the beam width and the number of choices, best first; the other fields
are vLLM's BeamSearchParams: ``max_tokens``, ``ignore_eos``, ``temperature``, ``length_penalty``.

What a beam search cannot honour is refused with a 400 naming the field rather than dropped:
streaming, logprobs, echo, stop strings and stop token ids, ``min_tokens``, a seed, the
sampling filters and penalties (a beam keeps the most likely continuations) and structured
outputs. Leaving early (disconnect, timeout) cancels the round in flight, which aborts its
requests in the core.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Optional

import msgspec

from engine.beam_search import BeamSearch, BeamSearchOutput
from engine.entrypoints.openai.errors import OpenAIError
from engine.outputs import Logprob
from engine.sampling_params import BeamSearchParams

# Request fields a beam search cannot carry out, with the value that asks nothing of it.
_UNSUPPORTED = {
    "stream": False,
    "logprobs": None,
    "echo": False,
    "stop": None,
    "stop_token_ids": None,
    "min_tokens": 0,
    "seed": None,
    "top_p": None,
    "top_k": None,
    "min_p": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": None,
    "prompt_logprobs": None,
    "response_format": None,
    "structured_outputs": None,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "tools": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "truncate_prompt_tokens": None,
}


def beam_search_params(body: Any, max_tokens: Optional[int], max_model_len: int) -> BeamSearchParams:
    """The BeamSearchParams of a ``use_beam_search`` request; 400 naming a field it cannot honour."""
    for name, inert in _UNSUPPORTED.items():
        value = getattr(body, name, inert)
        if value not in (inert, None) and not (name == "logprobs" and value is False):
            raise OpenAIError(400, f"{name} cannot be used with use_beam_search", param=name, code="invalid_value")
    temperature = body.temperature if body.temperature is not None else 0.0
    return BeamSearchParams(
        beam_width=body.n,
        max_tokens=max_tokens or max_model_len,
        ignore_eos=body.ignore_eos,
        temperature=temperature,
        length_penalty=body.length_penalty,
        include_stop_str_in_output=body.include_stop_str_in_output,
    )


async def run_beam_search(
    engine: Any,
    prompt_ids: list[int],
    params: BeamSearchParams,
    request_id: str,
    started: Any,
    priority: int = 0,
    cache_salt: Optional[str] = None,
) -> BeamSearchOutput:
    """The best ``beam_width`` beams of one prompt; ``started`` is called when the first round is back."""
    room = engine.input_processor.max_model_len - len(prompt_ids)  # a beam may not outgrow the context
    params = msgspec.structs.replace(params, max_tokens=max(1, min(params.max_tokens, room)))
    search = BeamSearch([prompt_ids], params, engine.input_processor.eos_token_id)
    salt = {} if cache_salt is None else {"cache_salt": cache_salt}

    async def next_token(tokens: list[int], rid: str) -> dict[int, Logprob]:
        final = None
        async with contextlib.aclosing(
            engine.generate({"prompt_token_ids": tokens, **salt}, search.step_params, rid, priority=priority)
        ) as outputs:
            async for final in outputs:
                pass
        return final.outputs[0].logprobs[0]

    while not search.done:
        async with asyncio.TaskGroup() as group:  # one failing or cancelled: the others are cancelled too
            tasks = [
                group.create_task(next_token(b.tokens, f"{request_id}-{search.rounds}-{i}"))
                for i, b in enumerate(search.beams())
            ]
        if search.rounds == 0:
            started()
        search.advance([task.result() for task in tasks])
    return search.outputs(None)[0]


async def run_all(
    engine: Any, prompts: list[list[int]], params: BeamSearchParams, request_id: str, started: Any, body: Any
) -> list[BeamSearchOutput]:
    """``run_beam_search`` for each prompt of a request, at once; one failing cancels the others."""
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(
                run_beam_search(engine, ids, params, f"{request_id}-{i}", started, body.priority, body.cache_salt)
            )
            for i, ids in enumerate(prompts)
        ]
    return [task.result() for task in tasks]


def beam_answers(
    tokenizer: Any, prompt_ids: list[int], output: BeamSearchOutput, body: Any, eos_token_id: Optional[int]
) -> list[tuple[str, list[int], str]]:
    """Each beam of a prompt, best first, as (text, generated token ids, finish reason): "stop"
    for a beam that ended with EOS, else "length"."""
    answers = []
    for beam in output.sequences:
        generated = beam.tokens[len(prompt_ids) :]
        ended = bool(generated) and generated[-1] == eos_token_id and not body.ignore_eos
        text = tokenizer.decode(generated, skip_special_tokens=body.skip_special_tokens)
        answers.append((text, generated, "stop" if ended else "length"))
    return answers
