"""The sampler on crafted logits (masks and penalties exact), and through the runner on
the tiny model (seeded requests reproducible across batch compositions and preemption)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.worker.sampler import (
    TOP_P_CANDIDATES,
    Sampler,
    SamplingMetadata,
    _top_k_top_p_sorted,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    gather_logprobs,
    sample_from_cdf,
)
from tests.helpers.runner_utils import generate, make_request, make_runner, preempt, step

NEG = float("-inf")
# softmax(log p) = p: probabilities 0.5, 0.3, 0.15, 0.05 in a shuffled order.
PROBS = [0.15, 0.5, 0.05, 0.3]
LOGITS = [math.log(p) for p in PROBS]


def kept(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row > NEG).flatten().tolist()) for row in logits]


def rows(*values) -> torch.Tensor:
    return torch.tensor([list(v) for v in values], dtype=torch.float32)


def test_top_k_keeps_exactly_the_k_largest_per_row():
    logits = rows(LOGITS, LOGITS, LOGITS)
    out = apply_top_k_top_p(logits, torch.tensor([1, 2, 4]), None)
    assert kept(out) == [{1}, {1, 3}, {0, 1, 2, 3}]


def test_top_p_keeps_the_smallest_set_reaching_p():
    # Sorted: 0.5 (1), 0.3 (3), 0.15 (0), 0.05 (2).
    out = apply_top_k_top_p(rows(LOGITS, LOGITS, LOGITS, LOGITS), None, torch.tensor([0.4, 0.75, 0.9, 1.0]))
    assert kept(out) == [{1}, {1, 3}, {0, 1, 3}, {0, 1, 2, 3}]


def test_top_k_and_top_p_together():
    out = apply_top_k_top_p(rows(LOGITS, LOGITS), torch.tensor([2, 4]), torch.tensor([0.9, 0.75]))
    assert kept(out) == [{1, 3}, {1, 3}]


def test_top_p_over_a_large_vocabulary_equals_the_full_sort():
    """The candidate shortcut (top TOP_P_CANDIDATES per row) keeps exactly what sorting the
    whole row keeps: peaked rows (cut from candidates), flat rows (whose candidates fall
    short of p: full sort), top-k below and above the candidate count, ties at the k-th."""
    vocab = 3 * TOP_P_CANDIDATES
    gen = torch.Generator().manual_seed(3)
    peaked = torch.randn(6, vocab, generator=gen) * 4
    flat = torch.randn(6, vocab, generator=gen) * 0.01
    tied = torch.randn(6, vocab, generator=gen).round()  # many exact ties, at every cut
    logits = torch.cat([peaked, flat, tied])
    n = logits.shape[0]
    top_p = torch.tensor([0.1, 0.5, 0.9, 0.99, 1.0, 0.999] * 3)
    for top_k in (None, torch.tensor([5, 50, TOP_P_CANDIDATES, TOP_P_CANDIDATES + 7, vocab, 2000] * 3)):
        got = apply_top_k_top_p(logits.clone(), top_k, top_p)
        want = _top_k_top_p_sorted(logits.clone(), top_k, top_p)
        assert kept(got)[:12] == kept(want)[:12]
        assert torch.equal(got[got > NEG], logits[got > NEG])  # kept logits unchanged
        for row in range(12, n):  # which of several tied tokens straddle the cut is arbitrary in both
            got_vals, want_vals = logits[row][got[row] > NEG], logits[row][want[row] > NEG]
            assert torch.equal(got_vals.sort().values, want_vals.sort().values)


@pytest.mark.parametrize("vocab", [4, 3 * TOP_P_CANDIDATES])  # the full sort, then the candidate path
def test_top_k_above_the_vocabulary_filters_nothing_with_or_without_top_p(vocab):
    """vLLM's meaning: a k larger than the vocabulary is no top-k at all (it used to index
    past the end of the row and kill the EngineCore)."""
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0)) * 3
    huge_k = torch.tensor([vocab + 1, 10**6, (1 << 63) - 1])
    for top_p in (None, torch.tensor([0.5, 0.9999, 1.0])):
        got = apply_top_k_top_p(logits.clone(), huge_k, top_p)
        want = apply_top_k_top_p(logits.clone(), None, top_p) if top_p is not None else logits
        assert kept(got) == kept(want)


def test_gather_logprobs_clamps_the_count_to_the_vocabulary():
    logprobs = torch.log_softmax(rows(LOGITS), dim=-1)
    for num in (-1, 4, 50):
        ids, lps, _ = gather_logprobs(logprobs, torch.tensor([1]), num)
        assert ids.shape == lps.shape == (1, 5) and set(ids[0, 1:].tolist()) == {0, 1, 2, 3}


def test_cdf_sampling_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5000)
    counts = torch.bincount(sample_from_cdf(probs, {}), minlength=5)
    assert counts[0] == counts[2] == counts[4] == 0 and abs(int(counts[1]) - 2500) < 200


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    out = apply_min_p(rows(LOGITS, LOGITS, LOGITS), torch.tensor([0.2, 0.5, 0.0]))
    # thresholds 0.1, 0.25, 0.0
    assert kept(out) == [{0, 1, 3}, {1, 3}, {0, 1, 2, 3}]


def test_penalties_change_logits_exactly_as_specified():
    logits = rows([2.0, -2.0, 1.0, 0.5, 3.0])
    md = SamplingMetadata(
        1,
        presence=torch.tensor([0.25]),
        frequency=torch.tensor([0.5]),
        repetition=torch.tensor([2.0]),
        prompt_masks=torch.tensor([[True, True, False, False, False]]),
        output_tokens=torch.tensor([[2, 2, 3, 5]]),
    )  # 5 = padding (vocab size)
    out = apply_penalties(logits, md)
    # repetition over prompt + output (divide positives, multiply negatives), then
    # frequency x count and presence once, over output tokens only; token 4 untouched.
    assert out[0].tolist() == [1.0, -4.0, 0.5 - 1.0 - 0.25, 0.25 - 0.5 - 0.25, 3.0]


def test_min_tokens_ban_and_greedy_argmax():
    logits = rows([0.0, 1.0, 5.0, 2.0], [0.0, 1.0, 5.0, 2.0])
    md = SamplingMetadata(2, banned_rows=torch.tensor([0]), banned_tokens=torch.tensor([2]))
    assert Sampler()(logits, md).sampled.tolist() == [3, 2]


def test_logprobs_are_raw_with_ranks_of_the_sampled_token():
    logits = rows(LOGITS)
    md = SamplingMetadata(1, temperature=torch.tensor([0.5]), top_k=torch.tensor([1]), max_num_logprobs=2)
    out = Sampler()(logits.clone(), md)
    assert out.sampled.tolist() == [1]
    assert out.logprob_token_ids.tolist() == [[1, 1, 3]]
    assert out.logprobs[0].tolist() == pytest.approx([math.log(0.5), math.log(0.5), math.log(0.3)], abs=1e-6)
    ids, lps, ranks = gather_logprobs(torch.log_softmax(logits, -1), torch.tensor([2]), 1)
    assert ids.tolist() == [[2, 1]] and ranks.tolist() == [4]


def test_random_sampling_follows_the_distribution_and_the_masks():
    torch.manual_seed(0)
    n = 20000
    logits = rows(*[LOGITS] * n)
    md = SamplingMetadata(n, temperature=torch.ones(n), top_p=torch.full((n,), 0.9))
    counts = torch.bincount(Sampler()(logits, md).sampled, minlength=4).float() / n
    # top_p=0.9 keeps 0.5, 0.3, 0.15, renormalized by 0.95; token 2 (0.05) never.
    assert counts.tolist() == pytest.approx([0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95], abs=0.015)


def test_seeded_rows_draw_from_their_own_generator():
    def draw(batch_size: int, row: int) -> list[int]:
        logits = rows(*[LOGITS] * batch_size)
        gen = torch.Generator().manual_seed(7)
        out = []
        for _ in range(20):
            md = SamplingMetadata(batch_size, temperature=torch.ones(batch_size), generators={row: gen})
            out.append(Sampler()(logits.clone(), md).sampled[row].item())
        return out

    assert draw(1, 0) == draw(5, 3) == draw(3, 2)


# ---------------------------------------------------------------- through the runner


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return make_runner(tiny_model_dir, load_format="dummy", block_size=4)


PROMPT = [11, 400, 23, 5000, 7, 801, 66]


def _seeded(req_id: str, seed: int = 1234, **params):
    return make_request(req_id, PROMPT, temperature=1.0, seed=seed, **params)


def test_seeded_request_is_reproducible_across_batch_compositions(runner):
    alone = _seeded("a")
    generate(runner, [alone], 12)
    others = [
        make_request("u1", [9, 8, 7], temperature=1.0),
        _seeded("s2", seed=99),
        make_request("g3", [1, 2, 3, 4, 5, 6, 7, 8, 9], temperature=0.0),
    ]
    crowded = _seeded("b")
    generate(runner, others[:2] + [crowded] + others[2:], 12, chunk=3)
    assert crowded.output_token_ids == alone.output_token_ids
    assert others[1].output_token_ids != alone.output_token_ids  # a different seed, a different stream


def test_seeded_request_is_reproducible_across_preemption(runner):
    ref = _seeded("p-ref")
    generate(runner, [ref], 10)
    req = _seeded("p")
    generate(runner, [req], 4)
    preempt(runner, req)  # KV and runner state gone: recompute prompt + 4 outputs
    generate(runner, [req], 10)
    assert req.output_token_ids == ref.output_token_ids


def test_min_tokens_masks_eos_and_stop_tokens_through_the_runner(runner):
    """The tiny model's greedy choice is forced to be a stop token by banning ids, never eos."""
    greedy = make_request("free", PROMPT)
    step(runner, [greedy])
    first = greedy.output_token_ids[0]
    req = make_request("min", PROMPT, min_tokens=2, stop_token_ids=[first])
    step(runner, [req])
    assert req.output_token_ids[0] != first
    eos_first = make_request("eos", PROMPT, min_tokens=2)
    eos_first.eos_token_id = first
    step(runner, [eos_first])
    assert eos_first.output_token_ids[0] != first
    ignored = make_request("ign", PROMPT, min_tokens=2, ignore_eos=True)
    ignored.eos_token_id = first
    step(runner, [ignored])
    assert ignored.output_token_ids[0] == first


def test_logprobs_rows_and_prompt_logprobs_across_chunks(runner):
    req = make_request("lp", PROMPT, logprobs=3, prompt_logprobs=2)
    outs = generate(runner, [req], 3, chunk=3)
    prompt_rows = [row for o in outs if "lp" in o.prompt_logprobs for row in o.prompt_logprobs["lp"].token_ids]
    assert [row[0] for row in prompt_rows] == PROMPT[1:]  # one row per next prompt token
    assert all(len(row) == 3 for row in prompt_rows)
    sample_rows = [o.logprobs["lp"] for o in outs if "lp" in o.logprobs]
    assert [r.token_ids[0][0] for r in sample_rows] == req.output_token_ids
    assert all(len(r.token_ids[0]) == 4 and r.ranks == [1] for r in sample_rows)  # greedy: rank 1


def test_repetition_penalty_steers_greedy_away_from_seen_tokens(runner):
    plain = make_request("rep0", PROMPT)
    generate(runner, [plain], 8)
    penalized = make_request("rep1", PROMPT, repetition_penalty=2.0, frequency_penalty=2.0)
    generate(runner, [penalized], 8)
    assert len(set(penalized.output_token_ids)) > len(set(plain.output_token_ids))


def test_argmax_rows_is_torch_argmax_with_first_maximum_on_ties():
    from engine.worker.sampler import argmax_rows

    x = torch.randn(8, 4096)
    x[1, 7] = x[1, 3000] = 100.0  # a tie across chunks: the first wins
    x[2] = 0.0  # all equal
    x[3, 300] = x[3, 301] = 50.0  # a tie inside a chunk
    assert argmax_rows(x).tolist() == x.argmax(dim=-1).tolist()
    assert argmax_rows(x)[1:4].tolist() == [7, 0, 300]
    odd = torch.randn(3, 1000)  # not a multiple of the chunk: plain argmax
    assert argmax_rows(odd).tolist() == odd.argmax(dim=-1).tolist()
