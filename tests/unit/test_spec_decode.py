"""Speculative decoding's parts without a model: the n-gram lookup, the acceptance rule (and its
distribution under sampling), the scheduler's drafts and rollback, and the config's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import EngineArgs
from engine.core.request import RequestStatus
from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.spec_decode.config import resolve_speculative_config
from engine.spec_decode.ngram import ngram_draft
from engine.spec_decode.verify import accepted_tokens, rejection_sample
from engine.wire_messages import FinishReason
from engine.worker.sampler import Sampler, SamplingMetadata
from tests.helpers.core_utils import EOS, make_request, make_scheduler

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}


PROMPT = [10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12]  # next: 13, then the lookup proposes 10 11 12


def draft(tokens: list[int], min_n: int = 2, max_n: int = 3, k: int = 3) -> list[int]:
    return ngram_draft(np.asarray(tokens, dtype=np.int64), min_n, max_n, k)


# ---------------------------------------------------------------- n-gram lookup
def test_ngram_proposes_what_followed_the_longest_matching_suffix():
    # suffix [5, 6, 7] occurred at 0..2 (followed by 1 2 3); [6, 7] alone also at 10..11 (followed by 9)
    tokens = [5, 6, 7, 1, 2, 3, 4, 0, 0, 0, 6, 7, 9, 9, 9, 8, 5, 6, 7]
    assert draft(tokens) == [1, 2, 3]
    assert draft(tokens, max_n=2) == [9, 9, 9]  # the last occurrence of the 2-gram
    assert draft(tokens, k=1) == [1]


def test_ngram_proposes_nothing_without_a_match_of_min_tokens():
    assert draft([1, 2, 3, 4, 5, 6]) == []
    assert draft([1, 2, 9, 3, 2]) == []  # [3, 2] never occurred; a 1-gram is below min
    assert draft([1, 2, 9, 3, 2], min_n=1) == [9, 3, 2]
    assert draft([7]) == [] and draft([], min_n=1) == []


def test_ngram_in_a_run_of_one_token_proposes_k_tokens():
    assert draft([4] * 20, k=5) == [4] * 5  # the last occurrence would leave one token after it


def test_ngram_draft_stops_at_the_context_end():
    assert draft([1, 2, 3, 1, 2], k=5) == [3, 1, 2]


# ---------------------------------------------------------------- acceptance
def test_accepts_the_matching_prefix_and_one_target_token():
    assert accepted_tokens([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]
    assert accepted_tokens([5, 9, 7, 8], [5, 6, 7]) == [5, 9]
    assert accepted_tokens([1, 6, 7, 8], [5, 6, 7]) == [1]


def test_sampled_verification_keeps_the_target_distribution():
    """Rejection sampling of a point-mass draft: the emitted token at each position follows the
    target's distribution there (chi-square, 4 degrees of freedom, alpha 1e-3: 18.47), given that
    the drafts before it were accepted. Seeded."""
    torch.manual_seed(0)
    vocab, k, trials, temperature = 5, 2, 30000, 0.8
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 1.5, 1.0, 0.2, 0.1], [1.0, 0.0, 1.0, 0.5, 0.3]])
    target = torch.softmax(logits / temperature, dim=-1)
    drafts = [0, 1]  # the most likely token, then a likely one
    md = SamplingMetadata(trials * (k + 1), temperature=torch.full((trials * (k + 1),), temperature))
    sampled = Sampler()(logits.repeat(trials, 1), md).sampled.view(trials, k + 1).tolist()
    emitted = [accepted_tokens(row, drafts) for row in sampled]
    for position in range(k + 1):
        reached = [e[position] for e in emitted if len(e) > position]  # drafts before it accepted
        observed = np.bincount(reached, minlength=vocab)
        expected = target[position].numpy() * len(reached)
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < 18.47, (position, observed, expected)
    accepted_first = sum(1 for e in emitted if len(e) > 1) / trials
    assert abs(accepted_first - float(target[0, 0])) < 0.02  # accepted with probability p(d)


def test_rejection_sampling_with_draft_probabilities_keeps_the_target_distribution():
    """A draft model's drafts drawn from its own q: the emitted token at each position follows the
    target's p there (chi-square, 4 degrees of freedom, alpha 1e-3: 18.47), given that the drafts
    before it were accepted, and a draft is kept with probability sum(min(p, q)). Seeded."""
    torch.manual_seed(0)
    vocab, trials = 5, 20000
    p = torch.softmax(
        torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 1.5, 1.0, 0.2, 0.1], [1.0, 0.0, 1.0, 0.5, 0.3]]), dim=-1
    )
    q = torch.softmax(torch.tensor([[0.0, 2.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 2.0, 0.1]]), dim=-1)
    drafts = torch.multinomial(q, trials, replacement=True).T.tolist()  # [trials, 2], row j from q[j]
    emitted = [rejection_sample(p, q, d) for d in drafts]
    for position in range(3):
        reached = [e[position] for e in emitted if len(e) > position]
        observed = np.bincount(reached, minlength=vocab)
        expected = p[position].numpy() * len(reached)
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < 18.47, (position, observed, expected)
    kept_first = sum(1 for e in emitted if len(e) > 1) / trials
    assert abs(kept_first - float(torch.minimum(p[0], q[0]).sum())) < 0.02


def test_rejection_sampling_keeps_every_draft_when_draft_and_target_agree():
    p = torch.softmax(torch.tensor([[1.0, 0.0, 2.0]] * 4), dim=-1)
    for draft in ([2, 0, 1], [0, 0, 0]):
        assert rejection_sample(p, p[:3], draft)[:3] == draft


def test_a_draft_models_kv_stays_valid_as_far_as_its_drafts_were_accepted():
    from engine.spec_decode.draft_model import _DraftKV

    kv = _DraftKV()
    kv.valid = kv.base = 10
    kv.fed = [5, 6, 7]  # drafts 5 6 7 8 proposed after 10 known tokens; 5 6 accepted, then 9
    assert kv.rolled_back(list(range(10)) + [5, 6, 9]) == 12
    assert kv.rolled_back(list(range(10)) + [5, 6, 9, 1]) == 12  # nothing fed since: unchanged
    kv.valid = kv.base = 13
    kv.fed = [1, 2]
    assert kv.rolled_back(list(range(13)) + [1, 2, 3, 4]) == 15  # all accepted (and the last, 3)


# ---------------------------------------------------------------- scheduler: drafts and rollback
def run_step(scheduler, emit: dict[str, list[int]]) -> tuple[SchedulerOutput, list]:
    """One step; a request with drafts emits ``emit[id]`` (as the runner's acceptance would)."""
    sched = scheduler.schedule()
    out = ModelRunnerOutput()
    for req, n in zip(sched.requests, sched.num_scheduled_tokens):
        if req.num_computed_tokens + n == req.num_tokens + len(req.spec_token_ids):
            tokens = emit[req.request_id] if req.spec_token_ids else [emit[req.request_id][0]]
            out.req_ids.append(req.request_id)
            out.sampled_token_ids.append(tokens[0])
            if req.spec_token_ids:
                out.accepted_token_ids[req.request_id] = tokens
    return sched, scheduler.update_from_output(sched, out)


def test_rejected_drafts_roll_back_the_length_and_free_their_blocks():
    s = make_scheduler(num_blocks=40, block_size=2, speculative_config=NGRAM)
    req = make_request("a", PROMPT, max_tokens=20)
    s.add_request(req)
    run_step(s, {"a": [13]})  # the prompt, then 13: the context ends 11 12 13
    free_before = s.kv_cache.num_free_blocks
    sched, outs = run_step(s, {"a": [10, 9]})  # drafts 10 11 12: 10 accepted, then the target's 9
    assert sched.num_scheduled_tokens == [4] and req.output_token_ids == [13, 10, 9]
    assert outs[0].new_token_ids == [10, 9]
    assert req.num_computed_tokens == req.num_tokens - 1 == 13
    # 16 positions were allocated (8 blocks); 14 tokens keep 7, one more than the 12 before
    assert len(req.block_ids) == 7 and s.kv_cache.num_free_blocks == free_before - 1
    stats = s.make_stats()
    assert (
        stats.spec_decode_num_drafts,
        stats.spec_decode_num_draft_tokens,
        stats.spec_decode_num_accepted_tokens,
    ) == (1, 3, 1)
    assert not req.spec_token_ids and req.spec_state.k == 2  # shortened to what was accepted + 1


def test_drafts_never_reach_past_max_tokens_and_a_stop_cuts_the_rest():
    s = make_scheduler(block_size=4, speculative_config=NGRAM)
    short = make_request("short", PROMPT, max_tokens=3)
    stopped = make_request("stopped", PROMPT, max_tokens=20)
    s.add_request(short)
    s.add_request(stopped)
    run_step(s, {"short": [13], "stopped": [13]})
    # "short" may emit 2 more: 1 draft; "stopped" meets EOS among its accepted tokens
    sched, outs = run_step(s, {"short": [10, 11], "stopped": [10, EOS, 12, 13]})
    assert sched.num_scheduled_tokens == [2, 4]
    by_id = {o.request_id: o for o in outs}
    assert by_id["short"].new_token_ids == [10, 11] and short.output_token_ids == [13, 10, 11]
    assert by_id["short"].finish_reason == FinishReason.LENGTH
    assert by_id["stopped"].new_token_ids == [10, EOS] and by_id["stopped"].finish_reason == FinishReason.STOP
    assert not s.requests and s.kv_cache.num_free_blocks == s.kv_cache.num_blocks


def test_aborted_requests_that_drafted_leave_no_block_behind():
    s = make_scheduler(block_size=2, speculative_config=NGRAM)
    for name in "ab":
        s.add_request(make_request(name, PROMPT, max_tokens=20))
    run_step(s, {"a": [13], "b": [13]})
    run_step(s, {"a": [10, 9], "b": [10, 11, 12, 13]})
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert s.kv_cache.num_free_blocks == s.kv_cache.num_blocks and not s.requests and not s.running


def test_no_drafts_for_penalties_seeds_or_a_large_batch():
    s = make_scheduler(block_size=4, speculative_config={**NGRAM, "disable_by_batch_size": 4})
    reqs = [
        make_request("plain", PROMPT),
        make_request("penalty", PROMPT, repetition_penalty=1.2),
        make_request("seeded", PROMPT, temperature=1.0, seed=1),
        make_request("fourth", PROMPT),
    ]
    for r in reqs[:3]:
        s.add_request(r)
    run_step(s, {"plain": [13], "penalty": [13], "seeded": [13]})
    sched, _ = run_step(s, {"plain": [10, 11, 12, 13], "penalty": [10], "seeded": [10]})
    assert sched.num_scheduled_tokens == [4, 1, 1]  # only the plain request drafts
    s.add_request(reqs[3])
    sched, _ = run_step(s, {"plain": [10], "penalty": [11], "seeded": [11], "fourth": [13]})
    assert sched.num_scheduled_tokens == [1, 1, 1, 3]  # four running (the new prompt: 8 tokens cached)


def test_drafts_take_only_the_budget_left():
    s = make_scheduler(block_size=4, max_num_batched_tokens=3, speculative_config=NGRAM)
    req = make_request("a", PROMPT, max_tokens=20)
    s.add_request(req)
    for _ in range(4):  # the prompt in chunks of 3
        run_step(s, {"a": [13]})
    sched, _ = run_step(s, {"a": [10, 11, 12]})
    assert sched.num_scheduled_tokens == [3] and req.output_token_ids == [13, 10, 11, 12]


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    "value, named",
    [
        ({"method": "draft_model", "num_speculative_tokens": 3}, "speculative_config.model"),
        ({"method": "ngram", "model": "/models/draft", "num_speculative_tokens": 3}, "speculative_config.model"),
        (
            {"model": "/models/draft", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2},
            "draft_tensor_parallel_size",
        ),
        ({"model": "/models/draft", "num_speculative_tokens": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
        ({"model": "/models/draft", "num_speculative_tokens": 3, "quantization": "gguf"}, "quantization"),
        ({"method": "eagle", "num_speculative_tokens": 3}, "'eagle' is not supported"),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2},
            "draft_tensor_parallel_size",
        ),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_max",
        ),
        ({"method": "ngrams", "num_speculative_tokens": 2}, "method"),
        ("ngram", "speculative_config"),
    ],
)
def test_speculative_config_refusals_name_the_key(value, named):
    with pytest.raises(ValueError, match=named):
        resolve_speculative_config(value)
    with pytest.raises(ValueError, match=named):
        EngineArgs(load_format="dummy", speculative_config=value).create_engine_config()


def test_a_model_alone_means_a_draft_model_as_in_vllm():
    cfg = resolve_speculative_config(
        {"model": "/models/draft", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}
    )
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("draft_model", "/models/draft", 3)
    assert resolve_speculative_config(cfg) == cfg


def test_speculative_config_defaults_follow_vllm():
    cfg = resolve_speculative_config({"method": "ngram", "num_speculative_tokens": 4})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (5, 5)
    cfg = resolve_speculative_config({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (3, 3)


def test_metrics_count_drafts_under_vllms_names():
    from prometheus_client import generate_latest

    from engine.entrypoints.openai.metrics import ServerMetrics
    from engine.wire_messages import SchedulerStats

    metrics = ServerMetrics("tiny", 256)
    for _ in range(2):
        metrics.record(
            SchedulerStats(
                spec_decode_num_drafts=3,
                spec_decode_num_draft_tokens=12,
                spec_decode_num_accepted_tokens=7,
                spec_decode_num_accepted_tokens_per_pos=[3, 2, 2, 0],
            ),
            None,
        )
    text = generate_latest(metrics.registry).decode()
    for name, value in (("drafts", 6), ("draft_tokens", 24), ("accepted_tokens", 14)):
        assert f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="tiny"}} {float(value)}' in text
    for position, value in enumerate((6, 4, 4, 0)):
        assert (
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",'
            f'position="{position}"}} {float(value)}'
        ) in text


def test_stats_count_accepted_tokens_per_position_and_log_the_acceptance(caplog, monkeypatch):
    from engine.spec_decode import drafts

    stats = drafts.SpecStats(3)
    stats.count(3, 1)
    stats.count(3, 3)
    monkeypatch.setattr(drafts, "LOG_INTERVAL_S", 0.0)
    with caplog.at_level("INFO", logger=drafts.__name__):
        taken = stats.take()
    assert taken["spec_decode_num_accepted_tokens_per_pos"] == [2, 1, 1]
    assert (
        taken["spec_decode_num_drafts"],
        taken["spec_decode_num_draft_tokens"],
        taken["spec_decode_num_accepted_tokens"],
    ) == (2, 6, 4)
    assert "draft acceptance rate 66.7%, mean acceptance length 3.00" in caplog.text
    assert stats.take()["spec_decode_num_accepted_tokens_per_pos"] == [0, 0, 0]


def test_drafts_shrink_after_a_rejection_and_pause_longer_after_each_run_of_misses():
    s = make_scheduler(block_size=4, speculative_config={**NGRAM, "prompt_lookup_min": 1})
    req = make_request("a", PROMPT, max_tokens=64)
    s.add_request(req)
    run_step(s, {"a": [13]})
    following = {10: 11, 11: 12, 12: 13, 13: 10}  # what the lookup proposes first after each token
    sizes = []
    for _ in range(10):  # the target always differs from the draft's first token
        miss = [t for t in (10, 11, 12, 13) if t != following[req.all_token_ids[-1]]][0]
        sched, _ = run_step(s, {"a": [miss]})
        sizes.append(sched.num_scheduled_tokens[0])
    # 3 drafted (k=3, then 1 after each miss), paused 1 step; 3 more, paused 2 steps; then again
    assert sizes == [4, 2, 2, 1, 2, 2, 2, 1, 1, 2]
    # a hit halves the next pause instead of forgetting it
    assert req.spec_state.pause == 2
    hit = following[req.all_token_ids[-1]]
    sched, _ = run_step(s, {"a": [hit, following[hit] + 100]})
    assert sched.num_scheduled_tokens == [2] and req.output_token_ids[-2] == hit and req.spec_state.pause == 1
