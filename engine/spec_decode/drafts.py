"""The scheduler's side of speculative decoding: which decodes get drafts this step, how long,
and what a verified step leaves behind.

On a CPU a decode step is bound by reading the weights, so computing 1 + k positions of one
request costs about as much as computing one: every accepted draft token is a step saved. The
runner computes the last known token and the k draft tokens like a short prompt chunk over the
paged cache, samples the target's token at all k + 1 positions and keeps the longest prefix
that matches the draft, plus one token of its own (verify.py).

Rules, all here so the scheduler only calls ``add_drafts`` and ``after_step``:
- Drafts use what the step leaves: they are added after the batch is chosen, from the token
  budget left over and from free KV blocks only. They never preempt, never displace a waiting
  request, and are never counted as prompt tokens.
- A request's slots for k drafts are allocated before they are proposed (a draft model writes
  its KV there); those of tokens not proposed go back at once.
- A request drafts only when its output can be checked token by token against the target's own
  sampling at each position: greedy or unseeded random sampling, no penalties, no logit_bias,
  allowed_token_ids or bad_words, no grammar (structured outputs), min_tokens already reached.
  The others decode one token a step, as without speculation.
- No drafts when the running batch has ``disable_by_batch_size`` requests or more.
- Per request, the draft length follows acceptance: all accepted, one more (up to
  num_speculative_tokens); some rejected, the accepted count plus one; several steps in a row
  with nothing accepted, no drafts for a pause that doubles each time (up to MAX_PAUSE steps)
  and halves with each step that had a draft token accepted (resetting it on any hit let
  free text, where a lookup hits now and then, draft at a loss: RESULTS.md).
- A draft never reaches past max_tokens or max_model_len: k + 1 tokens may be emitted.
- After the step the request's computed length is rolled back to its known tokens but the last
  (the rejected drafts' KV is garbage past it, overwritten later, and never registered in the
  prefix cache, which only takes computed full blocks), and blocks allocated only for rejected
  drafts go back to the free queue.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.sampling_params import SamplingType
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram import NgramProposer, Proposer
from engine.worker.logit_controls import has_logit_controls, has_penalties

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0  # between two acceptance log lines (vLLM logs its stats every 10 s)
MISSES_BEFORE_PAUSE = 3  # steps in a row with nothing accepted
MAX_PAUSE = 64  # steps


class DraftState:
    """A request's draft length and back-off."""

    __slots__ = ("k", "misses", "pause", "paused", "context", "draft_probs")

    def __init__(self, k: int) -> None:
        self.k = k
        # The proposer's own record of the request (ngram.py: its tokens as an array and their
        # length; draft_model.py: what the draft's KV holds).
        self.context = None
        # A draft model's distributions of this step's draft tokens ([k, vocab], random sampling),
        # for the runner's rejection sampling (verify.py); None: the drafts are point masses.
        self.draft_probs = None
        self.misses = 0  # steps in a row where no draft token was accepted
        self.pause = 0  # length of the last pause, doubled each time
        self.paused = 0  # steps left without lookups


class SpecStats:
    """Counters since the last ``take`` (vLLM's spec_decode_num_drafts / num_draft_tokens /
    num_accepted_tokens / num_accepted_tokens_per_pos): requests that ran drafts, draft tokens
    verified, of which accepted, and how many drafts had their token at each position accepted.
    Every LOG_INTERVAL_S a ``take`` also logs the acceptance since the last such line (vLLM's
    "SpecDecoding metrics" line)."""

    __slots__ = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos", "_logged", "_since")

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * num_speculative_tokens
        self._since = [0, 0, 0]  # drafts, draft tokens, accepted since the last log line
        self._logged = time.monotonic()

    def count(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1

    def take(self) -> dict:
        """The counters since the last call, as SchedulerStats fields; they restart from zero."""
        step = (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, self.accepted_per_pos)
        self._log(step)
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * len(self.accepted_per_pos)
        return dict(
            zip(
                (
                    "spec_decode_num_drafts",
                    "spec_decode_num_draft_tokens",
                    "spec_decode_num_accepted_tokens",
                    "spec_decode_num_accepted_tokens_per_pos",
                ),
                step,
            )
        )

    def _log(self, step: tuple) -> None:
        since = self._since
        for i in range(3):
            since[i] += step[i]
        now = time.monotonic()
        if now - self._logged < LOG_INTERVAL_S or not since[0]:
            return
        drafts, drafted, accepted = since
        logger.info(
            "SpecDecoding metrics: draft acceptance rate %.1f%%, mean acceptance length %.2f, "
            "accepted %d of %d draft tokens in %d drafts",
            100.0 * accepted / max(1, drafted),
            1 + accepted / drafts,
            accepted,
            drafted,
            drafts,
        )
        self._since, self._logged = [0, 0, 0], now


def can_speculate(req: Request) -> bool:
    """Whether ``req``'s next tokens can be verified against drafts (the rules above)."""
    p = req.sampling_params
    return (
        req.pooling_params is None
        and req.structured_output is None
        and p.structured_outputs is None
        and p.sampling_type != SamplingType.RANDOM_SEED
        and not has_penalties(p)
        and not has_logit_controls(p)
        and req.num_output_tokens >= p.min_tokens
    )


class DraftScheduler:
    def __init__(
        self,
        config: SpeculativeConfig,
        kv_cache: KVCacheManager,
        max_model_len: int,
        proposer: Optional[Proposer] = None,
    ) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        if proposer is None and config.method != "ngram":
            raise ValueError(
                f"speculative_config: method {config.method!r} needs the worker's draft model, and this worker has none"
            )
        self.proposer = proposer or NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.stats = SpecStats(config.num_speculative_tokens)

    def add_drafts(self, batch: list[Request], num_tokens: list[int], budget: int, num_running: int) -> int:
        """Give this step's decodes their drafts (``req.spec_token_ids``, ``num_tokens[i]`` grown
        by their length, KV slots allocated) within ``budget`` tokens; returns the tokens used."""
        limit = self.config.disable_by_batch_size
        if budget <= 0 or (limit is not None and num_running >= limit):
            return 0
        picked, room = [], []
        left_budget = budget
        for i, (req, n) in enumerate(zip(batch, num_tokens)):
            if n != 1 or req.num_computed_tokens + 1 != req.num_tokens or not can_speculate(req):
                continue
            state = req.spec_state
            if state is None:
                state = req.spec_state = DraftState(self.config.num_speculative_tokens)
            if state.paused:
                state.paused -= 1
                continue
            left = self.max_model_len - req.num_tokens - 1  # k + 1 tokens may be emitted
            if req.max_tokens is not None:
                left = min(left, req.max_tokens - req.num_output_tokens - 1)
            k = min(state.k, left, left_budget)
            # Slots first: a draft model writes its own KV at the drafts' positions (draft_model.py).
            if k > 0 and self.kv_cache.allocate_slots(req, 1 + k):
                picked.append(i)
                room.append(k)
                left_budget -= k
                if not left_budget:
                    break
        if not picked:
            return 0
        used = 0
        for i, k, draft in zip(picked, room, self.proposer.propose([batch[i] for i in picked], room)):
            req = batch[i]
            if len(draft) < k:  # give back the slots of the tokens not proposed
                self.kv_cache.trim(req, req.num_tokens + len(draft))
            if draft:
                req.spec_token_ids = draft
                num_tokens[i] += len(draft)
                used += len(draft)
        return used

    def after_step(self, req: Request, num_accepted: int) -> None:
        """``req`` ran its drafts and had ``num_accepted`` of them accepted, and its tokens are
        appended: roll its computed length back to what has KV, free blocks held only for
        rejected drafts, count, and adapt its draft length."""
        num_drafted = len(req.spec_token_ids)
        req.spec_token_ids = []
        req.spec_state.draft_probs = None
        req.num_computed_tokens = req.num_tokens - 1  # the last token's KV is next step's
        self.kv_cache.trim(req, req.num_tokens)
        self.stats.count(num_drafted, num_accepted)
        state = req.spec_state
        if num_accepted == num_drafted:
            state.k = min(self.config.num_speculative_tokens, state.k + 1)
        else:
            state.k = num_accepted + 1
        if num_accepted:  # a hit halves the next pause: one lucky hit in many misses keeps the back-off
            state.misses = 0
            state.pause //= 2
            return
        state.misses += 1
        if state.misses >= MISSES_BEFORE_PAUSE:
            state.misses = 0
            state.pause = min(MAX_PAUSE, max(1, 2 * state.pause))
            state.paused = state.pause
