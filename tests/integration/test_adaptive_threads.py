"""The engine's own thread count adapts per step (engine/worker/thread_tuner.py) in a real
EngineCore: the config carries the decision from the frontend, the runner tunes, and greedy
outputs are those of a fixed count (the thread count changes how fast, never what)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine import thread_policy
from tests.helpers.engine_utils import TINY

PROMPTS = ["The quick brown fox", "Once upon a time there"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def _run(model: str, **kwargs) -> tuple[list[list[int]], dict]:
    llm = LLM(model=model, **{**TINY, **kwargs})
    try:
        tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        for _ in range(4):  # enough decode steps for a probe of the other count
            llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        (choices,) = llm.collective_rpc("thread_choices")
        return tokens, choices
    finally:
        llm.shutdown()


def test_the_default_count_of_a_large_model_adapts_and_changes_no_token(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("RINGLLM_NUM_THREADS", raising=False)
    fixed, none = _run(tiny_model_dir, num_threads=1)
    assert none == {}
    # The tiny model stands in for one whose weights make the policy give every core.
    monkeypatch.setattr(thread_policy, "default_num_threads", lambda model=None, sync_frontend=False: 2)
    adapted, choices = _run(tiny_model_dir, num_threads=None)
    assert adapted == fixed
    assert choices and set(choices.values()) <= {1, 2}
    assert "3" in choices  # decode steps of two sequences ("up to 3 tokens")


@pytest.mark.parametrize("explicit", ["arg", "env"])
def test_a_count_the_user_gave_is_kept(tiny_model_dir, monkeypatch, explicit):
    monkeypatch.setattr(thread_policy, "default_num_threads", lambda model=None, sync_frontend=False: 2)
    if explicit == "env":
        monkeypatch.setenv("RINGLLM_NUM_THREADS", "2")
        _, choices = _run(tiny_model_dir, num_threads=None)
    else:
        _, choices = _run(tiny_model_dir, num_threads=2)
    assert choices == {}
