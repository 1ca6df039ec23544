"""The one check of a request against the model's limits, run on both sides of the ring.

``SamplingParams.verify`` checks what a value may be anywhere; this checks what needs the model:
the prompt's length and token ids, logprob counts against ``max_logprobs``, prompt logprobs x the
prompt's length against ``max_prompt_logprobs_entries``, and the token ids of the logit controls
against the vocabulary. The frontend runs it before it sends a request, so a caller gets a
ParameterError naming the field (an HTTP 400); the core runs it on every request it is given,
since what arrives on the ring is another process's data. One function, so the two
sides cannot drift apart: the same limits and the same messages.

A leaf of the import graph (it imports only ``engine.exceptions``), so the frontend and the
EngineCore can both import it without either loading the other's modules.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from engine.exceptions import ParameterError


class RequestLimits(NamedTuple):
    """The model's limits a request is checked against."""

    max_model_len: int
    vocab_size: int
    max_logprobs: int
    max_prompt_logprobs_entries: int

    @classmethod
    def of(cls, model_config: Any) -> "RequestLimits":
        return cls(
            model_config.max_model_len,
            model_config.vocab_size,
            model_config.max_logprobs,
            model_config.max_prompt_logprobs_entries,
        )


def _check_prompt_logprobs_entries(num_prompt_tokens: int, params: Any, limits: RequestLimits) -> None:
    """Prompt logprobs are a row per prompt position, each the prompt's own token and the top
    ``prompt_logprobs``, for each of the ``n`` samples (each computes and answers them): a bound
    on the reply's size, and on the core's work for it."""
    asked = params.prompt_logprobs
    if asked is None:
        return
    entries = num_prompt_tokens * ((limits.vocab_size if asked == -1 else asked) + 1) * params.n
    if entries > limits.max_prompt_logprobs_entries:
        raise ParameterError(
            f"prompt_logprobs={asked} on a prompt of {num_prompt_tokens} tokens"
            f"{f' with n={params.n}' if params.n > 1 else ''} asks for {entries} logprobs "
            f"(prompt tokens x (prompt_logprobs + 1) x n), more than this server's "
            f"max_prompt_logprobs_entries={limits.max_prompt_logprobs_entries}",
            parameter="prompt_logprobs",
            value=asked,
        )


def check_request(prompt_token_ids: Sequence[int], params: Any, limits: RequestLimits) -> None:
    """Raise ParameterError for the first way the prompt (token ids) or the SamplingParams
    ``params`` do not fit the model; ``params`` must have passed ``SamplingParams.verify``.
    A logprob count of -1 (vLLM's whole vocabulary) counts as the vocabulary's size."""
    if not prompt_token_ids:
        raise ParameterError("the prompt is empty; it must have at least one token", parameter="prompt")
    if len(prompt_token_ids) > limits.max_model_len:
        raise ParameterError(
            f"the prompt (length {len(prompt_token_ids)}) is longer than the maximum "
            f"model length max_model_len={limits.max_model_len}",
            parameter="prompt",
        )
    low, high = min(prompt_token_ids), max(prompt_token_ids)
    if low < 0 or high >= limits.vocab_size:
        bad = low if low < 0 else high
        shown = bad if bad.bit_length() <= 64 else f"of {bad.bit_length()} bits"
        raise ParameterError(
            f"prompt token id {shown} is out of the vocabulary [0, {limits.vocab_size})", parameter="prompt"
        )
    for name in ("logprobs", "prompt_logprobs"):
        asked = getattr(params, name)
        count = limits.vocab_size if asked == -1 else asked
        if count is not None and count > limits.max_logprobs:
            shown = f"{asked} (-1: the whole vocabulary)" if asked == -1 else asked
            raise ParameterError(
                f"SamplingParams.{name} must be <= max_logprobs={limits.max_logprobs}, got {shown}",
                parameter=name,
                value=asked,
            )
    _check_prompt_logprobs_entries(len(prompt_token_ids), params, limits)
    for name in ("logit_bias", "allowed_token_ids"):
        ids = getattr(params, name) or ()
        if ids and (min(ids) < 0 or max(ids) >= limits.vocab_size):  # in C: the ids are many, the faults few
            bad_ids = [t for t in ids if not 0 <= t < limits.vocab_size]
            raise ParameterError(
                f"SamplingParams.{name} has token id(s) out of the vocabulary [0, {limits.vocab_size}): {bad_ids[:5]}",
                parameter=name,
                value=bad_ids[:5],
            )
