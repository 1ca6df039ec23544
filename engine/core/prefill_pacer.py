"""How many prompt tokens one step may compute, from a time budget per step (``--max-num-prefill-tokens auto``).

Why a time and not a token count: the cap exists so a burst of prompts gets its first tokens
over several steps while the running streams keep decoding (scheduler.py). What a prompt token
costs differs tenfold between CPUs and dtypes: 128 tokens were ~0.5 s of float32 on one AVX2
core, and under 0.1 s of bfloat16 on an AMX core, where that fixed cap split a burst of 64
short prompts into 15 steps that each also carried 64 decodes, and the last first token waited
for all of them (benchmarks/RESULTS.md, Serving). The pacer keeps each step that computes
prompt tokens near ``step_target_s`` on whatever the core runs on, as measured.

Model: a step's time is a base (the decodes and per-step work) plus a cost per prompt token.
The base is tracked from steps without prompt tokens; the cost from steps with at least
``MIN_SAMPLE_TOKENS`` of them, both as moving averages. Before any sample the cap is
``initial`` (a safe value for the slowest CPU measured; "auto"'s target and initial cap are
``engine.config.scheduler.PACED_STEP_TARGET_S`` and ``PACED_INITIAL_TOKENS``).
"""

from __future__ import annotations

PACED_MIN_TOKENS = 32  # never fewer a step: below this a step is all base, and a burst crawls
MIN_SAMPLE_TOKENS = 32  # a smaller prefill is mostly the step's base: its per-token cost is noise
_SMOOTHING = 0.5  # weight of the newest sample in the moving averages
_QUANTUM = 16  # caps are multiples of this (a block)


class PrefillPacer:
    def __init__(self, step_target_s: float, floor: int, ceiling: int, initial: int) -> None:
        if not step_target_s > 0:
            raise ValueError(f"step_target_s must be > 0, got {step_target_s!r}")
        self.step_target_s = step_target_s
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling)
        self.cap = min(max(initial, self.floor), self.ceiling)
        self.base_s = 0.0  # a step's time without prompt tokens (0 until one is seen)
        self.token_s = 0.0  # one prompt token's time (0 until one is measured)

    def observe(self, prompt_tokens: int, seconds: float) -> None:
        """A step ran ``prompt_tokens`` prompt tokens (and any decodes) in ``seconds``."""
        if not seconds >= 0:
            return
        if prompt_tokens == 0:
            self.base_s = seconds if self.base_s == 0 else self.base_s + _SMOOTHING * (seconds - self.base_s)
            return
        if prompt_tokens < MIN_SAMPLE_TOKENS:
            return
        sample = max(seconds - self.base_s, seconds / 4) / prompt_tokens  # the base is a guess: never all of it
        self.token_s = sample if self.token_s == 0 else self.token_s + _SMOOTHING * (sample - self.token_s)
        room = max(self.step_target_s - self.base_s, self.step_target_s / 4)
        cap = int(room / self.token_s) // _QUANTUM * _QUANTUM
        self.cap = min(max(cap, self.floor), self.ceiling)
