"""``deterministic=True`` on the default model, its real weights on its default path (on a Zen4
the Q4_1 GGUF on the quantized kernels): the same 16 greedy requests give the same tokens and
logprobs alone, in a batch of 64, and after a prefix-cache hit (red team round 3, finding 10:
without the flag a 16-token hit or the batch changed greedy text and loglikelihoods)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.slow]

SUBJECTS = [
    "rivers",
    "bread",
    "stars",
    "violins",
    "glaciers",
    "chess",
    "bees",
    "copper",
    "lighthouses",
    "tides",
    "owls",
    "paper",
    "volcanoes",
    "sailing",
    "tea",
    "clocks",
]


def greedy_runs(llm: LLM, prompts: list[str]) -> list[tuple[list[int], list[float], int]]:
    """(tokens, each token's logprob, prompt tokens found in the prefix cache) per prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    return [
        (
            list(o.outputs[0].token_ids),
            [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)],
            o.num_cached_tokens or 0,
        )
        for o in outs
    ]


def test_greedy_tokens_and_logprobs_are_the_same_alone_in_a_batch_and_after_a_cache_hit():
    llm = LLM(max_model_len=512, deterministic=True)
    prompts = [
        f"Write three careful sentences about {s}, for a curious child who asks why ({i})."
        for i, s in enumerate(SUBJECTS)
    ]
    fillers = [
        f"{j}: list {j % 9 + 2} facts about the number {j * 7919 % 1000}, one per line, shortest first."
        for j in range(48)
    ]
    try:
        batch = greedy_runs(llm, prompts + fillers)[:16]  # one batch of 64, nothing cached yet
        assert llm.reset_prefix_cache()
        alone = [greedy_runs(llm, [p])[0] for p in prompts]  # each on its own, nothing cached
        hit = [greedy_runs(llm, [p])[0] for p in prompts]  # each again: its prompt's blocks are cached
    finally:
        llm.shutdown()
    assert all(cached == 0 for *_, cached in batch + alone)
    assert all(cached >= 16 for *_, cached in hit)
    for i in range(16):
        assert batch[i][:2] == alone[i][:2], f"prompt {i}: batch of 64 vs alone"
        assert hit[i][:2] == alone[i][:2], f"prompt {i}: after a {hit[i][2]}-token prefix-cache hit vs alone"
