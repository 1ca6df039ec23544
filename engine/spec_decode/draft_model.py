"""Draft-model proposals (vLLM's ``method: "draft_model"``): a smaller model of the same
vocabulary, owned by the target's ModelRunner in the EngineCore's process, proposes k tokens per
request, one forward per token, batched across the step's requests; the target then verifies them
all in one forward (verify.py).

KV. The draft has its own paged cache with as many blocks as the target's, addressed through the
target's block table (``req.block_ids``): the scheduler allocates a request's slots for its k
drafts before asking for them (drafts.py), so the draft writes where the target's blocks are, and
the runner sizes both caches from the one KV budget (a block costs the target's bytes plus the
draft's). A block shared by prefix caching is written by each sharing request's draft with the
same tokens at the same positions.

What a request's draft KV holds is tracked per request (``_DraftKV`` in its draft state): the
positions holding the draft's KV of the request's own tokens (``valid``), then the draft tokens fed
after them. At the next proposal those stay valid as far as they were accepted (the rollback of
rejected positions), and the draft first computes the request's tokens after them (the target's
own token of the last step, or the whole prompt the first time). A preempted request starts over
(the scheduler drops its draft state with its blocks).

Exactness never rests on the draft: greedy rows propose the draft's argmax and keep only what the
target's argmax agrees with; random rows draw from the draft's distribution q (the request's own
temperature, top-k, top-p, min-p over the draft's logits), kept with the draft for the rejection
sampling (verify.py). A stale or wrong draft KV can only lower acceptance.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch

from engine.config import EngineConfig
from engine.core.request import Request
from engine.models.attention import to_device
from engine.sampling_params import SamplingType
from engine.worker.loader import load_model
from engine.worker.sampler import SamplingMetadata, argmax_rows, random_probs, sample_from_cdf


def draft_engine_config(config: EngineConfig) -> EngineConfig:
    """The config the draft model loads with: the target's, with the draft's ModelConfig (derived
    in the frontend, engine/config/speculative.py) and nothing of speculation or adapters."""
    assert config.draft_model_config is not None  # set by create_engine_config for method "draft_model"
    return dataclasses.replace(
        config,
        model_config=config.draft_model_config,
        speculative_config=None,
        draft_model_config=None,
        lora_config=None,
    )


class _DraftKV:
    """Which positions of a request's draft KV hold what (see the module docstring)."""

    __slots__ = ("valid", "base", "fed")

    def __init__(self) -> None:
        self.valid = 0  # leading positions holding the draft's KV of the request's own tokens
        self.base = 0  # the position of fed[0]
        self.fed: list[int] = []  # draft tokens whose KV was written from position base on

    def rolled_back(self, tokens: list[int]) -> int:
        """``valid`` after the last step: the fed draft tokens count as far as they were accepted."""
        if self.fed:
            n = 0
            while n < len(self.fed) and self.base + n < len(tokens) and tokens[self.base + n] == self.fed[n]:
                n += 1
            self.valid, self.fed = self.base + n, []
        return self.valid


class _Tokens:
    """A request's known tokens followed by its draft so far, sliced as the attention builder
    slices ``all_token_ids`` (no copy of the context per draft step)."""

    __slots__ = ("known", "draft")

    def __init__(self, known: list[int], draft: list[int]) -> None:
        self.known, self.draft = known, draft

    def __getitem__(self, s: slice) -> list[int]:
        n = len(self.known)
        if s.stop <= n:
            return self.known[s]
        return self.known[s.start :] + self.draft[max(0, s.start - n) : s.stop - n]


class _Row:
    """What the attention builder reads of a request, for one draft forward."""

    __slots__ = ("num_computed_tokens", "all_token_ids", "block_ids", "spec_token_ids")

    def __init__(self, req: Request, start: int, draft: list[int]) -> None:
        self.num_computed_tokens = start
        self.all_token_ids = _Tokens(req.all_token_ids, draft)
        self.block_ids = req.block_ids
        self.spec_token_ids: list[int] = []


class DraftModelProposer:
    """The Proposer (ngram.py) of ``method: "draft_model"``; built by the ModelRunner, whose
    ``sampling_metadata`` it reuses for the draft's rows, and handed to the scheduler."""

    def __init__(self, config: EngineConfig, sampling_metadata: Callable[[list[Request]], SamplingMetadata]) -> None:
        self.config = draft_engine_config(config)
        self.model = load_model(self.config)
        self.device = torch.device(config.device)
        self.block_size = config.cache_config.block_size
        self.attn_builder = self.model.attention_builder(self.block_size)
        self.sampling_metadata = sampling_metadata
        self.kv_caches: Optional[torch.Tensor] = None  # allocate() once the target's cache is sized

    def kv_cache_block_bytes(self) -> int:
        shape = self.model.kv_cache_shape(1, self.block_size)
        return torch.Size(shape).numel() * self.model.dtype.itemsize

    def allocate(self, num_blocks: int, zeros: Callable[..., torch.Tensor]) -> None:
        self.kv_caches = zeros(self.model.kv_cache_shape(num_blocks, self.block_size), self.model.dtype, self.device)

    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], max_tokens: Sequence[int]) -> list[list[int]]:
        """Up to ``max_tokens[i]`` draft tokens for ``requests[i]`` (whose slots for them are
        allocated); each request's draft state gets the draft's distributions (``draft_probs``,
        one row per draft token, or None for greedy requests)."""
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        active = [i for i, k in enumerate(max_tokens) if k > 0]
        rows, counts = [], []
        for i in active:
            req = requests[i]
            kv = _draft_kv(req)
            start = min(kv.rolled_back(req.all_token_ids), req.num_tokens - 1)  # the last token: always computed
            rows.append(_Row(req, start, drafts[i]))
            counts.append(req.num_tokens - start)
        while active:
            tokens, q = self._step([requests[i] for i in active], rows, counts)
            still, still_rows = [], []
            for j, (i, row, n) in enumerate(zip(active, rows, counts)):
                drafts[i].append(tokens[j])
                if q is not None and requests[i].sampling_params.sampling_type != SamplingType.GREEDY:
                    probs[i].append(q[j])
                if len(drafts[i]) < max_tokens[i]:
                    row.num_computed_tokens += n
                    still.append(i)
                    still_rows.append(row)
            active, rows, counts = still, still_rows, [1] * len(still)
        for req, draft, q in zip(requests, drafts, probs):
            if draft:
                kv = req.spec_state.context
                kv.valid, kv.base, kv.fed = req.num_tokens, req.num_tokens, draft[:-1]
                req.spec_state.draft_probs = torch.stack(q) if q else None
        return drafts

    def _step(
        self, reqs: list[Request], rows: list[_Row], counts: list[int]
    ) -> tuple[list[int], Optional[torch.Tensor]]:
        """One draft forward over ``rows``; each row's next token, and the draft's distributions
        (None when every row is greedy)."""
        step = self.attn_builder.build(rows, counts)
        hidden = self.model(
            to_device(step.ids, torch.long, self.device),
            to_device(step.positions, torch.long, self.device),
            self.kv_caches,
            step.md,
        )
        last = [step.first_row[j] + n - 1 for j, n in enumerate(counts)]
        logits = self.model.compute_logits(hidden.index_select(0, to_device(last, torch.long, self.device)))
        md = self.sampling_metadata(reqs)
        if md.temperature is None:
            return argmax_rows(logits).tolist(), None
        greedy = argmax_rows(logits) if md.greedy_rows is not None else None
        q = random_probs(logits, md)
        tokens = sample_from_cdf(q, {})
        if greedy is not None:
            tokens = torch.where(md.greedy_rows, greedy, tokens)
        return tokens.tolist(), q


def _draft_kv(req: Request) -> _DraftKV:
    state = req.spec_state
    if state.context is None:
        state.context = _DraftKV()
    return state.context
