"""``max_num_prefill_tokens="auto"``: the prompt tokens of a step follow a time budget, as measured."""

from __future__ import annotations

import argparse

import pytest

from engine.config import PACED_INITIAL_TOKENS, SchedulerConfig
from engine.core.kv_cache import KVCacheManager
from engine.core.prefill_pacer import PACED_MIN_TOKENS, PrefillPacer
from engine.core.scheduler import Scheduler
from tests.helpers.core_utils import make_requests, step


def run_steps(pacer: PrefillPacer, base_s: float, token_s: float, steps: int) -> list[int]:
    """Feed the pacer steps of a machine where a step costs base_s + token_s per prompt token,
    alternating prefill steps (at the current cap) with decode-only ones; the caps it chose."""
    caps = []
    for _ in range(steps):
        caps.append(pacer.cap)
        pacer.observe(pacer.cap, base_s + token_s * pacer.cap)
        pacer.observe(0, base_s)
    return caps


@pytest.mark.parametrize("token_s", [1 / 270, 1 / 1000, 1 / 5000])  # float32 AVX2 .. bf16 AMX
def test_the_cap_settles_where_a_step_takes_the_target(token_s):
    pacer = PrefillPacer(0.5, PACED_MIN_TOKENS, 2048, PACED_INITIAL_TOKENS)
    base = 0.08
    caps = run_steps(pacer, base, token_s, 12)
    assert caps[0] == PACED_INITIAL_TOKENS
    settled = base + token_s * caps[-1]
    if caps[-1] < 2048:
        assert 0.5 - 16 * token_s - 0.01 <= settled <= 0.5 + 0.01, (caps, settled)
    assert caps[-1] == caps[-2]  # steady


def test_the_cap_stays_within_its_floor_and_ceiling():
    slow = PrefillPacer(0.5, 32, 2048, 128)
    run_steps(slow, 0.45, 0.01, 6)  # 10 ms a token: 5 tokens would fit
    assert slow.cap == 32
    fast = PrefillPacer(0.5, 32, 2048, 128)
    run_steps(fast, 0.01, 1e-6, 6)
    assert fast.cap == 2048


def test_small_prefills_and_bad_timings_teach_nothing():
    pacer = PrefillPacer(0.5, 32, 2048, 128)
    pacer.observe(PACED_MIN_TOKENS - 1 if PACED_MIN_TOKENS > 1 else 0, 5.0)
    pacer.observe(100, float("nan"))
    pacer.observe(100, -1.0)
    assert pacer.cap == 128 and pacer.token_s == 0
    with pytest.raises(ValueError):
        PrefillPacer(0, 32, 2048, 128)


def test_a_paced_scheduler_grows_its_cap_on_a_fast_machine_and_keeps_fcfs_order():
    config = SchedulerConfig(
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        policy="fcfs",
        enable_chunked_prefill=True,
        max_num_prefill_tokens=PACED_INITIAL_TOKENS,
        prefill_step_target_s=0.5,
    )
    s = Scheduler(config, KVCacheManager(1000, 16, True), 8192)
    assert s.max_num_prefill_tokens == PACED_INITIAL_TOKENS
    for r in make_requests(64, 30):
        s.add_request(r)
    first, scheds = {}, []
    for i in range(40):
        if len(first) == 64:
            break
        cap = s.max_num_prefill_tokens
        sched, outs = step(s)
        prompt = sum(n for n in sched.num_scheduled_tokens if n > 1)
        assert prompt <= cap
        s.observe_step(sched, 0.05 + prompt / 4000)  # a machine computing 4000 prompt tokens/s
        scheds.append((prompt, s.max_num_prefill_tokens))
        for out in outs:
            first.setdefault(out.request_id, i)
    order = [first[str(i)] for i in range(64)]
    assert order == sorted(order)
    assert scheds[0][0] <= PACED_INITIAL_TOKENS  # the first step: the initial cap
    assert s.max_num_prefill_tokens >= 4 * PACED_INITIAL_TOKENS  # then ~0.45 s of prompt tokens a step
    assert max(order) <= 4, scheds  # 64 x 30 tokens in a few steps, not 15 of 128


def test_auto_is_accepted_where_the_cap_is_set_and_other_words_are_not(tiny_model_dir):
    from engine.config import EngineArgs
    from tests.helpers.cli_utils import serve_parser

    args = dict(model=tiny_model_dir, load_format="dummy", device="cpu")
    sc = EngineArgs(**args, max_num_prefill_tokens="auto").create_engine_config().scheduler_config
    assert (sc.max_num_prefill_tokens, sc.prefill_step_target_s) == (PACED_INITIAL_TOKENS, 0.5)
    assert EngineArgs(**args).create_engine_config().scheduler_config.prefill_step_target_s == 0
    with pytest.raises(ValueError, match="max_num_prefill_tokens"):
        EngineArgs(**args, max_num_prefill_tokens="fast").create_engine_config()
    assert serve_parser().parse_args(["--max-num-prefill-tokens", "auto"]).max_num_prefill_tokens == "auto"
    assert serve_parser().parse_args(["--max-num-prefill-tokens", "256"]).max_num_prefill_tokens == 256
    with pytest.raises(argparse.ArgumentError, match="max-num-prefill-tokens"):
        serve_parser().parse_args(["--max-num-prefill-tokens", "fast"])
